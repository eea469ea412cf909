//! This process' place in the user's shared state (the files of `quota`): its membership of a
//! shared quota (`GPUSHIM_SHARED_QUOTA`), or, for a process with a limit and no quota, its entry
//! in the registry of limited processes; and the oversubscription warning both feed.
//!
//! | process | joins | when | on failure |
//! |---|---|---|---|
//! | `shared_quota` set | the quota's file | at start-up ([`join_quota`]) | configuration error (closed) |
//! | a limit, no quota | the registry | when a device's limit is first resolved | `info` line, no warning (open) |
//! | a compute limit (`duty`) | the registry, for the GPU's turns | at the device's first paced launch | no turns (open) |
//! | neither | nothing | – | – |
//!
//! Both are left at exit (`atexit`); a process that dies otherwise is reclaimed by the others
//! (see `quota`).

use std::path::Path;
use gpushim_common::once::ForkOnce;


use gpushim_common::config::{self, Settings};
use crate::driver::ffi::CUdevice;
use gpushim_common::live::{Publisher, ViewEntry};
use crate::platform::log::{log, Level};
use gpushim_common::quota::{self, Quota};

/// The shared quota this process is a member of, joined at start-up.
static QUOTA: ForkOnce<Quota> = ForkOnce::new();
/// This process' entry in the registry of limited processes (`None`: it could not be joined).
static REGISTRY: ForkOnce<Option<Quota>> = ForkOnce::new();

/// This process' published live figures (`live`), started when the driver initialised.
static PUBLISHER: ForkOnce<Option<Publisher>> = ForkOnce::new();

/// Starts publishing this process' figures (once; at `cuInit`): the file describes `view`, and
/// is removed at exit. `None` when it cannot be published (a full state directory among the
/// causes: said at `info`; the program runs as usual).
pub fn publish(s: &Settings, view: &[ViewEntry]) -> Option<&'static Publisher> {
    PUBLISHER
        .get_or_init(|| {
            if gpushim_common::secure::caller_owns_state() {
                log!(Level::Debug, "not publishing this process' figures: set-group-ID or file capabilities (see secure)");
                return None;
            }
            let dir = quota::state_dir(s.state_dir.as_deref());
            match Publisher::start(&dir, quota().map(|q| q.name.as_str()), view) {
                Ok(p) => {
                    // (a forked child may run this again, its parent's runner cut off by the
                    // fork: `remove` finds nothing to do the second time)
                    static ONCE: ForkOnce<()> = ForkOnce::new();
                    extern "C" fn remove() {
                        let _ = std::panic::catch_unwind(|| PUBLISHER.get().and_then(Option::as_ref).map(Publisher::remove));
                    }
                    ONCE.call_once(|| gpushim_common::unforked::at_exit(remove));
                    Some(p)
                }
                Err(e) => {
                    log!(Level::Info, "not publishing this process' figures (gpushim ps, top, metrics will not show it): {e}");
                    None
                }
            }
        })
        .as_ref()
        // (a forked child that initialises CUDA again: the file is its parent's)
        .filter(|p| p.is_mine())
}

/// This process' published file, once publishing started (not a forked child's: its parent's).
pub fn publisher() -> Option<&'static Publisher> {
    PUBLISHER.get().and_then(Option::as_ref).filter(|p| p.is_mine())
}

/// In a forked child (`fork`): the published file is the parent's (see `live`).
pub fn after_fork_in_child() {
    if let Some(Some(p)) = PUBLISHER.get() {
        p.forget_in_child();
    }
}

pub fn quota() -> Option<&'static Quota> {
    QUOTA.get()
}

/// Registers, once, the `atexit` handler that leaves the quota and the registry.
fn leave_at_exit() {
    // (as in `publish`: `leave` finds nothing to do the second time)
    static ONCE: ForkOnce<()> = ForkOnce::new();
    extern "C" fn leave() {
        let _ = std::panic::catch_unwind(|| {
            QUOTA.get().map(Quota::leave);
            REGISTRY.get().and_then(Option::as_ref).map(Quota::leave);
        });
    }
    ONCE.call_once(|| gpushim_common::unforked::at_exit(leave));
}

/// Joins the shared quota the settings name. A quota that cannot be joined is a configuration
/// error: the program must not run with a budget of its own when it was given a shared one.
#[inline(never)] // a start-up step scripts/bench.sh counts by name
pub fn join_quota(s: &Settings) -> Result<(), config::ConfigError> {
    // (HAMi-core's shared region first: without a named quota it joins the region's own)
    crate::sharing::hami::join_region(s)?;
    let Some(name) = &s.shared_quota else { return Ok(()) };
    let setting = match s.source_of("shared_quota") {
        config::Source::Env(var) => var.clone(),
        other => format!("shared_quota ({other})"),
    };
    join_named(s, name, setting)
}

