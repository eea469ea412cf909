//! `gpushim top`: placeholder.
use std::ffi::OsString;
use crate::Failure;
pub fn main(args: &[OsString]) -> Result<(), Failure> {
    crate::ps::main(args)
}
