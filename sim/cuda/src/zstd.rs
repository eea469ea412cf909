//! A Zstandard decoder (RFC 8878) for the compressed entries of fat binaries: frames without a
//! dictionary; every length and code read from the input is checked, so a bad input is an
//! error (`Err(())`), never a panic, an out-of-bounds read or more output than allowed.

type R<T> = Result<T, ()>;

const MAGIC: u32 = 0xFD2F_B528;
const MAX_BLOCK: usize = 128 << 10;

/// Decompresses the zstd frames in `src` (at least one; skippable frames skipped), producing at most `max_out`
/// bytes (more is an error).
pub fn decompress(src: &[u8], max_out: usize) -> R<Vec<u8>> {
    if src.is_empty() {
        return Err(());
    }
    let mut out = Vec::new();
    let mut at = 0;
    while at < src.len() {
        let magic = u32::from_le_bytes(src.get(at..at + 4).ok_or(())?.try_into().map_err(|_| ())?);
        if magic & 0xFFFF_FFF0 == 0x184D_2A50 {
            let n = u32::from_le_bytes(src.get(at + 4..at + 8).ok_or(())?.try_into().map_err(|_| ())?) as usize;
            at = at.checked_add(8).and_then(|a| a.checked_add(n)).filter(|&a| a <= src.len()).ok_or(())?;
            continue;
        }
        if magic != MAGIC {
            return Err(());
        }
        at = frame(src, at + 4, &mut out, max_out)?;
    }
    Ok(out)
}

fn byte(src: &[u8], at: usize) -> R<u8> {
    src.get(at).copied().ok_or(())
}

/// One frame from `at` (after its magic number): returns where it ends.
fn frame(src: &[u8], mut at: usize, out: &mut Vec<u8>, max_out: usize) -> R<usize> {
    let fhd = byte(src, at)?;
    at += 1;
    if fhd & 0x08 != 0 {
        return Err(()); // reserved bit
    }
    let single = fhd & 0x20 != 0;
    if !single {
        at += 1; // window descriptor
    }
    let dict = [0, 1, 2, 4][(fhd & 3) as usize];
    let mut dict_id = 0u32;
    for i in 0..dict {
        dict_id |= u32::from(byte(src, at + i)?) << (8 * i);
    }
    if dict_id != 0 {
        return Err(()); // dictionaries are not supported
    }
    at += dict;
    let fcs = match fhd >> 6 {
        0 => usize::from(single),
        1 => 2,
        2 => 4,
        _ => 8,
    };
    src.get(at..at + fcs).ok_or(())?;
    at += fcs;
    let start = out.len();
    let mut st = State { reps: [1, 4, 8], huf: None, ll: None, of: None, ml: None };
    loop {
        let h = u32::from(byte(src, at)?) | u32::from(byte(src, at + 1)?) << 8 | u32::from(byte(src, at + 2)?) << 16;
        at += 3;
        let last = h & 1 != 0;
        let size = (h >> 3) as usize;
        match (h >> 1) & 3 {
            0 => {
                let b = src.get(at..at.checked_add(size).ok_or(())?).ok_or(())?;
                grow(out, size, max_out)?;
                out.extend_from_slice(b);
                at += size;
            }
            1 => {
                let b = byte(src, at)?;
                if size > MAX_BLOCK {
                    return Err(());
                }
                grow(out, size, max_out)?;
                out.resize(out.len() + size, b);
                at += 1;
            }
            2 => {
                if size > MAX_BLOCK {
                    return Err(());
                }
                let b = src.get(at..at.checked_add(size).ok_or(())?).ok_or(())?;
                let before = out.len();
                block(b, &mut st, out, start, max_out)?;
                // (a block decompresses to at most Block_Maximum_Size, RFC 8878 3.1.1.2.3)
                if out.len() - before > MAX_BLOCK {
                    return Err(());
                }
                at += size;
            }
            _ => return Err(()),
        }
        if last {
            break;
        }
    }
    if fhd & 0x04 != 0 {
        src.get(at..at + 4).ok_or(())?;
        at += 4;
    }
    Ok(at)
}

