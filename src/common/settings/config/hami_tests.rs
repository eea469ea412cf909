//! Unit tests of HAMi-core's variables read with HAMi-core's meaning (`hami`).

use super::tests::{err, file_ok, ok};
use super::*;

const GIB: u64 = 1 << 30;
const MIB: u64 = 1 << 20;

#[test]
fn hami_core_reading_is_strtoul() {
    for (value, bytes) in [
        ("4g", 4 * GIB),
        ("4096m", 4096 * MIB),
        ("64K", 64 << 10),
        ("1073741824", GIB),
        ("0x40000000", GIB),
        ("010", 8),
        ("1GiB", 1),
        ("50%", 50),
        ("1.5g", GIB),
        ("4 gigs", 4),
        ("", 0),
        ("0", 0),
        ("abc", 0),
        ("-1", u64::MAX),
        ("99999999999999999999999", u64::MAX),
        ("17179869184g", 0), // overflows: HAMi-core logs it and has no limit
        (" 2g", 2 * GIB),
        ("4g\n", 4),
    ] {
        assert_eq!(hami_core_reading(value), bytes, "{value:?}");
    }
}

#[test]
fn zero_is_no_limit_and_per_device_zero_falls_back() {
    let s = ok(&[(ENV_ALIAS_MEMORY_LIMIT, "0")]);
    assert_eq!(s.memory_limit, Limit::Unlimited);
    assert!(!s.limits_anything());
    let s = ok(&[(ENV_ALIAS_MEMORY_LIMIT, "2g"), ("CUDA_DEVICE_MEMORY_LIMIT_1", "0"), ("CUDA_DEVICE_MEMORY_LIMIT_0", "1g")]);
    assert_eq!(s.limit_for(0), Limit::Bytes(GIB));
    assert_eq!(s.limit_for(1), Limit::Bytes(2 * GIB));
    assert_eq!(s.limit_for(2), Limit::Bytes(2 * GIB));
    assert!(!s.device_limits.contains_key(&1));
    // empty: as HAMi-core, zero
    let s = ok(&[(ENV_ALIAS_MEMORY_LIMIT, ""), ("CUDA_DEVICE_MEMORY_LIMIT_0", " ")]);
    assert_eq!(s.limit_for(0), Limit::Unlimited);
    assert!(s.warnings.is_empty(), "{:?}", s.warnings);
    // HAMi-core's own forms say nothing
    for v in ["4g", "4096m", "1073741824", "0x40000000", "0", "unlimited"] {
        let s = ok(&[(ENV_ALIAS_MEMORY_LIMIT, v)]);
        assert!(s.warnings.is_empty(), "{v}: {:?}", s.warnings);
    }
    let s = ok(&[(ENV_ALIAS_MEMORY_LIMIT, "0x40000000")]);
    assert_eq!(s.memory_limit, Limit::Bytes(GIB));
    // GPUSHIM_ names win over HAMi's zero too
    let s = ok(&[(ENV_ALIAS_MEMORY_LIMIT, "0"), (ENV_MEMORY_LIMIT, "1GiB")]);
    assert_eq!(s.memory_limit, Limit::Bytes(GIB));
    // a file's limit holds under HAMi's zero (zero is unset to HAMi-core)
    let (_, s) = file_ok("memory_limit = \"3GiB\"\n", &[(ENV_ALIAS_MEMORY_LIMIT, "0")]);
    assert_eq!(s.memory_limit, Limit::Bytes(3 * GIB));
}

#[test]
fn misreads_do_what_was_meant_and_say_so_once() {
    for (value, limit, hami) in [
        ("1GiB", Limit::Bytes(GIB), "1 bytes"),
        ("50%", Limit::Fraction(0.5), "50 bytes"),
        ("1.5g", Limit::Bytes(3 * GIB / 2), "1073741824 bytes"),
        ("010", Limit::Bytes(10), "8 bytes"),
        ("2GB", Limit::Bytes(2_000_000_000), "2 bytes"),
        ("0.5", Limit::Fraction(0.5), "no limit"),
        ("4g\n", Limit::Bytes(4 * GIB), "4 bytes"),
    ] {
        let s = ok(&[(ENV_ALIAS_MEMORY_LIMIT, value)]);
        assert_eq!(s.memory_limit, limit, "{value:?}");
        assert_eq!(s.warnings.len(), 1, "{value:?}: {:?}", s.warnings);
        let w = &s.warnings[0];
        assert!(w.starts_with(&format!("{ENV_ALIAS_MEMORY_LIMIT}=")), "{w}");
        assert!(w.contains(&format!("HAMi-core would read {hami};")), "{w}");
        assert!(w.contains("gpushim reads"), "{w}");
        assert!(!w.contains('\n'), "one line: {w}");
    }
    // per device too, one line per variable
    let s = ok(&[("CUDA_DEVICE_MEMORY_LIMIT_0", "1GiB"), ("CUDA_DEVICE_MEMORY_LIMIT_1", "2g")]);
    assert_eq!(s.limit_for(0), Limit::Bytes(GIB));
    assert_eq!(s.warnings.len(), 1);
    assert!(s.warnings[0].starts_with("CUDA_DEVICE_MEMORY_LIMIT_0=\"1GiB\": HAMi-core would read 1 bytes"), "{}", s.warnings[0]);
}

