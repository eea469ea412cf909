//! Fault injection: `GPUSIM_FAIL` makes named functions fail, to model a driver that returns an
//! error its caller did not expect (or, with the "not supported" code, one that lacks a
//! function's implementation).
//!
//! `GPUSIM_FAIL=NAME=CODE[@N][,NAME=CODE[@N]…]`: every call of the exported function `NAME`
//! returns `CODE` without doing anything; with `@N`, only its N-th call (1-based) does. The
//! counting is per name and per process. Unparsable entries are reported once on stderr and
//! ignored. Unset or empty: nothing is injected (one relaxed load per call).

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::OnceLock;

struct Fault {
    name: String,
    code: i64,
    /// Fail only this call (1-based); 0: every call.
    nth: u64,
    calls: AtomicU64,
}

fn parse(spec: &str) -> (Vec<Fault>, Vec<String>) {
    let mut faults = Vec::new();
    let mut bad = Vec::new();
    for entry in spec.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let parsed = entry.split_once('=').and_then(|(name, rest)| {
            let (code, nth) = match rest.split_once('@') {
                Some((c, n)) => (c, n.trim().parse::<u64>().ok().filter(|&n| n > 0)?),
                None => (rest, 0),
            };
            let code = code.trim().parse::<i64>().ok()?;
            let name = name.trim();
            (!name.is_empty()).then(|| Fault { name: name.to_string(), code, nth, calls: AtomicU64::new(0) })
        });
        match parsed {
            Some(f) => faults.push(f),
            None => bad.push(entry.to_string()),
        }
    }
    (faults, bad)
}

fn faults() -> &'static [Fault] {
    static FAULTS: OnceLock<Vec<Fault>> = OnceLock::new();
    FAULTS.get_or_init(|| {
        let spec = std::env::var("GPUSIM_FAIL").unwrap_or_default();
        let (faults, bad) = parse(&spec);
        for b in bad {
            crate::ffi::trace_line(&format!("gpusim: GPUSIM_FAIL entry {b:?} ignored: expected NAME=CODE or NAME=CODE@N\n"));
        }
        faults
    })
}

/// The code `name` must fail with on this call, if `GPUSIM_FAIL` says so.
#[inline]
pub fn injected(name: &str) -> Option<i64> {
    let faults = faults();
    if faults.is_empty() {
        return None;
    }
    let f = faults.iter().find(|f| f.name == name)?;
    let call = f.calls.fetch_add(1, Relaxed) + 1;
    (f.nth == 0 || f.nth == call).then_some(f.code)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs() {
        let (f, bad) = parse(" cuStreamGetCtx=201 , cuCtxSynchronize=700@2,x,=3,y=z,w=1@0");
        assert_eq!(f.len(), 2);
        assert_eq!((f[0].name.as_str(), f[0].code, f[0].nth), ("cuStreamGetCtx", 201, 0));
        assert_eq!((f[1].name.as_str(), f[1].code, f[1].nth), ("cuCtxSynchronize", 700, 2));
        assert_eq!(bad, ["x", "=3", "y=z", "w=1@0"]);
        assert!(parse("").0.is_empty());
    }
}
