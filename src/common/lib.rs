//! What `libgpushim.so` and the `gpushim` command share: the platform's calls, the settings and the formats of the state files.
//!
//! Three layers, bottom to top: `platform` (system calls, bounded waits, fork-aware
//! once-cells), `settings` (environment, config file, units, secure execution) and
//! `state_files` (the shared quotas and the live figures other processes read). Nothing here
//! starts a thread or allocates when loaded. The modules are re-exported at the crate's root
//! under the names both users have always used (`config`, `units`, `quota`, …).

pub mod platform;
pub mod settings;
pub mod state_files;

pub use platform::{bounded, once, sys, unforked};
pub use settings::{compute_mode, config, secure, units};
pub use state_files::{hami, live, oom_wait, quota};
