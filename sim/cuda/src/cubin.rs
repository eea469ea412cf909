//! Machine code in fat binaries: compressed entries (LZ4 blocks, zstd frames) decompressed,
//! and the kernels of a cubin (an ELF image) read, with their parameter layout; every length
//! read from an image is checked, so a bad image is an error, never a panic.

use crate::kernels::Entry;

type R<T> = Result<T, ()>;

/// Decompresses an LZ4 *block* (no frame header) producing exactly `size` bytes.
pub fn lz4_block(src: &[u8], size: usize) -> R<Vec<u8>> {
    let mut out: Vec<u8> = Vec::with_capacity(size.min(1 << 26));
    let mut at = 0usize;
    let next = |at: &mut usize| -> R<u8> {
        let b = *src.get(*at).ok_or(())?;
        *at += 1;
        Ok(b)
    };
    let length = |at: &mut usize, mut n: usize| -> R<usize> {
        if n == 15 {
            loop {
                let b = *src.get(*at).ok_or(())?;
                *at += 1;
                n = n.checked_add(b as usize).ok_or(())?;
                if b != 255 {
                    break;
                }
            }
        }
        Ok(n)
    };
    loop {
        let token = next(&mut at)?;
        let lits = length(&mut at, (token >> 4) as usize)?;
        let l = src.get(at..at.checked_add(lits).ok_or(())?).ok_or(())?;
        if out.len() + lits > size {
            return Err(());
        }
        out.extend_from_slice(l);
        at += lits;
        if at == src.len() {
            break; // the last sequence: literals only
        }
        let offset = usize::from(next(&mut at)?) | usize::from(next(&mut at)?) << 8;
        let mlen = length(&mut at, (token & 15) as usize)?.checked_add(4).ok_or(())?;
        if offset == 0 || offset > out.len() || out.len() + mlen > size {
            return Err(());
        }
        let from = out.len() - offset;
        for k in 0..mlen {
            let b = out[from + k];
            out.push(b);
        }
    }
    if out.len() != size {
        return Err(());
    }
    Ok(out)
}

fn rd<const N: usize>(b: &[u8], at: usize) -> R<[u8; N]> {
    b.get(at..at.checked_add(N).ok_or(())?).ok_or(())?.try_into().map_err(|_| ())
}
fn u16_at(b: &[u8], at: usize) -> R<usize> {
    Ok(u16::from_le_bytes(rd(b, at)?) as usize)
}
fn u32_at(b: &[u8], at: usize) -> R<usize> {
    Ok(u32::from_le_bytes(rd(b, at)?) as usize)
}
fn u64_at(b: &[u8], at: usize) -> R<usize> {
    usize::try_from(u64::from_le_bytes(rd(b, at)?)).map_err(|_| ())
}

/// A NUL-terminated name at `at` of `b`.
fn name_at(b: &[u8], at: usize) -> R<&[u8]> {
    let rest = b.get(at..).ok_or(())?;
    let end = rest.iter().position(|&c| c == 0).ok_or(())?;
    Ok(&rest[..end])
}

/// Whether `b` is an ELF image (a cubin's start).
pub fn is_elf(b: &[u8]) -> bool {
    b.starts_with(b"\x7fELF")
}

const SHT_SYMTAB: usize = 2;
const STT_FUNC: u8 = 2;
/// `st_other` flag of a CUDA kernel (an entry point).
const STO_CUDA_ENTRY: u8 = 0x10;
/// `.nv.info.<kernel>` attribute: one kernel parameter (ordinal, offset, size).
const EIATTR_KPARAM_INFO: u8 = 0x17;
const EIFMT_SVAL: u8 = 4;

