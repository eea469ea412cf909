//! Which mode enforces this process' compute limit (`GPUSHIM_COMPUTE_MODE`), worked out once.
//!
//! The resolution itself (`auto`: is an MPS control daemon reachable?) is the shared crate's
//! (`gpushim_common::compute_mode`), so that `gpushim check` says the same; here it is done
//! with the process' own environment, once, and `auto`'s choice is logged at `info`.

use std::sync::atomic::{AtomicU8, Ordering::Relaxed};

use gpushim_common::compute_mode::{self, ENV_PIPE_DIRECTORY};
use gpushim_common::config::Settings;

use crate::platform::log::{log, Level};

pub use gpushim_common::compute_mode::Mode;

/// 0: not worked out yet; else 1 + the mode's index.
static RESOLVED: AtomicU8 = AtomicU8::new(0);

const MODES: [Mode; 4] = [Mode::None, Mode::Duty, Mode::Mps, Mode::Green];

/// The mode of this process (`None`: no compute limit is set). Worked out at the first call
/// (one `connect` to the MPS control socket for `auto`) and kept: the settings of a process
/// never change.
#[inline]
pub fn resolve(settings: &Settings) -> Mode {
    let cached = RESOLVED.load(Relaxed);
    if cached != 0 {
        return MODES[(cached - 1) as usize];
    }
    if settings.disable || !settings.compute_limits_anything() {
        // (the common case, on the first lookup's small stack: nothing more to work out)
        RESOLVED.store(1, Relaxed);
        return Mode::None;
    }
    resolve_first(settings)
}

#[cold]
#[inline(never)]
fn resolve_first(settings: &Settings) -> Mode {
    let pipe_dir = gpushim_common::unforked::var_os(ENV_PIPE_DIRECTORY);
    let r = compute_mode::resolve(settings, pipe_dir.as_deref(), gpushim_common::secure::secure_execution());
    if let Some(why) = &r.why {
        log!(Level::Info, "GPUSHIM_COMPUTE_MODE=auto: {} ({why})", r.mode.as_str());
    } else if r.mode == Mode::Mps {
        // chosen explicitly: without a daemon the variables do nothing; say so
        let dir = compute_mode::pipe_directory(pipe_dir.as_deref(), gpushim_common::secure::secure_execution());
        // SAFETY: geteuid cannot fail.
        if let Err(why) = compute_mode::mps_reachable(&dir, unsafe { libc::geteuid() }) {
            log!(Level::Warn, "GPUSHIM_COMPUTE_MODE=mps: no usable MPS control daemon ({why}): the MPS variables are set, but only an MPS server enforces them");
        }
    }
    let index = MODES.iter().position(|&m| m == r.mode).unwrap_or(1);
    RESOLVED.store(index as u8 + 1, Relaxed);
    r.mode
}
