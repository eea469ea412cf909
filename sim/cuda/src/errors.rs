//! `cuGetErrorName` / `cuGetErrorString` over the table of every `CUresult` in cuda.h.

use crate::types::*;
use std::ffi::{c_char, CString};
use std::sync::OnceLock;

#[path = "error_table.rs"]
mod table;

static STRINGS: OnceLock<Vec<(i32, CString, CString)>> = OnceLock::new();

fn strings() -> &'static [(i32, CString, CString)] {
    STRINGS.get_or_init(|| {
        table::ERRORS
            .iter()
            .map(|&(code, name, desc)| {
                (
                    code,
                    CString::new(name).unwrap_or_default(),
                    CString::new(desc).unwrap_or_default(),
                )
            })
            .collect()
    })
}

#[cfg(test)]
/// The name of a `CUresult` (`"CUDA_ERROR_OUT_OF_MEMORY"`), if it is one.
pub fn name(code: CUresult) -> Option<&'static str> {
    table::ERRORS.iter().find(|e| e.0 == code).map(|e| e.1)
}

unsafe fn lookup(code: CUresult, out: *mut *const c_char, desc: bool) -> Res {
    if out.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    match strings().iter().find(|e| e.0 == code) {
        Some((_, n, d)) => put(out, if desc { d.as_ptr() } else { n.as_ptr() }),
        None => {
            put(out, std::ptr::null())?;
            Err(CUDA_ERROR_INVALID_VALUE)
        }
    }
}

cu_api! {
    fn cuGetErrorName(error: CUresult, out: *mut *const c_char) { lookup(error, out, false) }
    fn cuGetErrorString(error: CUresult, out: *mut *const c_char) { lookup(error, out, true) }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn names() {
        assert_eq!(name(2), Some("CUDA_ERROR_OUT_OF_MEMORY"));
        assert_eq!(name(0), Some("CUDA_SUCCESS"));
        assert_eq!(name(999), Some("CUDA_ERROR_UNKNOWN"));
        assert_eq!(name(12345), None);
        assert!(table::ERRORS.len() > 100);
    }
}
