//! CUDA called from a signal handler that interrupted the program's thread inside gpushim
//! (issue 26, item 10): every wait of the shim is bounded, and a lock the waiting thread holds
//! itself is refused at once, so the program never hangs; every call made from the handler
//! succeeds or is refused with a documented error (an allocation `CUDA_ERROR_OUT_OF_MEMORY`, a
//! free `CUDA_ERROR_NOT_PERMITTED`, the memory then still the program's), and the accounting
//! comes back to exactly zero.
//!
//! The program is `tests/c/sighandler.c` on the simulated driver: a worker allocates and frees
//! 4 KiB in a loop in `grow` mode (every allocation and free takes its device's reserve lock),
//! the main thread signals it until 300 handlers have called CUDA where the worker was
//! interrupted inside gpushim (100 of them) or the program itself. Before the bound, the first handler that
//! interrupted the worker inside the reserve's lock waited for it for ever. The same program
//! runs without the shim.

mod common;

use std::time::{Duration, Instant};

use common::MemoryMode::{Grow, NoShim};
use common::*;

/// Handlers that call CUDA before the program stops signalling (under the shim, a third of
/// them with the worker inside it; the program also stops after 1,000,000 signals or 20 s).
const HANDLED: i64 = 300;
/// The whole run, however loaded the machine (the program itself takes a few seconds).
const BOUND: Duration = Duration::from_secs(60);

fn run(mode: MemoryMode) -> (RunOutput, Duration) {
    let start = Instant::now();
    let out = Run::program(Program::SigHandler)
        .env("GPUSIM_DEVICES", "1")
        .env("GPUSIM_MEMORY", "16GiB")
        .env("GPUSHIM_MEMORY_LIMIT", "1GiB")
        .arg(HANDLED.to_string())
        .mode(mode)
        .run();
    let took = start.elapsed();
    out.assert_completed();
    assert_eq!((out.num("init.rc"), out.num("ctx.rc")), (0, 0), "{}", out.dump());
    (out, took)
}

#[test]
fn cuda_from_a_signal_handler_that_interrupted_the_shim_never_hangs() {
    for mode in [Grow, NoShim] {
        let (out, took) = run(mode);
        let shim = mode != NoShim;
        assert!(took < BOUND, "{mode:?}: took {took:?}\n{}", out.dump());
        // every call from the handler succeeded or was refused as documented; the worker's own
        // calls all succeeded
        for key in ["worker.errors", "alloc.other", "free.other", "info.other", "leftover.rc"] {
            assert_eq!(out.num(key), 0, "{mode:?}: {key}\n{}", out.dump());
        }
        assert!(out.num("worker.pairs") > 0, "{mode:?}\n{}", out.dump());
        // each allocation made from the handler was freed once (by the handler, or at the end)
        assert_eq!(out.num("alloc.ok"), out.num("free.ok") + out.num("leftover"), "{mode:?}\n{}", out.dump());
        let handled = out.num("handled.shim") + out.num("handled.program");
        assert_eq!(out.num("info.ok"), handled, "{mode:?}: cuMemGetInfo from the handler\n{}", out.dump());
        // (a sample, not the property: under qemu-user a signal is delivered where the
        // emulator next looks, and in one CI run of 300 none was there while the worker ran
        // the program's own code)
        if !emulated() {
            assert!(out.num("handled.program") > 0, "{mode:?}: no signal landed in the program\n{}", out.dump());
        }
        if shim {
            // the case itself: signals landed inside gpushim, some of them while the worker
            // held the reserve's lock (refused at once)
            assert!(out.num("handled.shim") > 0, "no signal landed in gpushim\n{}", out.dump());
            assert!(out.num("alloc.oom") + out.num("free.refused") > 0, "no call met a lock the worker held\n{}", out.dump());
            let said = out.gpushim_lines_with("refused: gpushim's reserve is held by this very thread");
            assert!(!said.is_empty(), "no line says why\n{}", out.dump());
            // everything back: nothing in use, the whole limit free, the driver holding the
            // reserve's one chunk (2 MiB for 4 KiB requests)
            assert_eq!((out.num("usage.rc"), out.u64("usage.in_use")), (0, 0), "{}", out.dump());
            assert_eq!((out.num("info.rc"), out.u64("info.free"), out.u64("info.total")), (0, GIB, GIB), "{}", out.dump());
            assert_eq!(out.report().device(0).used, 2 * MIB, "{}", out.dump());
        } else {
            assert_eq!((out.num("handled.shim"), out.num("alloc.oom"), out.num("free.refused")), (0, 0, 0), "{}", out.dump());
            assert_eq!(out.num("usage.rc"), -1, "{}", out.dump());
            assert_eq!((out.num("info.rc"), out.u64("info.free"), out.u64("info.total")), (0, 16 * GIB, 16 * GIB), "{}", out.dump());
            assert_eq!(out.report().device(0).used, 0, "{}", out.dump());
        }
        eprintln!(
            "{mode:?}: {took:?}; {} signals, {} elsewhere; handled {} in gpushim, {} in the program; allocations {} ok, {} refused; frees {} ok, {} refused; longest handler {} us",
            out.num("signals"),
            out.num("landed.other"),
            out.num("handled.shim"),
            out.num("handled.program"),
            out.num("alloc.ok"),
            out.num("alloc.oom"),
            out.num("free.ok"),
            out.num("free.refused"),
            out.num("handler.max_us")
        );
    }
}