fn grow(out: &[u8], n: usize, max_out: usize) -> R<()> {
    if out.len().checked_add(n).ok_or(())? > max_out {
        return Err(());
    }
    Ok(())
}

/// An FSE decoding table: per state (symbol, bits to read, base of the next state).
#[derive(Clone)]
struct Fse {
    log: u32,
    cells: Vec<(u8, u8, u16)>,
}

/// A Huffman decoding table: per `max_bits`-bit prefix (symbol, code length).
#[derive(Clone)]
struct Huf {
    max_bits: u32,
    cells: Vec<(u8, u8)>,
}

struct State {
    reps: [usize; 3],
    huf: Option<Huf>,
    ll: Option<Fse>,
    of: Option<Fse>,
    ml: Option<Fse>,
}

/// A bit stream read backwards (from its end, after the final byte's marker bit).
struct Back<'a> {
    b: &'a [u8],
    /// Bits left; negative once reads went past the start (those bits read as zeros).
    pos: i64,
}

impl<'a> Back<'a> {
    fn new(b: &'a [u8]) -> R<Self> {
        let last = *b.last().ok_or(())?;
        if last == 0 {
            return Err(());
        }
        Ok(Back { b, pos: b.len() as i64 * 8 - i64::from(last.leading_zeros()) - 1 })
    }

    /// `n` (≤ 32) bits ending at the current position, without consuming them.
    fn peek(&self, n: u32) -> u64 {
        if n == 0 {
            return 0;
        }
        let lo = self.pos - i64::from(n);
        if lo >= 0 {
            get(self.b, lo as usize, n)
        } else if self.pos > 0 {
            get(self.b, 0, self.pos as u32) << (-lo)
        } else {
            0
        }
    }

    fn read(&mut self, n: u32) -> u64 {
        let v = self.peek(n);
        self.pos -= i64::from(n);
        v
    }
}

/// `n` (≤ 32) bits from bit `at` of `b`, little-endian (bits past the end read as zeros).
fn get(b: &[u8], at: usize, n: u32) -> u64 {
    let mut v = 0u64;
    let first = at / 8;
    for i in 0..6 {
        v |= u64::from(b.get(first + i).copied().unwrap_or(0)) << (8 * i);
    }
    (v >> (at % 8)) & ((1u64 << n) - 1)
}

/// A table description read forward from `src`: the normalized counts; returns the table and
/// the bytes read.
fn read_fse(src: &[u8], max_log: u32, max_symbol: usize) -> R<(Fse, usize)> {
    let mut bit = 0usize;
    let take = |bit: &mut usize, n: u32| -> R<u64> {
        let v = get(src, *bit, n);
        *bit += n as usize;
        if *bit > src.len() * 8 {
            return Err(());
        }
        Ok(v)
    };
    let log = take(&mut bit, 4)? as u32 + 5;
    if log > max_log {
        return Err(());
    }
    let mut remaining: i32 = (1 << log) + 1;
    let mut threshold: i32 = 1 << log;
    let mut nbits = log + 1;
    let mut probs: Vec<i32> = Vec::new();
    let mut previous0 = false;
    while remaining > 1 {
        if previous0 {
            loop {
                let r = take(&mut bit, 2)? as usize;
                probs.extend(std::iter::repeat(0).take(r));
                if probs.len() > max_symbol + 1 {
                    return Err(());
                }
                if r != 3 {
                    break;
                }
            }
        }
        let max = (2 * threshold - 1) - remaining;
        let v = get(src, bit, nbits) as i32;
        let mut count;
        if (v & (threshold - 1)) < max {
            count = v & (threshold - 1);
            take(&mut bit, nbits - 1)?;
        } else {
            count = v & (2 * threshold - 1);
            if count >= threshold {
                count -= max;
            }
            take(&mut bit, nbits)?;
        }
        count -= 1;
        remaining -= count.abs();
        probs.push(count);
        if probs.len() > max_symbol + 1 || remaining < 1 {
            return Err(());
        }
        previous0 = count == 0;
        while remaining < threshold && nbits > 1 {
            nbits -= 1;
            threshold >>= 1;
        }
    }
    if remaining != 1 {
        return Err(());
    }
    Ok((build_fse(&probs, log)?, bit.div_ceil(8)))
}

