//! Call counters of exported entry points, and what is read from them.
//!
//! A library lists its entry points once, in its `registry` module:
//!
//! ```ignore
//! gpusim_common::exports! { cuInit, cuDriverGetVersion, /* … */ }
//! ```
//! which defines there `enum Id` (one variant per name, in list order), `NAMES`, `N`,
//! `COUNTS` (one `AtomicU64` per name), `addresses()` (each function's address, in list order)
//! and `hit(Id)`. The wrapper (`exported_fns!`) counts each call with `hit`, so a function
//! missing from the list does not compile; `addresses` names every function, so a listed name
//! without a function does not compile either.

use std::ffi::{c_char, CStr};
use std::sync::atomic::{AtomicU64, Ordering};

#[macro_export]
macro_rules! exports {
    ($($name:ident),* $(,)?) => {
        /// Index of an exported entry point.
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        #[repr(usize)]
        #[allow(clippy::enum_variant_names)]
        pub enum Id { $($name),* }

        pub static NAMES: &[&str] = &[$(stringify!($name)),*];

        const N: usize = [$(stringify!($name)),*].len();

        /// Call counters, by `Id`.
        pub static COUNTS: [::std::sync::atomic::AtomicU64; N] =
            [const { ::std::sync::atomic::AtomicU64::new(0) }; N];

        /// The address of every entry point, in `NAMES` order.
        #[allow(dead_code)]
        pub fn addresses() -> ::std::vec::Vec<usize> {
            ::std::vec![$($name as *const () as usize),*]
        }

        /// Counts one call.
        #[inline(always)]
        pub fn hit(id: Id) {
            COUNTS[id as usize].fetch_add(1, ::std::sync::atomic::Ordering::Relaxed);
        }
    };
}

/// Calls of `name` so far (0 for a name not in `names`).
pub fn count_of(names: &[&str], counts: &[AtomicU64], name: &str) -> u64 {
    names
        .iter()
        .position(|n| *n == name)
        .and_then(|i| counts.get(i))
        .map_or(0, |c| c.load(Ordering::Relaxed))
}

/// The body of the `gpusim*_call_count(const char *name)` hooks: calls of that entry point so
/// far, 0 for NULL, a name that is not UTF-8 or an unknown name.
///
/// # Safety
/// A non-NULL `name` must be a NUL-terminated string.
pub unsafe fn count_of_c(names: &[&str], counts: &[AtomicU64], name: *const c_char) -> u64 {
    if name.is_null() {
        return 0;
    }
    // SAFETY: the caller passes a NUL-terminated string.
    let n = unsafe { CStr::from_ptr(name) };
    n.to_str().map_or(0, |n| count_of(names, counts, n))
}

/// `"name":count` for every entry point called at least once, in list order, joined by `,`:
/// the inside of a report's `"calls":{…}`.
pub fn calls_json(names: &[&str], counts: &[AtomicU64]) -> String {
    let calls: Vec<String> = names
        .iter()
        .zip(counts.iter())
        .map(|(n, c)| (n, c.load(Ordering::Relaxed)))
        .filter(|&(_, c)| c > 0)
        .map(|(n, c)| format!("{}:{}", json_str(n), c))
        .collect();
    calls.join(",")
}

/// `s` as a JSON string literal.
pub fn json_str(s: &str) -> String {
    let mut o = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => o.push_str("\\\""),
            '\\' => o.push_str("\\\\"),
            c if (c as u32) < 0x20 => o.push_str(&format!("\\u{:04x}", c as u32)),
            c => o.push(c),
        }
    }
    o.push('"');
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    extern "C" fn alpha() {}
    extern "C" fn beta() {}
    extern "C" fn gamma() {}

    #[allow(non_camel_case_types)]
    mod registry {
        use super::{alpha, beta, gamma};
        crate::exports! { alpha, beta, gamma }
    }

    #[test]
    fn counting_and_json() {
        use registry::*;
        assert_eq!(NAMES, &["alpha", "beta", "gamma"]);
        assert_eq!(Id::gamma as usize, 2);
        assert_eq!(addresses().len(), 3);
        // (no address equality: a plain fn's address may differ between codegen units)
        assert!(addresses().iter().all(|&a| a != 0));
        assert_eq!(calls_json(NAMES, &COUNTS), "");
        hit(Id::gamma);
        hit(Id::gamma);
        hit(Id::alpha);
        assert_eq!(calls_json(NAMES, &COUNTS), "\"alpha\":1,\"gamma\":2");
        hit(Id::beta);
        assert_eq!(
            calls_json(NAMES, &COUNTS),
            "\"alpha\":1,\"beta\":1,\"gamma\":2"
        );
        assert_eq!(count_of(NAMES, &COUNTS, "gamma"), 2);
        assert_eq!(count_of(NAMES, &COUNTS, "delta"), 0);
        unsafe {
            assert_eq!(count_of_c(NAMES, &COUNTS, c"alpha".as_ptr()), 1);
            assert_eq!(count_of_c(NAMES, &COUNTS, std::ptr::null()), 0);
            assert_eq!(count_of_c(NAMES, &COUNTS, c"\xff".as_ptr()), 0);
        }
    }

    #[test]
    fn json_strings() {
        assert_eq!(json_str("gpusim device 0"), "\"gpusim device 0\"");
        assert_eq!(json_str("a\"b\\c\n"), "\"a\\\"b\\\\c\\u000a\"");
    }
}