/// The kernels of a 64-bit little-endian cubin: defined `STT_FUNC` symbols marked as entries
/// (or with a `.nv.info.<name>` section), parameters from `EIATTR_KPARAM_INFO`.
pub fn elf_kernels(b: &[u8]) -> R<Vec<Entry>> {
    if !is_elf(b) || rd::<1>(b, 4)? != [2] || rd::<1>(b, 5)? != [1] {
        return Err(()); // ELFCLASS64, little-endian
    }
    let shoff = u64_at(b, 0x28)?;
    let shentsize = u16_at(b, 0x3a)?;
    let shnum = u16_at(b, 0x3c)?;
    let shstrndx = u16_at(b, 0x3e)?;
    if shentsize < 64 {
        return Err(());
    }
    // (name, type, offset, size, link) per section, each checked against the image
    let mut sections = Vec::with_capacity(shnum);
    for i in 0..shnum {
        let h = shoff.checked_add(i.checked_mul(shentsize).ok_or(())?).ok_or(())?;
        let (name, kind) = (u32_at(b, h)?, u32_at(b, h + 4)?);
        let (off, size, link) = (u64_at(b, h + 24)?, u64_at(b, h + 32)?, u32_at(b, h + 40)?);
        let nobits = kind == 8;
        if !nobits {
            b.get(off..off.checked_add(size).ok_or(())?).ok_or(())?;
        }
        sections.push((name, kind, off, if nobits { 0 } else { size }, link));
    }
    let strtab = |i: usize| -> R<&[u8]> {
        let &(_, _, off, size, _) = sections.get(i).ok_or(())?;
        Ok(&b[off..off + size])
    };
    let shstr = strtab(shstrndx)?;
    let mut info: std::collections::HashMap<&[u8], &[u8]> = std::collections::HashMap::new();
    for &(name, _, off, size, _) in &sections {
        if let Some(k) = name_at(shstr, name)?.strip_prefix(b".nv.info.") {
            info.insert(k, &b[off..off + size]);
        }
    }
    let mut entries: Vec<Entry> = Vec::new();
    for &(_, kind, off, size, link) in &sections {
        if kind != SHT_SYMTAB {
            continue;
        }
        let names = strtab(link)?;
        for s in b[off..off + size].chunks_exact(24) {
            let (name, st_info, other, shndx) = (u32_at(s, 0)?, s[4], s[5], u16_at(s, 6)?);
            if st_info & 15 != STT_FUNC || shndx == 0 {
                continue;
            }
            let name = name_at(names, name)?;
            let nv_info = info.get(name).copied();
            if other & STO_CUDA_ENTRY == 0 && nv_info.is_none() {
                continue;
            }
            let name = String::from_utf8_lossy(name).into_owned();
            if !entries.iter().any(|e| e.name == name) {
                entries.push(Entry { params: nv_info.map(kparams).transpose()?.unwrap_or_default(), name });
            }
        }
    }
    Ok(entries)
}