/// The decoding table of normalized counts `probs` (-1: "less than one") of accuracy `log`.
fn build_fse(probs: &[i32], log: u32) -> R<Fse> {
    let size = 1usize << log;
    if probs.len() > 256 || probs.iter().map(|&p| if p < 0 { 1 } else { p as usize }).sum::<usize>() != size {
        return Err(());
    }
    let mut cells = vec![(0u8, 0u8, 0u16); size];
    let mut high = size - 1;
    let mut next: Vec<u32> = vec![0; probs.len()];
    for (s, &p) in probs.iter().enumerate() {
        if p == -1 {
            cells[high].0 = s as u8;
            high = high.wrapping_sub(1);
            next[s] = 1;
        } else {
            next[s] = p as u32;
        }
    }
    let step = (size >> 1) + (size >> 3) + 3;
    let mask = size - 1;
    let mut pos = 0usize;
    for (s, &p) in probs.iter().enumerate() {
        for _ in 0..p.max(0) {
            cells[pos].0 = s as u8;
            loop {
                pos = (pos + step) & mask;
                if high == usize::MAX || pos <= high {
                    break;
                }
            }
        }
    }
    if pos != 0 {
        return Err(());
    }
    for cell in cells.iter_mut() {
        let s = cell.0 as usize;
        let n = next[s];
        next[s] += 1;
        let bits = log - (31 - n.leading_zeros());
        cell.1 = bits as u8;
        cell.2 = ((n << bits) as usize - size) as u16;
    }
    Ok(Fse { log, cells })
}

fn rle_fse(symbol: u8) -> Fse {
    Fse { log: 0, cells: vec![(symbol, 0, 0)] }
}

/// The Huffman table described at the start of `src`; returns it and the bytes read.
fn read_huf(src: &[u8]) -> R<(Huf, usize)> {
    let h = byte(src, 0)? as usize;
    let mut weights: Vec<u8> = Vec::new();
    let used;
    if h >= 128 {
        let n = h - 127;
        let b = src.get(1..1 + n.div_ceil(2)).ok_or(())?;
        for i in 0..n {
            weights.push(if i % 2 == 0 { b[i / 2] >> 4 } else { b[i / 2] & 15 });
        }
        used = 1 + n.div_ceil(2);
    } else {
        let b = src.get(1..1 + h).ok_or(())?;
        let (fse, n) = read_fse(b, 6, 255)?;
        let mut bits = Back::new(b.get(n..).ok_or(())?)?;
        let mut s1 = bits.read(fse.log) as usize;
        let mut s2 = bits.read(fse.log) as usize;
        loop {
            let c = fse.cells[s1];
            weights.push(c.0);
            s1 = c.2 as usize + bits.read(u32::from(c.1)) as usize;
            if bits.pos < 0 {
                weights.push(fse.cells[s2].0);
                break;
            }
            let c = fse.cells[s2];
            weights.push(c.0);
            s2 = c.2 as usize + bits.read(u32::from(c.1)) as usize;
            if bits.pos < 0 {
                weights.push(fse.cells[s1].0);
                break;
            }
            if weights.len() > 255 {
                return Err(());
            }
        }
        if weights.len() > 255 {
            return Err(());
        }
        used = 1 + h;
    }
    let mut total: u32 = 0;
    for &w in &weights {
        if w > 11 {
            return Err(());
        }
        if w > 0 {
            total += 1 << (w - 1);
        }
    }
    if total == 0 {
        return Err(());
    }
    let max_bits = 32 - total.leading_zeros();
    if max_bits > 11 {
        return Err(());
    }
    let rest = (1u32 << max_bits) - total;
    if !rest.is_power_of_two() {
        return Err(());
    }
    weights.push((rest.trailing_zeros() + 1) as u8);
    // canonical codes: lower weights (longer codes) first
    let mut start = [0usize; 13];
    let mut count = [0usize; 13];
    for &w in &weights {
        count[w as usize] += 1;
    }
    let mut acc = 0usize;
    for w in 1..=max_bits as usize {
        start[w] = acc;
        acc += count[w] << (w - 1);
    }
    let size = 1usize << max_bits;
    if acc != size {
        return Err(());
    }
    let mut cells = vec![(0u8, 0u8); size];
    for (s, &w) in weights.iter().enumerate() {
        if w == 0 {
            continue;
        }
        let len = 1usize << (w - 1);
        let bits = (max_bits + 1 - u32::from(w)) as u8;
        for c in &mut cells[start[w as usize]..start[w as usize] + len] {
            *c = (s as u8, bits);
        }
        start[w as usize] += len;
    }
    Ok((Huf { max_bits, cells }, used))
}

