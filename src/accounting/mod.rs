//! Memory accounting: the budgets and the live map, the fast lane, reserves and memory modes, VMM handles, pools, graphs and teardown.

pub mod graphs;
pub mod lane;
pub mod memory;
pub mod modes;
pub mod pools;
pub mod reserve;
pub mod teardown;
pub mod vmm;