/// The parameters (offset, size) of a kernel's `.nv.info.<name>` attributes, by ordinal.
fn kparams(info: &[u8]) -> R<Vec<(usize, usize)>> {
    let mut params: Vec<(usize, usize, usize)> = Vec::new();
    let mut at = 0;
    while at < info.len() {
        let (format, attr, value) = (*info.get(at).ok_or(())?, *info.get(at + 1).ok_or(())?, u16_at(info, at + 2)?);
        at += 4;
        if format == EIFMT_SVAL {
            let data = info.get(at..at + value).ok_or(())?;
            if attr == EIATTR_KPARAM_INFO {
                // { index: u32, ordinal: u16, offset: u16, flags and size (bits 18..32): u32 }
                let (ordinal, offset, packed) = (u16_at(data, 4)?, u16_at(data, 6)?, u32_at(data, 8)?);
                params.push((ordinal, offset, (packed >> 18) & 0x3fff));
            }
            at += value;
        }
    }
    params.sort();
    Ok(params.into_iter().map(|(_, o, s)| (o, s)).collect())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::kernels::{bytes_entries, fatbin_entries, FATBIN_MAGIC};
    use crate::types::*;

    #[test]
    fn lz4_blocks_decode_exactly_and_refuse_bad_ones() {
        // "abcabcabcabcX": 3 literals, a match of 9 at offset 3, then 1 literal
        let block = [0x35, b'a', b'b', b'c', 3, 0, 0x10, b'X'];
        assert_eq!(lz4_block(&block, 13).unwrap(), b"abcabcabcabcX");
        // an extended literal length (15 + 5 = 20)
        let mut long = vec![0xF0, 5];
        long.extend_from_slice(&[b'z'; 20]);
        assert_eq!(lz4_block(&long, 20).unwrap(), vec![b'z'; 20]);
        assert!(lz4_block(&block, 12).is_err(), "more than announced");
        assert!(lz4_block(&block, 14).is_err(), "less than announced");
        assert!(lz4_block(&block[..5], 13).is_err(), "truncated offset");
        assert!(lz4_block(&block[..3], 13).is_err(), "truncated literals");
        assert!(lz4_block(&[0x35, b'a', b'b', b'c', 4, 0, 0x10, b'X'], 13).is_err(), "offset before the start");
        assert!(lz4_block(&[0x35, b'a', b'b', b'c', 0, 0, 0x10, b'X'], 13).is_err(), "offset 0");
        assert!(lz4_block(&[0xF0, 255, 255, 255], 100).is_err(), "a length running off the end");
        assert!(lz4_block(&[], 0).is_err());
    }

    /// A minimal cubin: a kernel `k` (an entry) with two parameters, a device function `f`, an
    /// undefined `vprintf`.
    pub fn tiny_cubin() -> Vec<u8> {
        let shstr = b"\0.shstrtab\0.strtab\0.symtab\0.nv.info.k\0.text.k\0".to_vec();
        let strtab = b"\0k\0f\0vprintf\0".to_vec();
        let mut symtab = vec![0u8; 24];
        for (name, other, shndx) in [(1u32, 0x10u8, 5u16), (3, 0, 5), (5, 0, 0)] {
            let mut s = vec![0u8; 24];
            s[0..4].copy_from_slice(&name.to_le_bytes());
            s[4] = 0x12; // GLOBAL FUNC
            s[5] = other;
            s[6..8].copy_from_slice(&shndx.to_le_bytes());
            symtab.extend(s);
        }
        let mut info = Vec::new();
        for (ordinal, offset, size) in [(1u16, 8u16, 4u32), (0, 0, 8)] {
            info.extend([4, 0x17, 12, 0]);
            info.extend(0u32.to_le_bytes());
            info.extend(ordinal.to_le_bytes());
            info.extend(offset.to_le_bytes());
            info.extend(((size << 18) | 0xf000).to_le_bytes());
        }
        info.extend([1, 0x04, 0, 0]); // an attribute without a value
        let text = vec![0u8; 16];
        let mut b = vec![0u8; 64];
        let mut offs = Vec::new();
        for part in [&shstr, &strtab, &symtab, &info, &text] {
            offs.push((b.len(), part.len()));
            b.extend_from_slice(part);
        }
        let shoff = b.len();
        b.extend(vec![0u8; 64]); // the null section
        // (name offset in shstr, type, index in offs, link)
        for (name, kind, i, link) in [(1u32, 3u32, 0usize, 0u32), (11, 3, 1, 0), (19, 2, 2, 2), (27, 0x7000_0000, 3, 3), (38, 1, 4, 0)] {
            let mut h = vec![0u8; 64];
            h[0..4].copy_from_slice(&name.to_le_bytes());
            h[4..8].copy_from_slice(&kind.to_le_bytes());
            h[24..32].copy_from_slice(&(offs[i].0 as u64).to_le_bytes());
            h[32..40].copy_from_slice(&(offs[i].1 as u64).to_le_bytes());
            h[40..44].copy_from_slice(&link.to_le_bytes());
            b.extend(h);
        }
        b[0..4].copy_from_slice(b"\x7fELF");
        b[4] = 2;
        b[5] = 1;
        b[0x28..0x30].copy_from_slice(&(shoff as u64).to_le_bytes());
        b[0x3a..0x3c].copy_from_slice(&64u16.to_le_bytes());
        b[0x3c..0x3e].copy_from_slice(&6u16.to_le_bytes());
        b[0x3e..0x40].copy_from_slice(&1u16.to_le_bytes());
        b
    }

    #[test]
    fn kernels_are_read_from_a_cubin() {
        let b = tiny_cubin();
        assert_eq!(elf_kernels(&b).unwrap(), vec![Entry { name: "k".into(), params: vec![(0, 8), (8, 4)] }]);
        // every truncation is an error or a subset, never a panic
        for n in 0..b.len() {
            let _ = elf_kernels(&b[..n]);
        }
        // hostile header values
        for (at, v) in [(0x28usize, 0xFFu8), (0x3c, 0xFF), (0x3e, 0x40), (0x3a, 8)] {
            let mut bad = b.clone();
            bad[at] = v;
            bad[at + 1] = 0xFF;
            assert!(elf_kernels(&bad).is_err(), "byte {at:#x}");
        }
        // every single-byte corruption: no panic
        for at in 0..b.len() {
            let mut bad = b.clone();
            bad[at] ^= 0xA5;
            let _ = elf_kernels(&bad);
        }
    }

    /// A fat binary container of `(kind, arch, flags, uncompressed size, payload)` entries.
    fn fatbin(entries: &[(u16, u32, u64, usize, Vec<u8>)]) -> Vec<u8> {
        let mut body = Vec::new();
        for (kind, arch, flags, size, payload) in entries {
            let mut h = vec![0u8; 64];
            h[0..2].copy_from_slice(&kind.to_le_bytes());
            h[4..8].copy_from_slice(&64u32.to_le_bytes());
            h[8..16].copy_from_slice(&(payload.len() as u64).to_le_bytes());
            h[16..20].copy_from_slice(&(payload.len() as u32).to_le_bytes());
            h[28..32].copy_from_slice(&arch.to_le_bytes());
            h[40..48].copy_from_slice(&flags.to_le_bytes());
            h[56..64].copy_from_slice(&(*size as u64).to_le_bytes());
            body.extend(h);
            body.extend(payload);
        }
        let mut b = Vec::new();
        b.extend(FATBIN_MAGIC.to_le_bytes());
        b.extend([1, 0, 16, 0]);
        b.extend((body.len() as u64).to_le_bytes());
        b.extend(body);
        b
    }

    #[test]
    fn cubins_are_read_from_fat_binaries_compressed_or_not() {
        let cubin = tiny_cubin();
        let k = vec![Entry { name: "k".into(), params: vec![(0, 8), (8, 4)] }];
        // a zstd frame of one raw block; an LZ4 block of literals only
        let mut zstd = vec![0x28, 0xb5, 0x2f, 0xfd, 0x00, 0x00];
        zstd.extend((((cubin.len() as u32) << 3) | 1).to_le_bytes()[..3].iter());
        zstd.extend(&cubin);
        let mut lz4 = vec![0xF0];
        let mut n = cubin.len() - 15;
        while n >= 255 {
            lz4.push(255);
            n -= 255;
        }
        lz4.push(n as u8);
        lz4.extend(&cubin);
        let len = cubin.len();
        assert_eq!(fatbin_entries(&fatbin(&[(2, 90, 0x11, len, cubin.clone())])), Ok(k.clone()));
        assert_eq!(fatbin_entries(&fatbin(&[(2, 80, 0x11, len, cubin.clone()), (2, 90, 0x8011, len, zstd.clone())])), Ok(k.clone()));
        assert_eq!(fatbin_entries(&fatbin(&[(2, 90, 0x2011, len, lz4.clone())])), Ok(k.clone()));
        assert_eq!(bytes_entries(&cubin), Ok(k.clone()));
        // machine code for other GPUs only: none for this one (sm_80 is older, sm_100 newer)
        assert_eq!(fatbin_entries(&fatbin(&[(2, 80, 0x11, len, cubin.clone()), (2, 100, 0x11, len, cubin.clone())])), Err(CUDA_ERROR_NO_BINARY_FOR_GPU));
        // a PTX entry is the fallback
        let ptx = b".version 8.0\n.target sm_80\n.visible .entry p()\n{ ret; }\n\0".to_vec();
        let plen = ptx.len();
        assert_eq!(fatbin_entries(&fatbin(&[(2, 80, 0x11, len, cubin.clone()), (1, 80, 0x11, plen, ptx)])).map(|e| e[0].name.clone()), Ok("p".into()));
        // a wrong uncompressed size, a corrupted stream, a cut cubin: an invalid image
        for entry in [(2u16, 90u32, 0x8011u64, len - 1, zstd.clone()), (2, 90, 0x2011, len + 1, lz4.clone()), (2, 90, 0x8011, len, zstd[..zstd.len() / 2].to_vec()), (2, 90, 0x11, 40, cubin[..40].to_vec())] {
            assert_eq!(fatbin_entries(&fatbin(&[entry])), Err(CUDA_ERROR_INVALID_IMAGE));
        }
        // every byte corrupted in turn: never a panic
        let whole = fatbin(&[(2, 90, 0x8011, len, zstd.clone()), (2, 90, 0x2011, len, lz4.clone())]);
        for at in 0..whole.len() {
            let mut bad = whole.clone();
            bad[at] ^= 0xA5;
            let _ = fatbin_entries(&bad);
        }
    }
}