/// Decodes one Huffman stream into `out` (exactly its length).
fn huf_stream(huf: &Huf, src: &[u8], out: &mut [u8]) -> R<()> {
    let mut bits = Back::new(src)?;
    for o in out.iter_mut() {
        let (s, n) = huf.cells[bits.peek(huf.max_bits) as usize];
        *o = s;
        bits.pos -= i64::from(n);
    }
    if bits.pos != 0 {
        return Err(());
    }
    Ok(())
}

/// The literals section at the start of `src`: the literals and the bytes read.
fn literals(src: &[u8], st: &mut State) -> R<(Vec<u8>, usize)> {
    let b0 = byte(src, 0)?;
    let kind = b0 & 3;
    let format = (b0 >> 2) & 3;
    if kind < 2 {
        let (regen, head) = match format {
            0 | 2 => ((b0 >> 3) as usize, 1),
            1 => ((b0 >> 4) as usize | (byte(src, 1)? as usize) << 4, 2),
            _ => ((b0 >> 4) as usize | (byte(src, 1)? as usize) << 4 | (byte(src, 2)? as usize) << 12, 3),
        };
        if regen > MAX_BLOCK {
            return Err(());
        }
        if kind == 0 {
            let b = src.get(head..head + regen).ok_or(())?;
            return Ok((b.to_vec(), head + regen));
        }
        return Ok((vec![byte(src, head)?; regen], head + 1));
    }
    let (head, bits) = match format {
        0 | 1 => (3, 10),
        2 => (4, 14),
        _ => (5, 18),
    };
    let mut v = 0u64;
    for i in 0..head {
        v |= u64::from(byte(src, i)?) << (8 * i);
    }
    let mask = (1u64 << bits) - 1;
    let regen = ((v >> 4) & mask) as usize;
    let comp = ((v >> (4 + bits)) & mask) as usize;
    if regen > MAX_BLOCK {
        return Err(());
    }
    let body = src.get(head..head.checked_add(comp).ok_or(())?).ok_or(())?;
    let mut at = 0;
    if kind == 2 {
        let (huf, n) = read_huf(body)?;
        st.huf = Some(huf);
        at = n;
    }
    let huf = st.huf.as_ref().ok_or(())?;
    let streams = body.get(at..).ok_or(())?;
    let mut lits = vec![0u8; regen];
    if format == 0 {
        huf_stream(huf, streams, &mut lits)?;
    } else {
        let jump = streams.get(0..6).ok_or(())?;
        let s1 = u16::from_le_bytes([jump[0], jump[1]]) as usize;
        let s2 = u16::from_le_bytes([jump[2], jump[3]]) as usize;
        let s3 = u16::from_le_bytes([jump[4], jump[5]]) as usize;
        let data = &streams[6..];
        let ends = [s1, s1 + s2, s1 + s2 + s3, data.len()];
        if ends[2] > data.len() {
            return Err(());
        }
        let part = regen.div_ceil(4);
        if part == 0 || part * 3 > regen {
            return Err(());
        }
        let mut from = 0;
        for (i, chunk) in lits.chunks_mut(part).enumerate() {
            let to = *ends.get(i).ok_or(())?;
            huf_stream(huf, &data[from..to], chunk)?;
            from = to;
        }
    }
    Ok((lits, head + comp))
}

