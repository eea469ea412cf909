//! This process' place in HAMi-core's shared region (`CUDA_DEVICE_MEMORY_SHARED_CACHE`): the
//! region's shared budget and the mirror of this process' usage in its slot.
//!
//! # When
//!
//! Only for a process configured through HAMi's variables (`settings.hami_region`: a
//! `CUDA_DEVICE_MEMORY_LIMIT*`, `CUDA_DEVICE_SM_LIMIT*` or `CUDA_DEVICE_MEMORY_SHARED_CACHE` is
//! set; the file is then that variable's, else HAMi-core's `/tmp/cudevshr.cache`). A process
//! configured only with `GPUSHIM_` names never touches a region file: a stray HAMi file in
//! `/tmp` must not change what such a process may do.
//!
//! # Enforcement
//!
//! Processes using one region file draw on one budget per device: they join one shared quota
//! (`quota`), named `hami-<device>-<inode>` after the file's identity, exactly as members of a
//! `GPUSHIM_SHARED_QUOTA` do (race-free, a killed member's memory handed on; see `quota`).
//! With `GPUSHIM_SHARED_QUOTA` set too, that quota is the budget and the region only mirrors.
//! Each change of this process' reservation is written to its region slot
//! ([`quota::ON_USAGE`]), so HAMi's vGPU monitor and `shrreg-tool` see it; the region's own
//! numbers are never what refuses an allocation. `libvgpu.so` processes on the same file count
//! this process' usage; this process does not count theirs.
//!
//! # Limits
//!
//! A new file is initialised with HAMi's limits from the environment (sizes in bytes; a fraction
//! is stored as 0, "no limit", since HAMi-core's field is bytes). An existing file's non-zero
//! limit for a device lower than `CUDA_DEVICE_MEMORY_LIMIT(_<i>)` (or set where it sets none)
//! wins (as HAMi-core's stored limits do), with one `warn` line; a stored limit never raises
//! the environment's. Only files no other user can write are used at all (HAMi-core makes its
//! files 0666: one of ours is made the owner's alone, another's is refused), so nobody else can
//! change the limits or truncate the file under the mapping. A `GPUSHIM_` limit or the config
//! file still win over the file. HAMi's device index is taken to be the program's ordinal.
//!
//! # What the monitor writes back
//!
//! `utilization_switch` and `priority` are kept as HAMi-core initialises them and shown by
//! `gpushim hami show`; the shim does not act on them (its compute limit is its own pacer's).

use std::sync::atomic::{AtomicU64, AtomicU8, Ordering::Relaxed};

use gpushim_common::config::{self, Settings, Source};
use gpushim_common::hami::{self, Init, Mapped};
use gpushim_common::once::ForkOnce;
use gpushim_common::quota::{self, Quota};
use gpushim_common::units::Limit;

use crate::driver::ffi::CUdevice;
use crate::platform::log::{log, Level};

/// The region this process joined.
static REGION: ForkOnce<Mapped> = ForkOnce::new();
/// The region device index (+1; 0: none) of each quota device index.
static DEVICE_OF: [AtomicU8; quota::DEVICES] = [const { AtomicU8::new(0) }; quota::DEVICES];
/// The limits stored in an existing file that win over the environment's (0: none).
static STORED: [AtomicU64; hami::DEVICES] = [const { AtomicU64::new(0) }; hami::DEVICES];

/// The region, once joined.
pub fn region() -> Option<&'static Mapped> {
    REGION.get()
}

fn init_of(s: &Settings) -> Init {
    let mut init = Init { limit: [0; hami::DEVICES], sm_limit: [100; hami::DEVICES], priority: 1 };
    for i in 0..hami::DEVICES {
        if let Limit::Bytes(b) = s.limit_for(i as u32) {
            init.limit[i] = b;
        }
        if let Some(share) = s.compute_limit_for(i as u32) {
            init.sm_limit[i] = ((share * 100.0).round() as u64).clamp(1, 100);
        }
    }
    // (HAMi-core reads CUDA_TASK_PRIORITY with atoi; not in a secure-execution process)
    if !gpushim_common::secure::secure_execution() {
        if let Some(p) = gpushim_common::unforked::var_os("CUDA_TASK_PRIORITY") {
            init.priority = p.to_string_lossy().trim().parse().unwrap_or(0);
        }
    }
    init
}

/// Whether device `i`'s limit comes from HAMi's variables or nowhere (so a file's may win).
fn hami_or_unset(s: &Settings, i: u32) -> bool {
    let from = |key: &str| match s.source_of(key) {
        Source::Env(v) => v.starts_with(config::ENV_ALIAS_MEMORY_LIMIT),
        Source::Default => true,
        Source::File(_) => false,
    };
    let own = format!("memory_limits.{i}");
    if s.sources.iter().any(|(k, _)| *k == own) {
        from(&own)
    } else {
        from("memory_limit")
    }
}