#[test]
fn bad_hami_sizes_are_errors_naming_the_variable() {
    for var in [ENV_ALIAS_MEMORY_LIMIT, "CUDA_DEVICE_MEMORY_LIMIT_3"] {
        for value in [
            "4 gigs", "-1", "+1", "abc", "1e9", "nan", "4 096", "0%", "101%", "1.5", ".5",
            "18446744073709551616", "99999999999999999999999", "17179869184g", "0xfffffffffffffffffff",
            "\u{1}", "4g\u{0}", "\u{1b}[31m", "１g",
        ] {
            let e = err(&[(var, value)]);
            assert!(e.starts_with(&format!("gpushim: {var}=")), "{value:?}: {e}");
            assert!(!e.contains('\n'), "{value:?}: {e}");
        }
    }
    // a bad ordinal suffix names the variable
    let e = err(&[("CUDA_DEVICE_MEMORY_LIMIT_x", "1g")]);
    assert!(e.contains("is not a device ordinal"), "{e}");
}

#[test]
fn libcuda_log_level_maps_to_the_shims_levels() {
    for (v, level) in [("0", LogLevel::Off), ("1", LogLevel::Error), ("2", LogLevel::Warn), ("3", LogLevel::Info), ("4", LogLevel::Debug), ("9", LogLevel::Debug), ("-1", LogLevel::Off), (" 3 ", LogLevel::Info)] {
        let s = ok(&[(ENV_HAMI_LOG_LEVEL, v)]);
        assert_eq!(s.log_level, level, "{v}");
        assert_eq!(s.source_of("log"), &Source::Env(ENV_HAMI_LOG_LEVEL.into()));
    }
    // the shim's own variable wins
    let s = ok(&[(ENV_HAMI_LOG_LEVEL, "0"), (ENV_LOG, "debug")]);
    assert_eq!(s.log_level, LogLevel::Debug);
    for bad in ["", "debug", "2.5", "\u{7f}", "99999999999999999999999"] {
        let e = err(&[(ENV_HAMI_LOG_LEVEL, bad)]);
        assert!(e.starts_with("gpushim: LIBCUDA_LOG_LEVEL="), "{bad:?}: {e}");
    }
}

#[test]
fn cuda_disable_control_passes_through() {
    for v in ["true", "TRUE", "1", "yes"] {
        let s = ok(&[(ENV_HAMI_DISABLE, v), (ENV_MEMORY_LIMIT, "not a size")]);
        assert!(s.disable, "{v}");
        assert_eq!(s.source_of("disable"), &Source::Env(ENV_HAMI_DISABLE.into()));
    }
    for v in ["false", "0", "", "\u{1}"] {
        assert!(!ok(&[(ENV_HAMI_DISABLE, v)]).disable, "{v:?}");
    }
    // GPUSHIM_DISABLE set to another value wins: active
    assert!(!ok(&[(ENV_HAMI_DISABLE, "true"), (ENV_DISABLE, "0")]).disable);
}

#[test]
fn the_region_applies_only_through_hamis_variables() {
    assert_eq!(ok(&[]).hami_region, None);
    assert_eq!(ok(&[(ENV_MEMORY_LIMIT, "1GiB"), (ENV_SHARED_QUOTA, "q")]).hami_region, None);
    assert_eq!(ok(&[(ENV_HAMI_LOG_LEVEL, "3")]).hami_region, None);
    let default = Some(PathBuf::from(HAMI_DEFAULT_REGION));
    assert_eq!(ok(&[(ENV_ALIAS_MEMORY_LIMIT, "1g")]).hami_region, default);
    assert_eq!(ok(&[(ENV_ALIAS_MEMORY_LIMIT, "0")]).hami_region, default);
    assert_eq!(ok(&[("CUDA_DEVICE_MEMORY_LIMIT_2", "1g")]).hami_region, default);
    assert_eq!(ok(&[(ENV_ALIAS_SM_LIMIT, "30")]).hami_region, default);
    assert_eq!(ok(&[("CUDA_DEVICE_SM_LIMIT_0", "30")]).hami_region, default);
    let s = ok(&[(ENV_HAMI_SHARED_CACHE, "/tmp/x.cache")]);
    assert_eq!(s.hami_region, Some(PathBuf::from("/tmp/x.cache")));
    assert_eq!(s.source_of("hami_region"), &Source::Env(ENV_HAMI_SHARED_CACHE.into()));
    let e = err(&[(ENV_HAMI_SHARED_CACHE, "")]);
    assert!(e.starts_with("gpushim: CUDA_DEVICE_MEMORY_SHARED_CACHE="), "{e}");
}

#[test]
fn sm_limit_per_device_zero_falls_back() {
    let s = ok(&[(ENV_ALIAS_SM_LIMIT, "30"), ("CUDA_DEVICE_SM_LIMIT_1", "0"), ("CUDA_DEVICE_SM_LIMIT_2", "100")]);
    assert_eq!(s.compute_limit_for(1), Some(0.3));
    assert_eq!(s.compute_limit_for(2), None);
}