const LL_BASE: [(u32, u32); 36] = [
    (0, 0), (1, 0), (2, 0), (3, 0), (4, 0), (5, 0), (6, 0), (7, 0), (8, 0), (9, 0), (10, 0), (11, 0), (12, 0), (13, 0), (14, 0), (15, 0),
    (16, 1), (18, 1), (20, 1), (22, 1), (24, 2), (28, 2), (32, 3), (40, 3), (48, 4), (64, 6), (128, 7), (256, 8), (512, 9), (1024, 10),
    (2048, 11), (4096, 12), (8192, 13), (16384, 14), (32768, 15), (65536, 16),
];
const LL_DEFAULT: [i32; 36] = [4, 3, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 2, 3, 2, 1, 1, 1, 1, 1, -1, -1, -1, -1];
const ML_DEFAULT: [i32; 53] = [
    1, 4, 3, 2, 2, 2, 2, 2, 2, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
    -1, -1, -1, -1, -1, -1, -1,
];
const OF_DEFAULT: [i32; 29] = [1, 1, 1, 1, 1, 1, 2, 2, 2, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, -1, -1, -1, -1, -1];

fn ml_base(code: u8) -> R<(u32, u32)> {
    const HIGH: [(u32, u32); 21] = [
        (35, 1), (37, 1), (39, 1), (41, 1), (43, 2), (47, 2), (51, 3), (59, 3), (67, 4), (83, 4), (99, 5), (131, 7), (259, 8), (515, 9),
        (1027, 10), (2051, 11), (4099, 12), (8195, 13), (16387, 14), (32771, 15), (65539, 16),
    ];
    match code {
        0..=31 => Ok((u32::from(code) + 3, 0)),
        _ => HIGH.get(code as usize - 32).copied().ok_or(()),
    }
}

/// A sequence table for `mode` (0 predefined, 1 RLE, 2 described, 3 the previous one).
fn table(mode: u8, src: &[u8], at: &mut usize, prev: &mut Option<Fse>, default: &[i32], default_log: u32, max_log: u32, max_symbol: usize) -> R<()> {
    match mode {
        0 => *prev = Some(build_fse(default, default_log)?),
        1 => {
            let s = byte(src, *at)?;
            if s as usize > max_symbol {
                return Err(());
            }
            *prev = Some(rle_fse(s));
            *at += 1;
        }
        2 => {
            let (t, n) = read_fse(src.get(*at..).ok_or(())?, max_log, max_symbol)?;
            *prev = Some(t);
            *at += n;
        }
        _ => {
            prev.as_ref().ok_or(())?;
        }
    }
    Ok(())
}