/// Opens and joins the region the settings name (once, at start-up), and, without a named
/// quota, joins the region's quota. A region that cannot be used is a configuration error: the
/// program must not run with a budget of its own when its container's is shared.
pub fn join_region(s: &Settings) -> Result<(), config::ConfigError> {
    let Some(path) = &s.hami_region else { return Ok(()) };
    let setting = match s.source_of("hami_region") {
        Source::Env(v) => v.clone(),
        _ => format!("{} (unset: HAMi-core's default file)", config::ENV_HAMI_SHARED_CACHE),
    };
    let fail = |reason: String| config::ConfigError::new(setting.clone(), path.to_string_lossy(), format!("HAMi-core's shared region: {reason}"));
    if gpushim_common::secure::secure_execution() {
        return Err(fail("not used by a set-user-ID, set-group-ID or file-capability program".to_string()));
    }
    let init = init_of(s);
    let m = Mapped::open(path, &init).map_err(fail)?;
    if !m.created && m.trusted {
        let r = m.region();
        // (one line for all devices: runs of devices with the same two limits)
        let mut runs: Vec<(usize, usize, u64, u64)> = Vec::new();
        for i in 0..hami::DEVICES {
            let stored = r.limit[i];
            // (a stored limit only ever lowers the environment's: never more than it allows)
            if stored != 0 && (init.limit[i] == 0 || stored < init.limit[i]) && hami_or_unset(s, i as u32) {
                STORED[i].store(stored, Relaxed);
                match runs.last_mut() {
                    Some(run) if run.1 + 1 == i && (run.2, run.3) == (stored, init.limit[i]) => run.1 = i,
                    _ => runs.push((i, i, stored, init.limit[i])),
                }
            }
        }
        if !runs.is_empty() {
            let each: Vec<String> = runs
                .iter()
                .map(|&(a, b, stored, env)| {
                    let which = if a == b { format!("device {a}") } else { format!("devices {a}-{b}") };
                    let env = if env == 0 { "none".to_string() } else { format!("{env} bytes") };
                    format!("{which}: {stored} bytes (environment: {env})")
                })
                .collect();
            log!(Level::Warn, "the limits stored in HAMi-core's shared region {} win over the environment's, as in HAMi-core: {}", path.display(), each.join("; "));
        }
    }
    m.join().map_err(fail)?;
    let id = m.id;
    let _ = REGION.set(m);
    let _ = quota::ON_USAGE.set(mirror);
    leave_at_exit();
    log!(Level::Info, "HAMi-core shared region {}", path.display());
    if s.shared_quota.is_none() {
        let name = format!("hami-{:x}-{:x}", id.0, id.1);
        crate::sharing::join_named(s, &name, setting.clone())?;
    }
    Ok(())
}

/// The limit an existing region file stored for the program's device `ordinal`, when it wins.
pub fn stored_limit(s: &Settings, ordinal: u32) -> Option<Limit> {
    s.hami_region.as_ref()?;
    let b = STORED.get(ordinal as usize)?.load(Relaxed);
    (b != 0).then_some(Limit::Bytes(b))
}

/// Device `dev` (the program's ordinal, HAMi's index) has UUID `uuid` and, in the quota, index
/// `index`: recorded in the region.
pub fn attach(dev: CUdevice, uuid: &str, index: Option<usize>) {
    let Some(m) = region() else { return };
    let Ok(d) = usize::try_from(dev) else { return };
    if d >= hami::DEVICES {
        return;
    }
    m.set_device(d, uuid);
    if let Some(slot) = index.and_then(|i| DEVICE_OF.get(i)) {
        slot.store(d as u8 + 1, Relaxed);
    }
}

/// [`quota::ON_USAGE`]: this process' usage on quota device `d` into its region slot.
fn mirror(_q: &Quota, d: usize, usage: u64) {
    let Some(m) = region() else { return };
    let Some(dev) = DEVICE_OF.get(d).map(|a| a.load(Relaxed)).filter(|&v| v != 0) else { return };
    m.set_usage(dev as usize - 1, usage);
}

fn leave_at_exit() {
    static ONCE: ForkOnce<()> = ForkOnce::new();
    extern "C" fn leave() {
        let _ = std::panic::catch_unwind(|| region().map(Mapped::leave));
    }
    ONCE.call_once(|| gpushim_common::unforked::at_exit(leave));
}
