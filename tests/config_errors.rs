//! A configuration error fails closed: CUDA initialisation fails (cuInit → 3, the runtime's
//! cudaErrorInitializationError = 3) and exactly one line `gpushim: SETTING="VALUE": REASON`
//! is printed — whether the setting comes from the environment or from the TOML file.

mod common;

use common::*;

/// Every value SPEC calls a configuration error, and some more of the same kinds.
const BAD_VALUES: &[&str] = &[
    "4 gigs", "-1", "08x", "", " ", "1.5", "101%", "0%", "-5%", "abc", "4GiBx", "1.2.3", "0x10",
    "1e9", "4 G iB", "2.0", "1.5B", "%", "+1",
];

/// The programs a configuration error must stop, on each way into the driver.
fn programs() -> Vec<Program> {
    vec![
        Program::Driver(DriverPath::Link),
        Program::Driver(DriverPath::Dlsym),
        Program::Driver(DriverPath::Gpa),
        Program::Runtime {
            major: 12,
            ptsz: false,
        },
        Program::Runtime {
            major: 13,
            ptsz: false,
        },
    ]
}

/// Runs `p` with and without the shim; without it the program must initialise, with it
/// initialisation must fail with exactly one gpushim line, which is returned.
fn fails_closed(p: Program, env: &[(&str, &str)]) -> String {
    check_fails_closed(|| Run::program(p).envs(env)).line
}

#[test]
fn bad_memory_limit_in_the_environment() {
    for p in programs() {
        for value in BAD_VALUES {
            let out = check_fails_closed(|| {
                Run::program(p).env("GPUSHIM_MEMORY_LIMIT", value)
            });
            assert_fails_closed(&out.shim, "GPUSHIM_MEMORY_LIMIT", value);
        }
    }
}

/// SPEC's own example, word for word.
#[test]
fn spec_example_message() {
    let line = fails_closed(
        Program::Driver(DriverPath::Link),
        &[("GPUSHIM_MEMORY_LIMIT", "4 gigs")],
    );
    assert_eq!(line, "gpushim: GPUSHIM_MEMORY_LIMIT=\"4 gigs\": expected a size like 4GiB or a fraction like 40%");
}

#[test]
fn bad_per_device_limits_and_aliases() {
    let cases: &[(&str, &str)] = &[
        ("GPUSHIM_MEMORY_LIMIT_1", "08x"),
        ("GPUSHIM_MEMORY_LIMIT_0", "4 gigs"),
        ("CUDA_DEVICE_MEMORY_LIMIT", "-1"),
        ("CUDA_DEVICE_MEMORY_LIMIT_1", "101%"),
    ];
    for p in [
        Program::Driver(DriverPath::Link),
        Program::Runtime {
            major: 13,
            ptsz: false,
        },
    ] {
        for (name, value) in cases {
            let out = check_fails_closed(|| Run::program(p).env(name, value));
            assert_fails_closed(&out.shim, name, value);
        }
    }
}

/// The same bad values in the config file: `memory_limit = "…"`.
#[test]
fn bad_memory_limit_in_the_config_file() {
    for value in BAD_VALUES {
        let file = scratch_path("gpushim.toml");
        std::fs::write(&file, format!("memory_limit = {:?}\n", value)).unwrap();
        for p in [
            Program::Driver(DriverPath::Link),
            Program::Driver(DriverPath::Gpa),
            Program::Runtime {
                major: 13,
                ptsz: false,
            },
        ] {
            let line = fails_closed(p, &[("GPUSHIM_CONFIG", file.to_str().unwrap())]);
            assert!(line.starts_with("gpushim: "), "`{line}`");
            let quoted = format!("=\"{value}\": ");
            assert!(line.contains(&quoted), "`{line}` does not show `{quoted}`");
            assert!(
                line.contains("memory_limit"),
                "`{line}` does not name the setting"
            );
        }
    }
}

/// A valid config file applies; the environment overrides it.
#[test]
fn config_file_applies_and_environment_overrides() {
    let file = scratch_path("gpushim.toml");
    std::fs::write(&file, "memory_limit = \"64MiB\"\n").unwrap();
    let cfg = file.to_str().unwrap();
    let cases: &[(&[(&str, &str)], u64)] = &[
        (&[("GPUSHIM_CONFIG", cfg)], 64 * MIB),
        (
            &[("GPUSHIM_CONFIG", cfg), ("GPUSHIM_MEMORY_LIMIT", "32MiB")],
            32 * MIB,
        ),
    ];
    for (env, total) in cases {
        for shim in [false, true] {
            let out = Run::program(Program::Driver(DriverPath::Link))
                .env("GPUSIM_MEMORY", "1GiB")
                .envs(*env)
                .arg("totalmem")
                .shim(shim)
                .run();
            out.assert_completed();
            assert_eq!(
                out.u64("op1.total0"),
                if shim { *total } else { GIB },
                "{env:?}\n{}",
                out.dump()
            );
            assert!(out.gpushim_lines().is_empty(), "{}", out.dump());
        }
    }
}

