//! Unit tests of the live map against a model (random operations, the table and the sharded map together).

use super::*;
use std::collections::HashMap as Model;
use std::sync::Arc;

fn live(device: usize, bytes: u64, id: u64) -> Live {
    Live { device, bytes, served: id % 3 == 0, pool: id % 5 == 0, ctx: 0, id }
}

/// An entry that does not fit a slot (kept in the mutex map), per `which`.
fn unfit(which: u64, id: u64) -> Live {
    match which % 3 {
        0 => Live { ctx: 0xC0, ..live(1, 4096, id) },
        1 => live(PACK_DEVICES, 4096, id),
        _ => live(2, PACK_BYTES, id),
    }
}

/// `insert` of a device pointer as the lane (`lane`) makes it: packed first, the general
/// `insert` where the table declines.
fn insert_packed_first(m: &LiveMap, k: u64, l: Live) -> Option<Live> {
    insert_packed_via(m, k, l, false)
}

/// `insert_packed_first`, through the lane's view of the table (`PtrTable`) if `lane` and
/// the map has one.
fn insert_packed_via(m: &LiveMap, k: u64, l: Live, lane: bool) -> Option<Live> {
    if l.ctx == 0 && !l.served {
        if let Some(p) = Packed::of(&l) {
            assert_eq!(p.live(), l);
            let packed = match m.ptr_table().filter(|_| lane) {
                Some(t) => t.insert_packed(k, p),
                None => m.insert_packed(k, p),
            };
            if let Ok(replaced) = packed {
                return replaced.map(Packed::live);
            }
        }
    }
    m.insert(Kind::DevicePtr, k, l).unwrap()
}

/// `remove` of a device pointer as the free paths make it (`State::uncounted`, `lane`).
fn remove_packed_first(m: &LiveMap, k: u64) -> Option<Live> {
    remove_packed_via(m, k, false)
}

fn remove_packed_via(m: &LiveMap, k: u64, lane: bool) -> Option<Live> {
    let packed = match m.ptr_table().filter(|_| lane) {
        Some(t) => t.remove_packed(k),
        None => m.remove_packed(k),
    };
    match packed {
        Ok(found) => found.map(Packed::live),
        Err(()) => m.remove(Kind::DevicePtr, k).unwrap(),
    }
}

#[test]
fn the_lanes_view_of_the_table_picks_the_maps_buckets() {
    for buckets in [0, 1] {
        assert!(LiveMap::with_buckets(buckets).ptr_table().is_none(), "{buckets} buckets");
    }
    for buckets in [2, 4, 64, BUCKETS] {
        let m = LiveMap::with_buckets(buckets);
        let t = m.ptr_table().unwrap();
        let mut rng = 0x9E37_79B9_7F4A_7C15u64;
        let mut used = std::collections::HashSet::new();
        for _ in 0..50_000 {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            for k in [rng, rng & !0xFFF, 0x7f00_0000_0000 + (rng & 0xFFFF_F000)] {
                let b = m.ptr_bucket(k).unwrap() as *const Bucket;
                assert!(std::ptr::eq(t.bucket(k), b), "{buckets} buckets, key {k:#x}");
                used.insert(b as usize);
            }
        }
        assert_eq!(used.len(), buckets, "every bucket picked");
    }
}

#[test]
fn packed_entries_read_as_their_fields() {
    for (device, bytes, served, pool) in [(0, 0, false, false), (PACK_DEVICES - 1, PACK_BYTES - 1, true, true), (3, 4096, false, false), (255, 1 << 40, false, true)] {
        let l = Live { device, bytes, served, pool, ctx: 0, id: 77 };
        let p = Packed::of(&l).unwrap();
        assert_eq!((p.device(), p.bytes(), p.served(), p.pool()), (device, bytes, served, pool));
        assert_eq!(p.live(), l);
    }
    let fits = Live { device: 0, bytes: 1, served: false, pool: false, ctx: 0, id: 1 };
    for unfit in [Live { device: PACK_DEVICES, ..fits }, Live { bytes: PACK_BYTES, ..fits }, Live { ctx: 1, ..fits }] {
        assert_eq!(Packed::of(&unfit), None);
    }
}

