//! The node-wide record of recent GPU busy time per process (the time region of the simulated
//! driver's node state file, `GPUSIM_NODE_STATE`): its layout, how the driver adds a kernel's
//! busy time to it, and how `sim/nvml` reads utilisation figures from it.
//!
//! Per physical device `d` (up to 16), at [`DEV_OFF`]`(d)` in the node state file:
//!
//! | offset | what |
//! |---|---|
//! | 0..64 | reserved |
//! | 64 + [`ENTRY_SIZE`]·e | process entry `e` (16 of them): pid (u64, 0 = free), last epoch written (u64), then [`NBUCKETS`] buckets (u64 each) |
//!
//! A bucket covers [`BUCKET_NS`] (100 ms) of CLOCK_MONOTONIC time: epoch `k` (stored `k + 1`,
//! so that 0 means empty) covers `[k·100ms, (k+1)·100ms)` and lives in bucket `k % 64`. Each
//! bucket word packs `(epoch + 1) << 32 | busy ns of that process in it` and is updated by
//! compare-and-swap, so no lock is needed: a bucket holding an older epoch is replaced, one
//! holding a newer epoch (the ring has wrapped) is left alone. A kernel's busy time is recorded
//! when it starts (its end is known then), split across the buckets it spans; the part more
//! than [`FUTURE_BUCKETS`] buckets (4.3 s) ahead is not recorded.
//!
//! Readers take "the last second" as the 10 complete buckets before the current one.

/// Where the time region starts in the node state file (after the memory slots).
pub const TIME_OFF: usize = 1024 + 256 * 256;
pub const NBUCKETS: usize = 64;
pub const BUCKET_NS: u64 = 100_000_000;
/// Buckets of the future a writer may fill (the rest of the ring holds the past 2 s).
pub const FUTURE_BUCKETS: u64 = 43;
/// Buckets making up "the last second".
pub const WINDOW_BUCKETS: u64 = 10;
pub const NPIDS: usize = 16;
pub const ENTRY_SIZE: usize = 16 + 8 * NBUCKETS;
pub const DEV_HEADER: usize = 64;
pub const DEV_SIZE: usize = DEV_HEADER + NPIDS * ENTRY_SIZE;
pub const MAX_DEVICES: usize = 16;
/// Bytes of the time region.
pub const TIME_SIZE: usize = MAX_DEVICES * DEV_SIZE;

/// Offset of device `d`'s block in the node state file.
pub const fn dev_off(d: usize) -> usize {
    TIME_OFF + d * DEV_SIZE
}

pub fn epoch(ns: u64) -> u64 {
    ns / BUCKET_NS
}

pub fn pack(epoch: u64, ns: u64) -> u64 {
    ((epoch + 1) << 32) | ns.min(u32::MAX as u64)
}

/// `(epoch, ns)` of a bucket word, `None` if empty.
pub fn unpack(w: u64) -> Option<(u64, u64)> {
    let e = w >> 32;
    (e != 0).then(|| (e - 1, w & 0xffff_ffff))
}

/// The pieces of `[start, end)` per bucket: `(epoch, ns)`, at most those up to
/// `epoch(now) + FUTURE_BUCKETS`.
pub fn split(start: u64, end: u64, now: u64) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    let last = epoch(now) + FUTURE_BUCKETS;
    let mut t = start;
    while t < end {
        let e = epoch(t);
        if e > last {
            break;
        }
        let b_end = (e + 1) * BUCKET_NS;
        let piece_end = end.min(b_end);
        out.push((e, piece_end - t));
        t = piece_end;
    }
    out
}

/// The new value of a bucket word when `ns` of epoch `e` is added; `None` when the bucket
/// holds a newer epoch (drop).
pub fn add(word: u64, e: u64, ns: u64) -> Option<u64> {
    match unpack(word) {
        Some((we, wn)) if we == e => Some(pack(e, wn + ns)),
        Some((we, _)) if we > e => None,
        _ => Some(pack(e, ns)),
    }
}

