//! Fuzzing of every parser of user input, as a unit test that runs in CI: random bytes (ASCII,
//! multi-byte UTF-8 such as `é`, `漢`, emoji, control characters, invalid UTF-8 read lossily as
//! the shim reads the environment), and near misses made by mutating valid examples, fed to the
//! sizes and fractions (`units`), every setting's parser, the whole configuration from the
//! environment and from TOML text, device selectors, virtual-device specifications and their
//! expansion, and every form of `CUDA_VISIBLE_DEVICES` the views read (`view`). Nothing may
//! panic; where cheap, what is accepted is checked to be well-formed (a size parses again to
//! itself, a view only names existing devices, once each). Deterministic (fixed seeds).

use std::panic::{catch_unwind, AssertUnwindSafe};

use gpushim_common::config;
use crate::devices::{self, DriverDevice};
use gpushim_common::units;
use crate::devices::view::{self, Physical};

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

const PIECES: &[&str] = &[
    "0", "1", "7", "64", "08", "1.5", ".5", "0.4", "100", "1e3", "%", "40%", "GiB", "gib", "MiB", "k", "KB", "Ti", "x", "X",
    "2x", "64x", ":", ";", ",", " ", "\t", "-", "GPU-", "gpu-", "MIG-", "GPU-1011", "none", "unlimited", "0000:", "3b:00.0",
    "é", "漢字", "🚀", "\u{0}", "\u{7f}", "\u{feff}", "\u{10ffff}", "\\", "\"", "'", "=", "[", "]", "#", "\n", "18446744073709551616",
    "99999999999999999999", "-1", "+1", "NaN", "inf", "0x10", "GPU-é", "0,1,GPUé",
];

const VALID: &[&str] = &[
    "4GiB", "40%", "0.4", "1.5GiB", "unlimited", "0", "0,1", "1,0", "GPU-1011", "0000:3b:00.0", "none", "0:2x8GiB",
    "0:1GiB,2GiB;1:4x1GiB", "GPU-10111213-1415-1617-1819-1a1b1c1d1e1f", "grow", "preallocate", "info", "stderr",
    "/tmp/r.json", "team-a",
];

/// A random string: pieces, random chars, and lossily read random bytes, or a mutated example.
fn input(r: &mut Rng) -> String {
    let mut s = String::new();
    if r.below(3) == 0 {
        s.push_str(VALID[r.below(VALID.len())]);
        let at = r.below(s.len() + 1);
        let at = (0..=at).rev().find(|&i| s.is_char_boundary(i)).unwrap_or(0);
        match r.below(3) {
            0 => s.insert_str(at, PIECES[r.below(PIECES.len())]),
            1 => s.truncate(at),
            _ => s.push_str(PIECES[r.below(PIECES.len())]),
        }
        return s;
    }
    for _ in 0..r.below(8) {
        match r.below(4) {
            0 | 1 => s.push_str(PIECES[r.below(PIECES.len())]),
            2 => s.push(char::from_u32(r.below(0x11000) as u32).unwrap_or('\u{fffd}')),
            _ => {
                let bytes: Vec<u8> = (0..r.below(6)).map(|_| r.next() as u8).collect();
                s.push_str(&String::from_utf8_lossy(&bytes));
            }
        }
    }
    s
}

fn inventory(n: usize) -> Vec<Physical> {
    (0..n)
        .map(|i| Physical { uuid: format!("GPU-{:02x}111213-1415-1617-1819-1a1b1c1d1e1f", 0x10 + i * 0x10), pci: format!("0000:{:02x}:00.0", 0x3b + i), total: 16 << 30 })
        .collect()
}

fn no_panic(what: &str, input: &str, f: impl FnOnce()) {
    if catch_unwind(AssertUnwindSafe(f)).is_err() {
        panic!("{what} panicked on {input:?}");
    }
}

