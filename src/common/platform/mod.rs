//! The platform under everything: raw system calls, bounded waits and once-cells that survive `fork`.

pub mod bounded;
pub mod once;
pub mod sys;
pub mod unforked;