/// Each table size (none, one bucket, a few, the real one): the packed operations, falling
/// back to the general ones where they decline, agree with a model, wherever the entries
/// are (a full bucket spills into the mutex map; entries that do not fit go there).
#[test]
fn packed_operations_agree_with_the_general_ones() {
    for buckets in [0, 1, 2, BUCKETS] {
        let m = LiveMap::with_buckets(buckets);
        let mut model: Model<u64, Live> = Model::new();
        let mut rng = 0x2545_F491_4F6C_DD1Du64;
        for step in 0..40_000u64 {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            let k = 0x7f00_0000_0000 + (rng >> 40) % 48 * 0x200;
            let fresh = if rng % 11 == 0 { unfit(rng >> 8, step) } else { live((rng >> 4) as usize % 8, rng >> 24, step) };
            let lane = rng & (1 << 33) != 0;
            match rng % 8 {
                0..=2 => assert_eq!(insert_packed_via(&m, k, fresh, lane), model.insert(k, fresh), "{buckets} buckets, step {step}"),
                3 => assert_eq!(m.insert(Kind::DevicePtr, k, fresh).unwrap(), model.insert(k, fresh)),
                4..=6 => assert_eq!(remove_packed_via(&m, k, lane), model.remove(&k), "{buckets} buckets, step {step}"),
                _ => assert_eq!(m.remove(Kind::DevicePtr, k).unwrap(), model.remove(&k)),
            }
            assert_eq!(m.get(Kind::DevicePtr, k).unwrap(), model.get(&k).copied());
        }
        assert_eq!(m.len(), model.len());
        let listed: Model<u64, Live> = m.entries(Kind::DevicePtr).into_iter().collect();
        assert_eq!(listed, model);
        // a key of a bucket with spilled keys is declined by the packed removal, not missed
        if buckets == 1 {
            for i in 0..=SLOTS as u64 {
                m.insert(Kind::DevicePtr, 0x1000_0000 + i * 0x100, live(0, i, 1)).unwrap();
            }
            assert_eq!(m.remove_packed(0x2000_0000), Err(()));
            let p = Packed::of(&live(0, 1, 1)).unwrap();
            assert_eq!(m.insert_packed(0x2000_0000, p), Err(p));
        }
    }
}

#[test]
fn packing_round_trips_and_refuses_what_does_not_fit() {
    for l in [live(0, 0, 1), live(PACK_DEVICES - 1, PACK_BYTES - 1, u64::MAX), live(255, 1 << 40, 15), live(3, 4096, 0)] {
        assert_eq!(unpack(pack(&l).unwrap(), l.id), l);
    }
    for w in 0..3 {
        assert_eq!(pack(&unfit(w, 7)), None);
    }
}

#[test]
fn insert_returns_the_replaced_entry_wherever_it_was() {
    for buckets in [BUCKETS, 1, 0] {
        let m = LiveMap::with_buckets(buckets);
        let k = 0x7f00_0000_1000;
        assert_eq!(m.insert(Kind::DevicePtr, k, live(0, 10, 1)).unwrap(), None);
        assert_eq!(m.insert(Kind::DevicePtr, k, live(1, 20, 2)).unwrap(), Some(live(0, 10, 1))); // table -> table
        assert_eq!(m.insert(Kind::DevicePtr, k, unfit(0, 3)).unwrap(), Some(live(1, 20, 2))); // table -> mutex map
        assert_eq!(m.get(Kind::DevicePtr, k).unwrap(), Some(unfit(0, 3)));
        assert_eq!(m.len(), 1);
        assert_eq!(m.insert(Kind::DevicePtr, k, unfit(1, 4)).unwrap(), Some(unfit(0, 3))); // mutex map -> mutex map
        assert_eq!(m.insert(Kind::DevicePtr, k, live(2, 30, 5)).unwrap(), Some(unfit(1, 4))); // mutex map -> table
        assert_eq!(m.len(), 1);
        assert_eq!(m.get(Kind::DevicePtr, k).unwrap(), Some(live(2, 30, 5)));
        assert_eq!(m.entries(Kind::DevicePtr), vec![(k, live(2, 30, 5))]);
        assert_eq!(m.remove(Kind::DevicePtr, k).unwrap(), Some(live(2, 30, 5)));
        assert_eq!((m.remove(Kind::DevicePtr, k).unwrap(), m.get(Kind::DevicePtr, k).unwrap(), m.len()), (None, None, 0));
        if let Some(b) = m.bucket(Kind::DevicePtr, k) {
            assert_eq!((b.meta.load(SeqCst) & (BUSY | OCC_MASK | SPILLED), b.spilled.load(SeqCst)), (0, 0));
        }
    }
}

