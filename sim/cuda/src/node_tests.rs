//! The node state's tests (`node.rs`).

use super::*;
use std::os::unix::fs::PermissionsExt;

/// A fresh path in a fresh private directory.
pub(crate) fn temp_path(name: &str) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    let dir = std::env::temp_dir().join(format!(
        "gpusim-node-{}-{}-{name}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir.join("node").to_str().unwrap().to_string()
}

/// Removes the directory of a `temp_path` at the end of a test.
struct Cleanup(String);
impl Drop for Cleanup {
    fn drop(&mut self) {
        if let Some(dir) = std::path::Path::new(&self.0).parent() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// Every test here holds `DRIVER_TESTS`: a fork (in another test) copies every descriptor
/// of the process, and until the child has closed its copies (at once, in `forked_child`)
/// an attachment dropped meanwhile still looks alive.
fn serial() -> std::sync::MutexGuard<'static, ()> {
    crate::DRIVER_TESTS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
}

fn used_peak(n: &Node, d: usize) -> (u64, u64) {
    let s = n.snapshot()[d];
    (s.0, s.1)
}

const OK: fn() -> Res = || Ok(());

#[test]
fn file_layout() {
    let _s = serial();
    let path = temp_path("layout");
    let _c_path = Cleanup(path.clone());
    let a = Node::attach(&path, &[1000, 2000]).unwrap();
    let meta = std::fs::metadata(&path).unwrap();
    assert_eq!(meta.len(), FILE_SIZE as u64);
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    let bytes = std::fs::read(&path).unwrap();
    assert_eq!(&bytes[0..8], b"gpusimND");
    assert_eq!(
        u32::from_le_bytes(bytes[8..12].try_into().unwrap()),
        VERSION
    );
    assert_eq!(u32::from_le_bytes(bytes[12..16].try_into().unwrap()), 2);
    assert_eq!(u32::from_le_bytes(bytes[16..20].try_into().unwrap()), 256);
    let u64_at = |o: usize| u64::from_le_bytes(bytes[o..o + 8].try_into().unwrap());
    assert_eq!(u64_at(64), 1000);
    assert_eq!(u64_at(96), 2000);
    let s = SLOTS_OFF + a.slot() * SLOT_SIZE;
    assert_eq!(u64_at(s), std::process::id() as u64);
    // Only the final file is left: the temporary one was linked and removed.
    let dir = std::path::Path::new(&path).parent().unwrap();
    assert_eq!(std::fs::read_dir(dir).unwrap().count(), 1);
    // Not a node file: refused.
    let bad = temp_path("bad");
    let _c_bad = Cleanup(bad.clone());
    std::fs::write(&bad, vec![0u8; FILE_SIZE]).unwrap();
    assert!(Node::attach(&bad, &[1000]).is_err());
    std::fs::write(&bad, b"short").unwrap();
    assert!(Node::attach(&bad, &[1000]).is_err());
}

#[test]
fn two_attachments_share_usage_and_capacity() {
    let _s = serial();
    let path = temp_path("share");
    let _c_path = Cleanup(path.clone());
    let a = Node::attach(&path, &[1000, 2000]).unwrap();
    let b = Node::attach(&path, &[1000, 2000]).unwrap();
    assert_ne!(a.slot(), b.slot());
    a.reserve(0, 300, OK).unwrap();
    b.reserve(0, 500, OK).unwrap();
    assert_eq!(used_peak(&a, 0), (800, 800));
    assert_eq!(used_peak(&b, 0), (800, 800));
    assert_eq!(b.reserve(0, 201, OK), Err(CUDA_ERROR_OUT_OF_MEMORY));
    // A failing local check cancels the count.
    assert_eq!(
        b.reserve(0, 1, || Err(CUDA_ERROR_OUT_OF_MEMORY)),
        Err(CUDA_ERROR_OUT_OF_MEMORY)
    );
    assert_eq!(used_peak(&a, 0), (800, 800));
    b.reserve(0, 200, OK).unwrap();
    assert_eq!(used_peak(&a, 0), (1000, 1000));
    assert_eq!(a.reserve(1, 2000, OK), Ok(()));
    assert_eq!(b.reserve(1, 1, OK), Err(CUDA_ERROR_OUT_OF_MEMORY));
    a.release(1, 2000);
    a.release(0, 300);
    assert_eq!(used_peak(&b, 0), (700, 1000));
    assert_eq!(used_peak(&b, 1), (0, 2000));
    assert_eq!((a.mine(0), b.mine(0)), (0, 700));
    // Releasing more than counted gives back only what this attachment counted.
    a.release(0, 500);
    assert_eq!(used_peak(&b, 0), (700, 1000));
    // A device the node does not have.
    assert_eq!(a.reserve(2, 1, OK), Err(CUDA_ERROR_INVALID_DEVICE));
    // Other devices' totals while in use: refused.
    assert!(Node::attach(&path, &[1000]).is_err());
    assert!(Node::attach(&path, &[1000, 2001]).is_err());
    // b "dies" holding 700: a gets them back at its next look.
    drop(b);
    assert_eq!(used_peak(&a, 0), (0, 1000));
    // A died allocation-free slot is reused; the peak stays.
    let c = Node::attach(&path, &[1000, 2000]).unwrap();
    c.reserve(0, 1000, OK).unwrap();
    assert_eq!(a.reserve(0, 1, OK), Err(CUDA_ERROR_OUT_OF_MEMORY));
    drop(c);
    // The allocation that would not fit reclaims the dead one's memory.
    assert_eq!(a.reserve(0, 1000, OK), Ok(()));
    drop(a);
    // Nobody alive: another configuration re-initialises the file.
    let d = Node::attach(&path, &[5000]).unwrap();
    assert_eq!(d.snapshot(), vec![(0, 0, 5000)]);
}

#[test]
fn a_holder_killed_midway_is_repaired() {
    let _s = serial();
    let path = temp_path("repair");
    let _c_path = Cleanup(path.clone());
    let a = Node::attach(&path, &[1000]).unwrap();
    let b = Node::attach(&path, &[1000]).unwrap();
    b.reserve(0, 10, OK).unwrap();
    a.reserve(0, 100, OK).unwrap();
    // a dies inside the critical section: its slot says 150, `used` was not updated yet.
    let g = a.lock();
    a.slot_at(a.slot()).usage[0].fetch_add(50, Ordering::AcqRel);
    std::mem::forget(g);
    drop(a);
    // b's next look recomputes `used` (160) and reclaims a's 150.
    assert_eq!(used_peak(&b, 0), (10, 160));
}

#[test]
fn many_attach_at_once() {
    let _s = serial();
    let path = temp_path("race");
    let _c_path = Cleanup(path.clone());
    let n = 32;
    let barrier = std::sync::Barrier::new(n);
    let nodes: Vec<Node> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..n)
            .map(|_| {
                s.spawn(|| {
                    barrier.wait();
                    let node = Node::attach(&path, &[1 << 20, 1 << 20]).unwrap();
                    for _ in 0..100 {
                        node.reserve(1, 3, OK).unwrap();
                    }
                    node.release(1, 10);
                    node
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut slots: Vec<usize> = nodes.iter().map(|x| x.slot()).collect();
    slots.sort();
    slots.dedup();
    assert_eq!(slots.len(), n);
    assert_eq!(nodes[0].snapshot()[1].0, n as u64 * 290);
    let dir = std::path::Path::new(&path).parent().unwrap();
    assert_eq!(
        std::fs::read_dir(dir).unwrap().count(),
        1,
        "no temporary file left"
    );
    let last = nodes.into_iter().take(1).next().unwrap();
    // All the others were dropped ("died") by `into_iter`: only last's bytes remain.
    assert_eq!(last.snapshot()[1].0, 290);
}

/// A forked child running `f` (its result goes back through a pipe); with `hold` it then
/// waits to be killed, else it `_exit`s at once (no atexit handlers: its memory is "freed by
/// the driver", i.e. left to be reclaimed). Killed on drop if still there.
struct Child {
    pid: libc::pid_t,
    ok: bool,
}

impl Child {
    fn spawn(hold: bool, f: impl FnOnce() -> bool) -> Child {
        let mut fds = [0 as c_int; 2];
        unsafe {
            assert_eq!(libc::pipe(fds.as_mut_ptr()), 0);
            let pid = libc::fork();
            assert!(pid >= 0, "fork");
            if pid == 0 {
                libc::close(fds[0]);
                let ok =
                    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or(false);
                let b = if ok { b'y' } else { b'n' };
                libc::write(fds[1], (&b as *const u8).cast(), 1);
                if hold {
                    loop {
                        libc::pause();
                    }
                }
                libc::_exit(0);
            }
            libc::close(fds[1]);
            let mut b = 0u8;
            let n = libc::read(fds[0], (&mut b as *mut u8).cast(), 1);
            libc::close(fds[0]);
            Child {
                pid,
                ok: n == 1 && b == b'y',
            }
        }
    }

    /// Waits for it to end (after `SIGKILL` with `kill`); true if it was killed by it.
    fn end(mut self, kill: bool) -> bool {
        let pid = std::mem::replace(&mut self.pid, 0);
        let mut status = 0;
        unsafe {
            if kill {
                libc::kill(pid, libc::SIGKILL);
            }
            assert_eq!(libc::waitpid(pid, &mut status, 0), pid);
        }
        libc::WIFSIGNALED(status) && libc::WTERMSIG(status) == libc::SIGKILL
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        if self.pid > 0 {
            unsafe {
                libc::kill(self.pid, libc::SIGKILL);
                libc::waitpid(self.pid, std::ptr::null_mut(), 0);
            }
        }
    }
}

/// The report's object of physical device `p`.
fn report_device(p: usize) -> String {
    let json = crate::stats::report_json();
    let start = json
        .find(&format!("{{\"physical\":{p},"))
        .expect("device in the report");
    let end = start + json[start..].find('}').unwrap();
    json[start..=end].to_string()
}

/// Uninstalls the test's attachment, even when the test fails.
struct Uninstall;
impl Drop for Uninstall {
    fn drop(&mut self) {
        install_for_test(None);
    }
}

#[test]
fn processes_share_the_node_and_dead_ones_are_reclaimed() {
    use crate::context::*;
    use crate::memory::*;
    let _s = serial();
    let path = temp_path("procs");
    let _c_path = Cleanup(path.clone());
    install_for_test(Some(Node::attach(&path, &totals()).unwrap()));
    let _u = Uninstall;
    const MIB: usize = 1 << 20;
    unsafe {
        assert_eq!(crate::devices::cuInit(0), CUDA_SUCCESS);
        let mut ctx: CUcontext = std::ptr::null_mut();
        assert_eq!(cuCtxCreate_v2(&mut ctx, 0, 0), CUDA_SUCCESS);
        let phys = current().unwrap().physical;
        let total = crate::devices::physical()[phys].total as usize;
        let local_before = crate::stats::used(phys);
        let info = || {
            let (mut f, mut t) = (0usize, 0usize);
            assert_eq!(cuMemGetInfo_v2(&mut f, &mut t), CUDA_SUCCESS);
            assert_eq!(t, total);
            f
        };
        let node = || {
            let s = active().unwrap().snapshot()[phys];
            (s.0 as usize, s.1 as usize)
        };
        assert_eq!(info(), total);

        let mut mine: CUdeviceptr = 0;
        assert_eq!(cuMemAlloc_v2(&mut mine, MIB), CUDA_SUCCESS);
        assert_eq!(info(), total - MIB);

        // A child takes half the device and stays alive.
        let x = total / 2;
        let parent_slot = active().unwrap().slot();
        let c1 = Child::spawn(true, || {
            let mut p: CUdeviceptr = 0;
            cuMemAlloc_v2(&mut p, x) == CUDA_SUCCESS
                // the child attached anew: its own slot, only its own bytes
                && active().unwrap().slot() != parent_slot
                && active().unwrap().mine(crate::context::current().unwrap().physical)
                    == x as u64
        });
        assert!(c1.ok, "child's cuMemAlloc");
        assert_eq!(info(), total - MIB - x, "the child's memory is the node's");
        assert_eq!(
            crate::stats::used(phys),
            local_before + MIB as u64,
            "not ours"
        );
        assert_eq!(
            report_device(phys),
            format!(
                "{{\"physical\":{phys},\"name\":\"gpusim device {phys}\",\"total\":{total},\"used\":{},\"peak\":{},\"allocs\":{},\"frees\":{},\"node_used\":{},\"node_peak\":{}}}",
                crate::stats::all()[phys].used.load(Ordering::Acquire),
                crate::stats::all()[phys].peak.load(Ordering::Acquire),
                crate::stats::all()[phys].allocs.load(Ordering::Acquire),
                crate::stats::all()[phys].frees.load(Ordering::Acquire),
                MIB + x,
                MIB + x
            )
        );

        // Capacity is the node's: one byte too many fails, exactly as a full device.
        let room = total - MIB - x;
        let allocs = crate::stats::all()[phys].allocs.load(Ordering::Acquire);
        let mut p: CUdeviceptr = 0;
        assert_eq!(cuMemAlloc_v2(&mut p, room + 1), CUDA_ERROR_OUT_OF_MEMORY);
        assert_eq!(crate::stats::used(phys), local_before + MIB as u64);
        assert_eq!(
            crate::stats::all()[phys].allocs.load(Ordering::Acquire),
            allocs
        );
        assert_eq!(node(), (MIB + x, MIB + x));
        assert_eq!(cuMemAlloc_v2(&mut p, room), CUDA_SUCCESS);
        assert_eq!(node(), (total, total));
        assert_eq!(info(), 0);
        // ... and a child sees it full too.
        let c = Child::spawn(false, || {
            let mut q: CUdeviceptr = 0;
            cuMemAlloc_v2(&mut q, 1) == CUDA_ERROR_OUT_OF_MEMORY
        });
        assert!(c.ok, "the child's allocation must fail: the node is full");
        assert!(!c.end(false));
        assert_eq!(cuMemFree_v2(p), CUDA_SUCCESS);
        assert_eq!(node(), (MIB + x, total));

        // A child that frees, then exits without freeing the rest: the rest is reclaimed.
        let c = Child::spawn(false, || {
            let (mut a, mut b): (CUdeviceptr, CUdeviceptr) = (0, 0);
            cuMemAlloc_v2(&mut a, 4096) == CUDA_SUCCESS
                && cuMemFree_v2(a) == CUDA_SUCCESS
                && cuMemAlloc_v2(&mut b, 8192) == CUDA_SUCCESS
                && active().unwrap().snapshot()[crate::context::current().unwrap().physical].0
                    == (MIB + x + 8192) as u64
        });
        assert!(c.ok);
        assert!(!c.end(false));
        assert_eq!(info(), total - MIB - x);

        // SIGKILL the first child: the allocation that would not fit reclaims its memory.
        assert!(c1.end(true));
        assert_eq!(cuMemAlloc_v2(&mut p, total - MIB), CUDA_SUCCESS);
        assert_eq!(node(), (total, total));
        assert_eq!(cuMemFree_v2(p), CUDA_SUCCESS);

        // SIGKILL another: cuMemGetInfo reclaims its memory.
        let c = Child::spawn(true, || {
            let mut q: CUdeviceptr = 0;
            cuMemAllocManaged(&mut q, 3 * MIB, 1) == CUDA_SUCCESS
        });
        assert!(c.ok);
        assert_eq!(node(), (4 * MIB, total));
        assert!(c.end(true));
        assert_eq!(info(), total - MIB);
        assert!(report_device(phys)
            .ends_with(&format!(",\"node_used\":{MIB},\"node_peak\":{total}}}")));

        assert_eq!(cuMemFree_v2(mine), CUDA_SUCCESS);
        assert_eq!(info(), total);
        assert_eq!(cuCtxDestroy_v2(ctx), CUDA_SUCCESS);
    }
    drop(_u);
    // Off: no node figures, cuMemGetInfo is the process' own.
    assert!(!crate::stats::report_json().contains("node_"));
}

#[test]
fn processes_create_and_attach_at_once() {
    let _s = serial();
    let path = temp_path("forkrace");
    let _c = Cleanup(path.clone());
    let n = 24;
    let (mut go, mut res) = ([0 as c_int; 2], [0 as c_int; 2]);
    let mut pids = Vec::new();
    unsafe {
        assert_eq!(libc::pipe(go.as_mut_ptr()), 0);
        assert_eq!(libc::pipe(res.as_mut_ptr()), 0);
        for _ in 0..n {
            let pid = libc::fork();
            assert!(pid >= 0);
            if pid == 0 {
                let mut b = 0u8;
                libc::read(go[0], (&mut b as *mut u8).cast(), 1);
                let ok = std::panic::catch_unwind(|| {
                    let node = Node::attach(&path, &[1 << 30, 1 << 30]).unwrap();
                    node.reserve(1, 1000, OK).unwrap();
                    std::mem::forget(node); // held until the process dies
                })
                .is_ok();
                let b = if ok { b'y' } else { b'n' };
                libc::write(res[1], (&b as *const u8).cast(), 1);
                loop {
                    libc::pause();
                }
            }
            pids.push(Child { pid, ok: true });
        }
        libc::close(res[1]);
        let start = vec![b'g'; n];
        assert_eq!(libc::write(go[1], start.as_ptr().cast(), n), n as isize);
        let mut got = vec![0u8; n];
        let mut have = 0;
        while have < n {
            let r = libc::read(res[0], got[have..].as_mut_ptr().cast(), n - have);
            assert!(r > 0, "a child died");
            have += r as usize;
        }
        assert!(got.iter().all(|&b| b == b'y'), "{got:?}");
        libc::close(res[0]);
        libc::close(go[0]);
        libc::close(go[1]);
    }
    let me = Node::attach(&path, &[1 << 30, 1 << 30]).unwrap();
    assert_eq!(
        me.snapshot()[1],
        (n as u64 * 1000, n as u64 * 1000, 1 << 30)
    );
    let dir = std::path::Path::new(&path).parent().unwrap();
    assert_eq!(
        std::fs::read_dir(dir).unwrap().count(),
        1,
        "no temporary file left"
    );
    for c in pids.drain(..n / 2) {
        assert!(c.end(true));
    }
    assert_eq!(me.snapshot()[1].0, (n - n / 2) as u64 * 1000);
    drop(pids);
    assert_eq!(me.snapshot()[1], (0, n as u64 * 1000, 1 << 30));
}

/// The state file is not opened through a link, nor used when others can write it.
#[test]
fn a_linked_or_shared_state_file_is_refused() {
    use std::os::unix::fs::PermissionsExt;
    let path = temp_path("refused");
    let _c = Cleanup(path.clone());
    let real = format!("{path}.real");
    drop(Node::attach(&real, &totals()).unwrap());
    std::os::unix::fs::symlink(&real, &path).unwrap();
    assert!(open_or_create(&path, &totals()).is_err(), "opened through a link");
    std::fs::set_permissions(&real, std::fs::Permissions::from_mode(0o666)).unwrap();
    let e = open_or_create(&real, &totals()).unwrap_err();
    assert!(e.contains("writable by others"), "{e}");
    std::fs::set_permissions(&real, std::fs::Permissions::from_mode(0o600)).unwrap();
    let fd = open_or_create(&real, &totals()).unwrap();
    // SAFETY: our descriptor.
    unsafe { libc::close(fd) };
}