/// One compressed block: literals, then sequences executed onto `out` (the frame starts at `start`).
fn block(src: &[u8], st: &mut State, out: &mut Vec<u8>, start: usize, max_out: usize) -> R<()> {
    let (lits, mut at) = literals(src, st)?;
    let b0 = byte(src, at)? as usize;
    let nseq = if b0 < 128 {
        at += 1;
        b0
    } else if b0 < 255 {
        let n = ((b0 - 128) << 8) + byte(src, at + 1)? as usize;
        at += 2;
        n
    } else {
        let n = byte(src, at + 1)? as usize + ((byte(src, at + 2)? as usize) << 8) + 0x7F00;
        at += 3;
        n
    };
    if nseq == 0 {
        grow(out, lits.len(), max_out)?;
        out.extend_from_slice(&lits);
        return if at == src.len() { Ok(()) } else { Err(()) };
    }
    let modes = byte(src, at)?;
    at += 1;
    if modes & 3 != 0 {
        return Err(());
    }
    table(modes >> 6, src, &mut at, &mut st.ll, &LL_DEFAULT, 6, 9, 35)?;
    table((modes >> 4) & 3, src, &mut at, &mut st.of, &OF_DEFAULT, 5, 8, 31)?;
    table((modes >> 2) & 3, src, &mut at, &mut st.ml, &ML_DEFAULT, 6, 9, 52)?;
    let (ll, of, ml) = (st.ll.as_ref().ok_or(())?, st.of.as_ref().ok_or(())?, st.ml.as_ref().ok_or(())?);
    let mut bits = Back::new(src.get(at..).ok_or(())?)?;
    let mut sl = bits.read(ll.log) as usize;
    let mut so = bits.read(of.log) as usize;
    let mut sm = bits.read(ml.log) as usize;
    let mut lit = 0usize;
    for i in 0..nseq {
        let (lc, oc, mc) = (ll.cells[sl], of.cells[so], ml.cells[sm]);
        let (ocode, lcode, mcode) = (oc.0, lc.0, mc.0);
        if ocode > 31 {
            return Err(());
        }
        let offset_value = (1u64 << ocode) + bits.read(u32::from(ocode).min(31));
        let (mb, mx) = ml_base(mcode)?;
        let mlen = (mb as u64 + bits.read(mx)) as usize;
        let (lb, lx) = *LL_BASE.get(lcode as usize).ok_or(())?;
        let llen = (lb as u64 + bits.read(lx)) as usize;
        if i + 1 < nseq {
            sl = lc.2 as usize + bits.read(u32::from(lc.1)) as usize;
            sm = mc.2 as usize + bits.read(u32::from(mc.1)) as usize;
            so = oc.2 as usize + bits.read(u32::from(oc.1)) as usize;
        }
        if bits.pos < 0 {
            return Err(());
        }
        // repeat offsets
        let r = &mut st.reps;
        let offset = if offset_value > 3 {
            let o = (offset_value - 3) as usize;
            *r = [o, r[0], r[1]];
            o
        } else {
            match offset_value + u64::from(llen == 0) {
                1 => r[0],
                2 => {
                    *r = [r[1], r[0], r[2]];
                    r[0]
                }
                3 => {
                    *r = [r[2], r[0], r[1]];
                    r[0]
                }
                _ => {
                    let o = r[0].checked_sub(1).filter(|&o| o > 0).ok_or(())?;
                    *r = [o, r[0], r[1]];
                    o
                }
            }
        };
        let l = lits.get(lit..lit.checked_add(llen).ok_or(())?).ok_or(())?;
        grow(out, llen.checked_add(mlen).ok_or(())?, max_out)?;
        out.extend_from_slice(l);
        lit += llen;
        if offset == 0 || offset > out.len() - start {
            return Err(());
        }
        let from = out.len() - offset;
        if offset >= mlen {
            out.extend_from_within(from..from + mlen);
        } else {
            for k in 0..mlen {
                let b = out[from + k];
                out.push(b);
            }
        }
    }
    if bits.pos != 0 {
        return Err(());
    }
    let rest = &lits[lit..];
    grow(out, rest.len(), max_out)?;
    out.extend_from_slice(rest);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hostile_inputs_are_errors() {
        assert!(decompress(&[0x28, 0xb5, 0x2f], 100).is_err());
        assert!(decompress(&[0x28, 0xb5, 0x2f, 0xfd, 0x20], 100).is_err());
        // a raw block longer than the input
        assert!(decompress(&[0x28, 0xb5, 0x2f, 0xfd, 0x20, 0x00, 0x01, 0x10, 0x00], 100).is_err());
        // an RLE block larger than allowed
        assert!(decompress(&[0x28, 0xb5, 0x2f, 0xfd, 0x00, 0x00, 0x03, 0x40, 0x00, 0x41], 100).is_err());
        assert_eq!(decompress(&[0x28, 0xb5, 0x2f, 0xfd, 0x00, 0x00, 0x03, 0x40, 0x00, 0x41], 0x800).unwrap(), vec![0x41; 0x800]);
        // reserved block type
        assert!(decompress(&[0x28, 0xb5, 0x2f, 0xfd, 0x00, 0x00, 0x07, 0x00, 0x00], 100).is_err());
        // a dictionary, a reserved header bit
        assert!(decompress(&[0x28, 0xb5, 0x2f, 0xfd, 0x21, 0x00, 0x05, 0x01, 0x00, 0x00, 0x00], 100).is_err());
        assert!(decompress(&[0x28, 0xb5, 0x2f, 0xfd, 0x28, 0x00, 0x01, 0x00, 0x00], 100).is_err());
    }

    /// `zstd -19 --no-check` of "abcabcabcabcabcabcabcabc0123": raw literals, one sequence
    /// (predefined tables), a match overlapping its own output.
    const SMALL: [u8; 22] = [
        0x28, 0xb5, 0x2f, 0xfd, 0x20, 0x1c, 0x6d, 0x00, 0x00, 0x38, 0x61, 0x62, 0x63, 0x30, 0x31, 0x32, 0x33, 0x01, 0x00, 0x7e, 0x6e, 0x08,
    ];

    /// `zstd -19` of 823 bytes of words: Huffman-coded literals (FSE-compressed weights), FSE
    /// sequence tables, repeat offsets, a checksum.
    const WORDS: &str = "28b52ffd643702f5050052040e12b0b9017c57ccb448aed892520cc3025351017ae73ed763d1eabd068f243deca910681434096ce0a24bcb2fbf58e8b34cefdcc79e28180d49a8c167a4f5df2042c3a0340f11440488239220a52a28949a03d520959a0760519600f5bcb82b43cdf9fd9cfa042cead7a8c3c53cac2307238da8f44837f948161465dce9d1d10a13a52708d4ae294161209f0cc41f6775703e930e0bf298a62f3657063961dc4375106023ea5491f3509ec1984453d8a8060562b49be3de6c08431556aac9bb";

    fn words() -> Vec<u8> {
        (0..WORDS.len() / 2).map(|i| u8::from_str_radix(&WORDS[2 * i..2 * i + 2], 16).unwrap()).collect()
    }

    fn fnv(b: &[u8]) -> u64 {
        b.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &c| (h ^ u64::from(c)).wrapping_mul(0x100_0000_01b3))
    }

    #[test]
    fn frames_decode_to_the_exact_bytes() {
        assert_eq!(decompress(&SMALL, 1000).unwrap(), b"abcabcabcabcabcabcabcabc0123");
        assert!(decompress(&SMALL, 27).is_err(), "more than allowed");
        let w = words();
        let out = decompress(&w, 1 << 20).unwrap();
        assert_eq!((out.len(), fnv(&out)), (823, 0x03b6_2c1f_72c3_4bd1));
        assert!(out.starts_with(b"module stream zstd kernel launch block"));
        // two frames and a skippable one between them
        let mut two = SMALL.to_vec();
        two.extend([0x50, 0x2a, 0x4d, 0x18, 2, 0, 0, 0, 9, 9]);
        two.extend_from_slice(&SMALL);
        assert_eq!(decompress(&two, 1000).unwrap(), b"abcabcabcabcabcabcabcabc0123abcabcabcabcabcabcabcabc0123");
    }

    #[test]
    fn truncated_and_corrupted_frames_never_panic() {
        let w = words();
        for n in 0..w.len() {
            assert!(decompress(&w[..n], 1 << 20).is_err(), "truncated to {n}");
        }
        for frame in [w.clone(), SMALL.to_vec()] {
            for at in 4..frame.len() {
                for x in [0x01u8, 0x80, 0xff, 0x5a] {
                    let mut bad = frame.clone();
                    bad[at] ^= x;
                    if let Ok(out) = decompress(&bad, 1 << 16) {
                        assert!(out.len() <= 1 << 16);
                    }
                }
            }
        }
    }
}
