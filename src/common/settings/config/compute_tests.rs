//! Unit tests of the compute settings: `GPUSHIM_COMPUTE_LIMIT(_<i>)`, `GPUSHIM_COMPUTE_MODE`,
//! HAMi-core's `CUDA_DEVICE_SM_LIMIT(_<i>)` and the file's `compute_*` keys.

use super::tests::{err, file_err, file_ok, ok};
use super::*;

#[test]
fn compute_limit_values() {
    for (value, share) in [("30%", 0.3), ("0.3", 0.3), (" 5 % ", 0.05), ("100%", 1.0), ("1", 1.0), ("0.001", 0.001), ("12.5%", 0.125)] {
        let s = ok(&[(ENV_COMPUTE_LIMIT, value)]);
        assert_eq!(s.compute_limit, Some(share), "{value}");
    }
    let s = ok(&[(ENV_COMPUTE_LIMIT, "30%")]);
    assert_eq!(s.compute_limit_for(0), Some(0.3));
    assert_eq!(s.compute_limit_for(7), Some(0.3));
    assert!(s.compute_limits_anything());
    // 100 %: set, but no limit
    let s = ok(&[(ENV_COMPUTE_LIMIT, "100%")]);
    assert_eq!(s.compute_limit_for(0), None);
    assert!(!s.compute_limits_anything());
    let s = ok(&[]);
    assert_eq!((s.compute_limit, s.compute_mode), (None, ComputeMode::Auto));
    assert!(!s.compute_limits_anything());
}

#[test]
fn bad_compute_limits_are_errors_naming_the_variable() {
    for value in ["0", "0%", "101%", "30", "1.5", "-0.3", "+30%", "1e-1", "inf", "nan", "30 %%", "%", ".", "0x10", "3O%", "\u{1b}[31m"] {
        let e = err(&[(ENV_COMPUTE_LIMIT, value)]);
        assert!(e.starts_with("gpushim: GPUSHIM_COMPUTE_LIMIT="), "{value}: {e}");
        assert!(e.contains("above 0 and at most 100%"), "{value}: {e}");
        assert!(!e.contains('\u{1b}'), "escaped: {e}");
    }
    assert!(err(&[(ENV_COMPUTE_LIMIT, "30")]).contains("did you mean 30%?"));
    // below a millionth (what the pacer counts in): an error, not a larger share
    for value in ["0.0000001", "0.00001%", "0.00000000001"] {
        assert!(err(&[(ENV_COMPUTE_LIMIT, value)]).contains("the smallest share is 0.0001%"), "{value}");
    }
    assert_eq!(ok(&[(ENV_COMPUTE_LIMIT, "0.0001%")]).compute_limit, Some(0.000001));
    assert!(err(&[(ENV_COMPUTE_LIMIT, " ")]).contains("empty"));
    let e = err(&[("GPUSHIM_COMPUTE_LIMIT_1", "2")]);
    assert!(e.starts_with("gpushim: GPUSHIM_COMPUTE_LIMIT_1=\"2\""), "{e}");
    let e = err(&[("GPUSHIM_COMPUTE_LIMIT_01", "30%")]);
    assert!(e.contains("is not a device ordinal"), "{e}");
    let e = err(&[("GPUSHIM_COMPUTE_LIMIT_x\u{7}", "30%")]);
    assert!(e.contains("is not a device ordinal") && !e.contains('\u{7}'), "{e}");
    let e = err(&[(ENV_COMPUTE_MODE, "fast")]);
    assert_eq!(e, "gpushim: GPUSHIM_COMPUTE_MODE=\"fast\": expected one of auto, duty, mps, green");
}

#[test]
fn compute_modes() {
    for mode in ComputeMode::ALL {
        assert_eq!(ok(&[(ENV_COMPUTE_MODE, &mode.as_str().to_uppercase())]).compute_mode, mode);
    }
}

#[test]
fn per_device_compute_limits_and_precedence() {
    let s = ok(&[(ENV_COMPUTE_LIMIT, "50%"), ("GPUSHIM_COMPUTE_LIMIT_1", "20%"), ("GPUSHIM_COMPUTE_LIMIT_2", "100%")]);
    assert_eq!([s.compute_limit_for(0), s.compute_limit_for(1), s.compute_limit_for(2)], [Some(0.5), Some(0.2), None]);
    // HAMi-core's names, below ours
    let s = ok(&[(ENV_ALIAS_SM_LIMIT, "30"), ("CUDA_DEVICE_SM_LIMIT_1", "70")]);
    assert_eq!([s.compute_limit_for(0), s.compute_limit_for(1)], [Some(0.3), Some(0.7)]);
    assert_eq!(s.source_of("compute_limit"), &Source::Env(ENV_ALIAS_SM_LIMIT.into()));
    assert_eq!(s.source_of("compute_limits.1"), &Source::Env("CUDA_DEVICE_SM_LIMIT_1".into()));
    let s = ok(&[(ENV_ALIAS_SM_LIMIT, "0")]);
    assert_eq!(s.compute_limit_for(0), None, "0 = no limit");
    // a GPUSHIM_ all-devices limit replaces the aliases' per-device ones
    let s = ok(&[(ENV_COMPUTE_LIMIT, "40%"), ("CUDA_DEVICE_SM_LIMIT_1", "70")]);
    assert_eq!([s.compute_limit_for(0), s.compute_limit_for(1)], [Some(0.4), Some(0.4)]);
    // per-device GPUSHIM_ over the alias' all-devices
    let s = ok(&[(ENV_ALIAS_SM_LIMIT, "30"), ("GPUSHIM_COMPUTE_LIMIT_0", "60%")]);
    assert_eq!([s.compute_limit_for(0), s.compute_limit_for(1)], [Some(0.6), Some(0.3)]);
    for bad in ["101", "30%", "0.3", "-1", "", " 3 0"] {
        let e = err(&[(ENV_ALIAS_SM_LIMIT, bad)]);
        assert!(e.starts_with("gpushim: CUDA_DEVICE_SM_LIMIT="), "{bad}: {e}");
    }
    assert!(err(&[("CUDA_DEVICE_SM_LIMIT_a", "30")]).contains("is not a device ordinal"));
}

#[test]
fn compute_keys_of_the_file() {
    let (_, s) = file_ok("compute_limit = \"25%\"\ncompute_mode = \"duty\"\n[compute_limits]\n1 = 0.5\n2 = 1\n", &[]);
    assert_eq!([s.compute_limit_for(0), s.compute_limit_for(1), s.compute_limit_for(2)], [Some(0.25), Some(0.5), None]);
    assert_eq!(s.compute_mode, ComputeMode::Duty);
    // the environment over the file
    let (_, s) = file_ok("compute_limit = 0.25\n[compute_limits]\n1 = 0.5\n", &[(ENV_ALIAS_SM_LIMIT, "10")]);
    assert_eq!([s.compute_limit_for(0), s.compute_limit_for(1)], [Some(0.1), Some(0.1)]);
    for (text, key) in [("compute_limit = 30", "compute_limit"), ("compute_limit = 1.5", "compute_limit"), ("compute_limit = true", "compute_limit"), ("compute_mode = \"x\"", "compute_mode"), ("compute_limits = 3", "compute_limits"), ("[compute_limits]\nx = 0.5", "compute_limits.x")] {
        let (_, e) = file_err(text);
        assert!(e.starts_with(&format!("gpushim: {key} (in ")), "{text}: {e}");
    }
}