#[test]
fn remove_if_leaves_an_entry_recorded_since() {
    for (buckets, second) in [(BUCKETS, live(0, 10, 2)), (BUCKETS, unfit(2, 2)), (1, live(0, 10, 2)), (0, live(0, 10, 2))] {
        let m = LiveMap::with_buckets(buckets);
        let k = 0x7f00_0000_2000;
        let first = live(0, 10, 1);
        m.insert(Kind::DevicePtr, k, first).unwrap();
        assert_eq!(m.insert(Kind::DevicePtr, k, second).unwrap(), Some(first));
        // the same key, the same size and device: only the id differs
        assert_eq!(m.remove_if(Kind::DevicePtr, k, &first).unwrap(), None);
        assert_eq!(m.get(Kind::DevicePtr, k).unwrap(), Some(second));
        assert_eq!(m.remove_if(Kind::DevicePtr, k + 0x100, &second).unwrap(), None);
        assert_eq!(m.remove_if(Kind::DevicePtr, k, &second).unwrap(), Some(second));
        assert_eq!((m.get(Kind::DevicePtr, k).unwrap(), m.len()), (None, 0));
    }
}

#[test]
fn a_full_bucket_spills_into_the_mutex_map_and_back() {
    let m = LiveMap::with_buckets(1);
    let keys: Vec<u64> = (1..=3 * SLOTS as u64).map(|i| 0x7f00_0000_0000 + i * 0x1000).collect();
    for (i, &k) in keys.iter().enumerate() {
        assert_eq!(m.insert(Kind::DevicePtr, k, live(0, i as u64, i as u64)).unwrap(), None);
    }
    let b = &m.table[0];
    assert_eq!((m.len(), m.shards.len(), b.spilled.load(SeqCst)), (keys.len(), 2 * SLOTS, 2 * SLOTS as u64));
    let mut all = m.entries(Kind::DevicePtr);
    all.sort_by_key(|e| e.1.id);
    assert_eq!(all, keys.iter().enumerate().map(|(i, &k)| (k, live(0, i as u64, i as u64))).collect::<Vec<_>>());
    // free slots, then a spilled key comes back to the table when recorded again
    for &k in &keys[..3] {
        assert!(m.remove(Kind::DevicePtr, k).unwrap().is_some());
    }
    let last = *keys.last().unwrap();
    assert_eq!(m.insert(Kind::DevicePtr, last, live(1, 1, 1000)).unwrap(), Some(live(0, keys.len() as u64 - 1, keys.len() as u64 - 1)));
    assert_eq!((m.shards.len(), b.spilled.load(SeqCst)), (2 * SLOTS - 1, 2 * SLOTS as u64 - 1));
    for (i, &k) in keys.iter().enumerate().skip(3).take(keys.len() - 4) {
        assert_eq!(m.get(Kind::DevicePtr, k).unwrap(), Some(live(0, i as u64, i as u64)));
        assert_eq!(m.remove(Kind::DevicePtr, k).unwrap(), Some(live(0, i as u64, i as u64)));
    }
    assert_eq!(m.remove(Kind::DevicePtr, last).unwrap(), Some(live(1, 1, 1000)));
    assert_eq!((m.len(), b.spilled.load(SeqCst), b.meta.load(SeqCst) & (BUSY | OCC_MASK | SPILLED)), (0, 0, 0));
    // other kinds never use the table
    m.insert(Kind::VmmHandle, keys[0], live(0, 1, 1)).unwrap();
    assert_eq!((m.shards.len(), b.meta.load(SeqCst) & OCC_MASK), (1, 0));
}