/// Joins the shared quota `name` (`setting`: what named it, for the error).
pub(crate) fn join_named(s: &Settings, name: &String, setting: String) -> Result<(), config::ConfigError> {
    let dir = quota::state_dir(s.state_dir.as_deref());
    if gpushim_common::secure::caller_owns_state() {
        let reason = "a shared quota cannot be used by a set-group-ID or file-capability program: its files would \
                      belong to the user who runs it, who could rewrite the budget";
        return Err(config::ConfigError::new(setting, name.clone(), reason));
    }
    let q = Quota::open(&dir, name, true).map_err(|e| config::ConfigError::new(setting, name.clone(), e))?;
    log!(Level::Info, "shared quota {name}: {}", q.path.display());
    let _ = quota::ON_ERROR.set(|e| log!(Level::Warn, "{e}"));
    let _ = QUOTA.set(q);
    leave_at_exit();
    Ok(())
}

/// The registry of limited processes, joined on first use.
fn registry(s: &Settings) -> Option<&'static Quota> {
    REGISTRY
        .get_or_init(|| {
            if gpushim_common::secure::caller_owns_state() {
                return None;
            }
            let dir = quota::state_dir(s.state_dir.as_deref());
            match Quota::open_registry(&dir, true) {
                Ok(r) => {
                    leave_at_exit();
                    Some(r)
                }
                Err(e) => {
                    log!(Level::Info, "not registering this process' limits (no oversubscription warning): {e}");
                    None
                }
            }
        })
        .as_ref()
}

/// The turn word of the GPU `uuid` (`size` its bytes) among the user's paced processes, in the
/// registry (joined here if not yet): `None` when there is no registry (the pacer then takes no
/// turns, its share still holds).
pub fn gpu_turn(s: &Settings, uuid: &str, size: u64) -> Option<&'static std::sync::atomic::AtomicU64> {
    match registry(s)?.turn(uuid, size) {
        Ok(turn) => turn,
        Err(e) => {
            log!(Level::Debug, "no turns on {uuid} with other paced processes: {e}");
            None
        }
    }
}

/// Records this process' `limit` on the device `uuid` (`size` its bytes: a part's when split):
/// in its quota, whose device index it returns (the budget then draws on the quota), or, when it
/// has a limit (`limited`) and no quota, in the registry. Then warns if the user's live quotas
/// and limited processes promise more than the device has. An error means the device cannot
/// take part in the process' quota.
#[inline(never)] // a start-up step scripts/bench.sh counts by name
pub fn attach_device(s: &Settings, dev: CUdevice, uuid: Option<&str>, size: u64, limit: u64, limited: bool) -> Result<Option<(&'static Quota, usize)>, String> {
    let shared = match (quota(), uuid) {
        (Some(q), Some(uuid)) => match q.device(uuid, size, limit)? {
            Some(index) => Some((q, index)),
            None => return Err(format!("more than {} devices", quota::DEVICES)),
        },
        (Some(_), None) => return Err("its UUID is unknown".to_string()),
        (None, Some(uuid)) if limited => {
            let Some(r) = registry(s) else { return Ok(None) };
            if let Err(e) = r.device(uuid, size, limit) {
                log!(Level::Debug, "not registering device {dev}'s limit: {e}");
                return Ok(None);
            }
            None
        }
        _ => return Ok(None),
    };
    if let Some(uuid) = uuid {
        crate::sharing::hami::attach(dev, uuid, shared.map(|(_, index)| index));
        warn_oversubscribed(&quota::state_dir(s.state_dir.as_deref()), dev, uuid, size);
    }
    Ok(shared)
}

/// One `warn` line when what the user's live quotas and limited processes promise on a device
/// adds up to more than it has: some of them may then run out of memory below their limits.
fn warn_oversubscribed(dir: &Path, dev: CUdevice, uuid: &str, size: u64) {
    let promised = quota::commitments_on(dir, uuid, REGISTRY.get().and_then(Option::as_ref));
    let sum = promised.iter().map(|p| p.1).fold(0u64, u64::saturating_add);
    if promised.len() > 1 && sum > size {
        // (escaped: other processes' names, the user's to choose)
        let each: Vec<String> = promised.iter().map(|(who, b)| format!("{}: {b}", who.escape_debug())).collect();
        log!(
            Level::Warn,
            "device {dev} ({uuid}) is oversubscribed: the limits of this user's processes on it add up to {sum} bytes ({}), more than its {size} bytes; they may run out of memory below their limits",
            each.join(", ")
        );
    }
}