/// Busy ns in the last second (the [`WINDOW_BUCKETS`] complete buckets before `now`'s) of one
/// process entry's bucket words.
pub fn window_ns(buckets: impl IntoIterator<Item = u64>, now: u64) -> u64 {
    let cur = epoch(now);
    let first = cur.saturating_sub(WINDOW_BUCKETS);
    buckets
        .into_iter()
        .filter_map(unpack)
        .filter(|&(e, _)| e >= first && e < cur)
        .map(|(_, n)| n.min(BUCKET_NS))
        .sum()
}

/// Utilisation of one device from its block (`DEV_SIZE` bytes, little-endian) at `now`:
/// the device's % of the last second (all processes, capped at 100) and, per process with busy
/// time in it, `(pid, %)`.
pub fn utilisation(block: &[u8], now: u64) -> (u32, Vec<(u32, u32)>) {
    let word = |off: usize| -> u64 {
        block
            .get(off..off + 8)
            .map(|b| u64::from_le_bytes(b.try_into().unwrap_or([0; 8])))
            .unwrap_or(0)
    };
    let window = WINDOW_BUCKETS * BUCKET_NS;
    let mut total = 0u64;
    let mut procs: Vec<(u32, u64)> = Vec::new();
    for e in 0..NPIDS {
        let at = DEV_HEADER + e * ENTRY_SIZE;
        let pid = word(at);
        if pid == 0 {
            continue;
        }
        let ns = window_ns((0..NBUCKETS).map(|b| word(at + 16 + 8 * b)), now);
        if ns == 0 {
            continue;
        }
        total += ns;
        match procs.iter_mut().find(|(p, _)| *p as u64 == pid) {
            Some(p) => p.1 += ns,
            None => procs.push((pid as u32, ns)),
        }
    }
    let pct = |ns: u64| ((ns.min(window) * 100 + window / 2) / window) as u32;
    (pct(total), procs.into_iter().map(|(p, n)| (p, pct(n))).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_and_window() {
        let b = BUCKET_NS;
        assert_eq!(split(5 * b + 10, 7 * b + 5, 5 * b), vec![(5, b - 10), (6, b), (7, 5)]);
        // far future dropped
        assert_eq!(split(100 * b, 101 * b, 0), vec![]);
        let w = pack(3, 40);
        assert_eq!(unpack(w), Some((3, 40)));
        assert_eq!(add(w, 3, 2), Some(pack(3, 42)));
        assert_eq!(add(w, 4, 2), Some(pack(4, 2)));
        assert_eq!(add(w, 2, 2), None);
        assert_eq!(add(0, 2, 2), Some(pack(2, 2)));
        // window: buckets 10..20 when now is in bucket 20
        let words = [pack(9, 50), pack(10, 7), pack(19, 3), pack(20, 1000)];
        assert_eq!(window_ns(words, 20 * b + 1), 10);
    }

    #[test]
    fn utilisation_of_a_block() {
        let mut block = vec![0u8; DEV_SIZE];
        let mut put = |off: usize, v: u64| block[off..off + 8].copy_from_slice(&v.to_le_bytes());
        let b = BUCKET_NS;
        // pid 7: 5 full buckets of the last 10 -> 50 %; pid 9: 1 bucket -> 10 %
        put(DEV_HEADER, 7);
        for k in 0..5 {
            put(DEV_HEADER + 16 + 8 * ((15 + k) as usize % NBUCKETS), pack(15 + k, b));
        }
        put(DEV_HEADER + ENTRY_SIZE, 9);
        put(DEV_HEADER + ENTRY_SIZE + 16 + 8 * 12, pack(12, b));
        let (gpu, procs) = utilisation(&block, 20 * b + 5);
        assert_eq!(gpu, 60);
        assert_eq!(procs, vec![(7, 50), (9, 10)]);
        assert_eq!(utilisation(&block, 40 * b).0, 0);
    }
}
