//! This process' part in what is shared with others: shared quotas, the registry, live figures, and the exit report.

mod join;

pub use join::*;