#[test]
fn a_forked_child_starts_with_an_empty_table_even_mid_write() {
    let m = LiveMap::new();
    for i in 0..1000u64 {
        m.insert(Kind::DevicePtr, 0x7f00_0000_0000 + i * 0x200, live(0, i, i)).unwrap();
    }
    m.insert(Kind::DevicePtr, 1, unfit(0, 1)).unwrap();
    // a parent's writer was inside this bucket at the fork
    let b = m.bucket(Kind::DevicePtr, 0x7f00_0000_0000).unwrap();
    b.enter().unwrap();
    m.reset_after_fork();
    assert_eq!((m.len(), m.entries(Kind::DevicePtr).len()), (0, 0));
    assert_eq!(m.insert(Kind::DevicePtr, 0x7f00_0000_0000, live(0, 1, 1)).unwrap(), None);
    assert_eq!(m.remove(Kind::DevicePtr, 0x7f00_0000_0000).unwrap(), Some(live(0, 1, 1)));
}

/// 8 threads on small and full-size tables: each owns some keys (checked against its own
/// model after every step), all contend on shared keys (every entry ever recorded must be
/// handed back exactly once: replaced, removed, or left at the end), and some keys are
/// recorded before and never touched (always found, whatever moves around them).
#[test]
fn concurrent_writers_and_readers_agree_with_a_model() {
    const THREADS: u64 = 8;
    const STEPS: u64 = 30_000;
    for buckets in [1, 4, 64, BUCKETS] {
        let m = Arc::new(LiveMap::with_buckets(buckets));
        let fixed: Vec<(u64, Live)> = (0..16u64).map(|i| (0x5000_0000 + i * 0x100, if i % 4 == 0 { unfit(i, 1 << 40 | i) } else { live(7, i, 1 << 40 | i) })).collect();
        for &(k, l) in &fixed {
            m.insert(Kind::DevicePtr, k, l).unwrap();
        }
        let shared: Vec<u64> = (0..4u64).map(|i| 0x6000_0000 + i * 0x100).collect();
        let threads: Vec<_> = (0..THREADS)
            .map(|t| {
                let (m, fixed, shared) = (m.clone(), fixed.clone(), shared.clone());
                std::thread::spawn(move || {
                    let mut rng = 0x9E37_79B9_7F4A_7C15u64 ^ (t + 1).wrapping_mul(0xD1B5_4A32_D192_ED03);
                    let mut next = move || {
                        rng ^= rng << 13;
                        rng ^= rng >> 7;
                        rng ^= rng << 17;
                        rng
                    };
                    let mut model: Model<u64, Live> = Model::new();
                    let mut recorded = Vec::new(); // ids recorded under shared keys
                    let mut handed_back = Vec::new(); // ids handed back from shared keys
                    for step in 0..STEPS {
                        let id = (t + 1) << 32 | step;
                        let r = next();
                        let fresh = if r % 7 == 0 { unfit(r >> 8, id) } else { live((r >> 4) as usize % 8, r >> 20, id) };
                        match r % 10 {
                            0..=5 => {
                                let k = 0x7000_0000 + (t * 24 + (r >> 32) % 24) * 0x100;
                                match (r >> 12) % 4 {
                                    0 if r & (1 << 41) != 0 => assert_eq!(insert_packed_via(&m, k, fresh, r & (1 << 42) != 0), model.insert(k, fresh)),
                                    0 | 1 => assert_eq!(m.insert(Kind::DevicePtr, k, fresh).unwrap(), model.insert(k, fresh)),
                                    2 if r & (1 << 41) != 0 => assert_eq!(remove_packed_via(&m, k, r & (1 << 42) != 0), model.remove(&k)),
                                    2 => assert_eq!(m.remove(Kind::DevicePtr, k).unwrap(), model.remove(&k)),
                                    _ => {
                                        // remove_if with the current entry or a stale one
                                        let expected = if r & (1 << 40) != 0 { model.get(&k).copied().unwrap_or(fresh) } else { fresh };
                                        let want = (model.get(&k) == Some(&expected)).then(|| model.remove(&k)).flatten();
                                        assert_eq!(m.remove_if(Kind::DevicePtr, k, &expected).unwrap(), want);
                                    }
                                }
                                assert_eq!(m.get(Kind::DevicePtr, k).unwrap(), model.get(&k).copied());
                            }
                            6..=8 => {
                                let k = shared[(r >> 32) as usize % shared.len()];
                                // (an entry's fields follow from its id and key: a torn read shows)
                                let base = live((id % 8) as usize, (id ^ k) & (PACK_BYTES - 1), id);
                                let fresh = if r % 4 == 0 { Live { ctx: 0xC0, ..base } } else { base };
                                let packed = r & (1 << 41) != 0;
                                if r % 3 == 0 {
                                    handed_back.extend(if packed { remove_packed_first(&m, k) } else { m.remove(Kind::DevicePtr, k).unwrap() }.map(|l| l.id));
                                } else {
                                    recorded.push(id);
                                    handed_back.extend(if packed { insert_packed_first(&m, k, fresh) } else { m.insert(Kind::DevicePtr, k, fresh).unwrap() }.map(|l| l.id));
                                }
                                if let Some(l) = m.get(Kind::DevicePtr, k).unwrap() {
                                    assert!(l.id >> 32 >= 1 && l.id >> 32 <= THREADS, "{l:?}");
                                    assert_eq!((l.device as u64, l.bytes, l.ctx == 0 || l.ctx == 0xC0), (l.id % 8, (l.id ^ k) & (PACK_BYTES - 1), true));
                                }
                            }
                            _ => {
                                let (k, l) = fixed[(r >> 32) as usize % fixed.len()];
                                assert_eq!(m.get(Kind::DevicePtr, k).unwrap(), Some(l));
                            }
                        }
                    }
                    (model, recorded, handed_back)
                })
            })
            .collect();
        let mut all_owned = Model::new();
        let (mut recorded, mut handed_back) = (Vec::new(), Vec::new());
        for t in threads {
            let (model, r, h) = t.join().unwrap();
            all_owned.extend(model);
            recorded.extend(r);
            handed_back.extend(h);
        }
        for &k in &shared {
            handed_back.extend(m.remove(Kind::DevicePtr, k).unwrap().map(|l| l.id));
        }
        recorded.sort_unstable();
        handed_back.sort_unstable();
        assert_eq!(recorded, handed_back, "{buckets} buckets: shared keys lost or duplicated an entry");
        let mut entries: Model<u64, Live> = m.entries(Kind::DevicePtr).into_iter().collect();
        assert_eq!(entries.len(), m.len());
        for (k, l) in &fixed {
            assert_eq!(entries.remove(k), Some(*l));
        }
        assert_eq!(entries, all_owned, "{buckets} buckets");
        // the bucket counts of spilled keys are exact
        let spilled: u64 = m.table.iter().map(|b| b.spilled.load(SeqCst)).sum();
        assert_eq!(spilled as usize, m.shards.len());
        assert!(m.table.iter().all(|b| b.meta.load(SeqCst) & BUSY == 0 && (b.spilled.load(SeqCst) != 0) == (b.meta.load(SeqCst) & SPILLED != 0)));
    }
}
