//! The compute workloads' figures: what `compute_load` / `rt_compute` print and the busy
//! shares read from the simulator's report (`"busy"`: per physical device, the process' kernel
//! time in 10 ms buckets from `origin_ns`, CLOCK_MONOTONIC).

use std::collections::BTreeMap;

use super::RunOutput;

/// What a compute workload printed: launches per device ordinal, the CLOCK_MONOTONIC ns of its
/// first launch and the ns from then until every device was synchronised.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Load {
    pub launches: BTreeMap<u32, u64>,
    pub start_ns: u64,
    pub wall_ns: u64,
}

impl Load {
    /// Parses `device=D launches=N` lines and the `wall_ns=W start_ns=S` line of `out`.
    pub fn of(out: &RunOutput) -> Load {
        Load::parse(&out.stdout_text()).unwrap_or_else(|e| panic!("{e}\n{}", out.dump()))
    }

    pub fn parse(text: &str) -> Result<Load, String> {
        let mut launches = BTreeMap::new();
        let (mut start_ns, mut wall_ns) = (None, None);
        for line in text.lines() {
            let pairs: BTreeMap<&str, &str> = line.split_whitespace().filter_map(|w| w.split_once('=')).collect();
            let num = |k: &str| -> Result<u64, String> {
                pairs[k].parse().map_err(|_| format!("`{k}` is not a number in `{line}`"))
            };
            if pairs.contains_key("device") && pairs.contains_key("launches") {
                launches.insert(num("device")? as u32, num("launches")?);
            } else if pairs.contains_key("wall_ns") && pairs.contains_key("start_ns") {
                wall_ns = Some(num("wall_ns")?);
                start_ns = Some(num("start_ns")?);
            }
        }
        Ok(Load {
            launches,
            start_ns: start_ns.ok_or("no `start_ns=` in the output")?,
            wall_ns: wall_ns.ok_or("no `wall_ns=` in the output")?,
        })
    }

    /// Launches on device ordinal `d` (0 if it printed none).
    pub fn on(&self, d: u32) -> u64 {
        self.launches.get(&d).copied().unwrap_or(0)
    }
}

/// The `"busy"` record of physical device `device` in a simulator report, if it has one.
fn busy_record(report: &serde_json::Value, device: u32) -> Option<&serde_json::Value> {
    report
        .get("busy")?
        .as_array()?
        .iter()
        .find(|b| b.get("device").and_then(|d| d.as_u64()) == Some(device as u64))
}

/// The process' total kernel time on physical device `device` (`busy_ns`; 0 without a record).
pub fn busy_ns(report: &serde_json::Value, device: u32) -> u64 {
    busy_record(report, device)
        .and_then(|b| b.get("busy_ns"))
        .and_then(|n| n.as_u64())
        .unwrap_or(0)
}

/// The share (0.0–1.0) of `[from_ns, to_ns)` (CLOCK_MONOTONIC ns) that the process' kernels
/// kept physical device `device` busy, from the report's 10 ms buckets. A bucket the window
/// cuts is counted in proportion to the part inside the window (the time inside a bucket is
/// taken as spread evenly). A device without a record was not used: 0.0.
pub fn busy_share(report: &serde_json::Value, device: u32, from_ns: u64, to_ns: u64) -> f64 {
    assert!(to_ns > from_ns, "an empty window [{from_ns}, {to_ns})");
    let Some(b) = busy_record(report, device) else {
        return 0.0;
    };
    let field = |k: &str| {
        b.get(k)
            .and_then(|n| n.as_u64())
            .unwrap_or_else(|| panic!("busy record without a number `{k}`: {b}"))
    };
    let (origin, width) = (field("origin_ns"), field("bucket_ns"));
    assert!(width > 0, "busy record with bucket_ns 0: {b}");
    let buckets = b
        .get("buckets")
        .and_then(|v| v.as_array())
        .unwrap_or_else(|| panic!("busy record without `buckets`: {b}"));
    let mut busy = 0.0;
    for (i, ns) in buckets.iter().enumerate() {
        let ns = ns.as_u64().unwrap_or_else(|| panic!("a bucket is not a number: {b}")) as f64;
        let lo = origin + i as u64 * width;
        let hi = lo + width;
        let overlap = hi.min(to_ns).saturating_sub(lo.max(from_ns));
        busy += ns * overlap as f64 / width as f64;
    }
    busy / (to_ns - from_ns) as f64
}

/// The busy shares of consecutive windows of `window_s` seconds, the first starting `skip_s`
/// seconds after `start_ns`, as many whole windows as fit before `end_ns`.
pub fn window_shares(
    report: &serde_json::Value,
    device: u32,
    start_ns: u64,
    skip_s: f64,
    window_s: f64,
    end_ns: u64,
) -> Vec<f64> {
    let width = (window_s * 1e9) as u64;
    let mut from = start_ns + (skip_s * 1e9) as u64;
    let mut shares = vec![];
    while from + width <= end_ns {
        shares.push(busy_share(report, device, from, from + width));
        from += width;
    }
    shares
}