/// A named config file that does not exist is a configuration error that names it.
#[test]
fn missing_config_file() {
    let missing = scratch_path("does-not-exist.toml");
    let path = missing.to_str().unwrap();
    for p in programs() {
        let out = check_fails_closed(|| Run::program(p).env("GPUSHIM_CONFIG", path));
        assert_fails_closed(&out.shim, "GPUSHIM_CONFIG", path);
    }
}

/// A config file that is not valid TOML is a configuration error that names the file.
#[test]
fn invalid_config_file() {
    let file = scratch_path("broken.toml");
    std::fs::write(&file, "memory_limit = \"4GiB\n[[[\n").unwrap();
    let path = file.to_str().unwrap();
    for p in [
        Program::Driver(DriverPath::Link),
        Program::Runtime {
            major: 12,
            ptsz: false,
        },
    ] {
        let line = fails_closed(p, &[("GPUSHIM_CONFIG", path)]);
        assert!(line.starts_with("gpushim: "), "`{line}`");
        assert!(line.contains(path), "`{line}` does not name {path}");
    }
}

/// `[memory_limits]` in the file sets per-device limits; GPUSHIM_MEMORY_LIMIT_<i> overrides them.
#[test]
fn per_device_limits_in_the_config_file() {
    let file = scratch_path("gpushim.toml");
    std::fs::write(
        &file,
        "memory_limit = \"64MiB\"\n\n[memory_limits]\n1 = \"32MiB\"\n",
    )
    .unwrap();
    let cfg = file.to_str().unwrap();
    let cases: &[(&[(&str, &str)], [u64; 2])] = &[
        (&[("GPUSHIM_CONFIG", cfg)], [64 * MIB, 32 * MIB]),
        (
            &[("GPUSHIM_CONFIG", cfg), ("GPUSHIM_MEMORY_LIMIT_1", "16MiB")],
            [64 * MIB, 16 * MIB],
        ),
    ];
    for p in [
        Program::Driver(DriverPath::Gpa),
        Program::Runtime {
            major: 13,
            ptsz: false,
        },
    ] {
        let query = if matches!(p, Program::Driver(_)) {
            "totalmem"
        } else {
            "props"
        };
        for (env, totals) in cases {
            let out = Run::program(p)
                .env("GPUSIM_MEMORY", "1GiB")
                .envs(*env)
                .arg(query)
                .shim(true)
                .run();
            out.assert_completed();
            for (d, total) in totals.iter().enumerate() {
                assert_eq!(
                    out.u64(&format!("op1.total{d}")),
                    *total,
                    "device {d}, {env:?}\n{}",
                    out.dump()
                );
            }
            assert!(out.gpushim_lines().is_empty(), "{}", out.dump());
        }
    }
}

#[test]
fn bad_per_device_limit_in_the_config_file() {
    let file = scratch_path("gpushim.toml");
    std::fs::write(&file, "[memory_limits]\n1 = \"08x\"\n").unwrap();
    let line = fails_closed(
        Program::Driver(DriverPath::Link),
        &[("GPUSHIM_CONFIG", file.to_str().unwrap())],
    );
    assert!(line.starts_with("gpushim: "), "`{line}`");
    assert!(
        line.contains("memory_limits") && line.contains("=\"08x\": "),
        "`{line}`"
    );
}

/// A variable of the shim's namespace whose name is malformed fails closed, named escaped:
/// `GPUSHIM_MEMORY_LIMIT_` followed by bytes that are not UTF-8 (it was ignored while `_00`
/// was an error), a name with a control character, one with a `-`.
#[test]
fn malformed_variable_names_fail_closed() {
    use std::os::unix::ffi::OsStringExt;
    let cases: [(Vec<u8>, &str); 4] = [
        (b"GPUSHIM_MEMORY_LIMIT_\xff".to_vec(), "gpushim: GPUSHIM_MEMORY_LIMIT_\u{fffd}=\"1GiB\": \"\u{fffd}\" after GPUSHIM_MEMORY_LIMIT_ is not a device ordinal"),
        (b"CUDA_DEVICE_MEMORY_LIMIT_0\xc3".to_vec(), "gpushim: CUDA_DEVICE_MEMORY_LIMIT_0\u{fffd}=\"1GiB\": \"0\u{fffd}\" after CUDA_DEVICE_MEMORY_LIMIT_ is not a device ordinal"),
        (b"GPUSHIM_LOG\x1b[2J".to_vec(), "gpushim: GPUSHIM_LOG\\u{1b}[2J=\"1GiB\": the variable's name holds characters no setting has"),
        (b"GPUSHIM_MEMORY-LIMIT".to_vec(), "gpushim: GPUSHIM_MEMORY-LIMIT=\"1GiB\": the variable's name holds characters no setting has"),
    ];
    for p in [Program::Driver(DriverPath::Link), Program::Runtime { major: 12, ptsz: false }] {
        for (name, start) in &cases {
            let out = check_fails_closed(|| Run::program(p).env_os(std::ffi::OsString::from_vec(name.clone()), "1GiB"));
            assert!(out.line.starts_with(start), "{:?}: {}", String::from_utf8_lossy(name), out.line);
            assert!(!out.line.contains('\u{1b}'), "{}", out.line);
        }
    }
}