#[test]
fn every_parser_survives_random_input() {
    // (panics are caught and reported with the input; the default hook would print each one)
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let inv = inventory(4);
    let drv: Vec<DriverDevice> = inv.iter().map(|p| DriverDevice { uuid: p.uuid.clone(), pci: p.pci.clone(), total: p.total }).collect();
    let mut r = Rng(0x9E37_79B9_7F4A_7C15);
    for _ in 0..20_000 {
        let a = input(&mut r);
        let b = input(&mut r);
        no_panic("units", &a, || {
            if let Ok(n) = units::parse_size(&a) {
                assert_eq!(units::parse_size(&units::format_size(n)).ok(), Some(n), "{a:?} -> {n} does not read back");
            }
            let _ = units::parse_limit(&a);
        });
        no_panic("setting parsers", &a, || {
            let _ = config::parse_disable(&a);
            let _ = config::parse_log_level(&a);
            let _ = config::parse_memory_mode(&a);
            let _ = config::parse_report(&a);
            let _ = config::parse_shared_quota(&a);
            let _ = config::parse_selector(&a);
            let _ = config::parse_visible_devices(&a);
            if let Ok(splits) = config::parse_virtual_devices(&a) {
                if let Ok(d) = devices::expand(&splits, &drv) {
                    assert!(d.list.len() <= crate::devices::MAX_DEVICES);
                }
            }
        });
        no_panic("CUDA_VISIBLE_DEVICES", &a, || {
            let v = view::driver_view(Some(&a), &inv);
            let mut seen = v.devices.clone();
            seen.sort_unstable();
            seen.dedup();
            assert!(seen.len() == v.devices.len() && seen.iter().all(|&d| d < inv.len()), "{a:?} -> {:?}", v.devices);
            let _ = view::narrow(&a, &b);
            let _ = view::narrow(&b, &a);
            if let Ok(sel) = config::parse_visible_devices(&b) {
                let _ = view::select(&sel, Some(&a), &inv);
                let _ = view::select_without_inventory(&sel, Some(&a));
            }
        });
        no_panic("the load-time view", &a, || {
            let env = |name: &str| match name {
                "GPUSHIM_VISIBLE_DEVICES" => Some(b.clone()),
                "CUDA_VISIBLE_DEVICES" => Some(a.clone()),
                _ => None,
            };
            let _ = view::load_time_changes(env);
            let _ = view::pending(env);
        });
        no_panic("the environment", &a, || {
            let names: Vec<String> = ["GPUSHIM_MEMORY_LIMIT", "GPUSHIM_VISIBLE_DEVICES", "GPUSHIM_VIRTUAL_DEVICES", "GPUSHIM_MEMORY_MODE", "GPUSHIM_LOG", "GPUSHIM_MEMORY_LIMIT_1", "GPUSHIM_MEMORY_LIMIT_é", "CUDA_DEVICE_MEMORY_LIMIT_0", "GPUSHIM_SHARED_QUOTA", "GPUSHIM_REPORT"]
                .iter()
                .map(|s| s.to_string())
                .collect();
            let pick = r.0 as usize % names.len();
            let env = |name: &str| (name == names[pick] || name == names[(pick + 3) % names.len()]).then(|| a.clone());
            let _ = config::load_from(&env, &names);
        });
    }
    // (the config files' directory, removed at the end, the test passed or not)
    struct RemoveOnDrop(std::path::PathBuf);
    impl Drop for RemoveOnDrop {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
    let dir = RemoveOnDrop(std::env::temp_dir().join(format!("gpushim-fuzz-{}", std::process::id())));
    for _ in 0..3_000 {
        let a = input(&mut r);
        let key = ["memory_limit", "visible_devices", "virtual_devices", "memory_mode", "log", "memory_limits", "shared_quota", "report", "disable"][r.below(9)];
        let texts = [format!("{key} = {a:?}\n"), format!("{key} = {a}\n"), format!("[{key}]\n\"{a}\" = \"{a}\"\n"), a.clone()];
        for text in texts {
            no_panic("the config file", &text, || {
                let _ = std::fs::create_dir_all(&dir.0);
                let path = dir.0.join("c.toml");
                std::fs::write(&path, &text).unwrap();
                let p = path.to_string_lossy().into_owned();
                let env = |name: &str| (name == "GPUSHIM_CONFIG").then(|| p.clone());
                let _ = config::load_from(&env, &[]);
            });
        }
    }
    std::panic::set_hook(hook);
}
