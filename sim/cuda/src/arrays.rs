//! CUDA arrays and mipmapped arrays: accounting only (no storage behind them).
//!
//! Bytes of an array = W × max(H,1) × max(D,1) × NumChannels × element size, where the element
//! size of `CUarray_format` is 1 for 0x01/0x08, 2 for 0x02/0x09/0x10, 4 for 0x03/0x0a/0x20 and
//! 4 for any other format. A mipmapped array counts the sum over its levels `l` of
//! max(1,W>>l) × max(1,H>>l) × D', D' = D for layered (0x01) or cubemap (0x04) arrays, else
//! max(1,D>>l); each level is an array handle owned by the mipmapped array (not counted twice).

use crate::context::{self, Ctx};
use crate::stats;
use crate::types::*;
use std::collections::HashSet;
use std::sync::{Mutex, OnceLock};

pub struct Array {
    pub desc: CUDA_ARRAY3D_DESCRIPTOR,
    pub bytes: u64,
    pub physical: usize,
    /// The creating context's address (`cuCtxDestroy` of it destroys the array).
    pub ctx: usize,
    /// Level of a mipmapped array (not destroyable on its own, not counted on its own).
    pub is_level: bool,
}

pub struct Mipmapped {
    pub bytes: u64,
    pub physical: usize,
    /// The creating context's address.
    pub ctx: usize,
    pub levels: Vec<usize>,
}

static ARRAYS: OnceLock<Mutex<HashSet<usize>>> = OnceLock::new();
static MIPMAPS: OnceLock<Mutex<HashSet<usize>>> = OnceLock::new();

fn set(
    s: &'static OnceLock<Mutex<HashSet<usize>>>,
) -> std::sync::MutexGuard<'static, HashSet<usize>> {
    s.get_or_init(|| Mutex::new(HashSet::new()))
        .lock()
        .unwrap_or_else(|e| e.into_inner())
}

pub fn element_size(format: u32) -> u64 {
    match format {
        0x01 | 0x08 => 1,
        0x02 | 0x09 | 0x10 => 2,
        0x03 | 0x0a | 0x20 => 4,
        _ => 4,
    }
}

/// Bytes of one array; `None` on overflow.
pub fn array_bytes(d: &CUDA_ARRAY3D_DESCRIPTOR) -> Option<u64> {
    let v = (d.width as u128)
        .checked_mul(d.height.max(1) as u128)?
        .checked_mul(d.depth.max(1) as u128)?
        .checked_mul(d.num_channels as u128)?
        .checked_mul(element_size(d.format) as u128)?;
    u64::try_from(v).ok()
}

pub const LAYERED: u32 = 0x01;
pub const CUBEMAP: u32 = 0x04;

/// Descriptor of level `l` of a mipmapped array.
pub fn level_desc(d: &CUDA_ARRAY3D_DESCRIPTOR, l: u32) -> CUDA_ARRAY3D_DESCRIPTOR {
    let shr = |x: usize| {
        if l >= usize::BITS {
            1
        } else {
            (x.max(1) >> l).max(1)
        }
    };
    let keep_depth = d.flags & (LAYERED | CUBEMAP) != 0;
    CUDA_ARRAY3D_DESCRIPTOR {
        width: shr(d.width),
        height: if d.height == 0 { 0 } else { shr(d.height) },
        depth: if d.depth == 0 {
            0
        } else if keep_depth {
            d.depth
        } else {
            shr(d.depth)
        },
        ..*d
    }
}

/// Bytes of a mipmapped array with `levels` levels; `None` on overflow.
pub fn mipmapped_bytes(d: &CUDA_ARRAY3D_DESCRIPTOR, levels: u32) -> Option<u64> {
    (0..levels).try_fold(0u64, |acc, l| {
        acc.checked_add(array_bytes(&level_desc(d, l))?)
    })
}

fn validate(d: &CUDA_ARRAY3D_DESCRIPTOR) -> Res {
    if d.width == 0 || !matches!(d.num_channels, 1 | 2 | 4) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    Ok(())
}

unsafe fn create(out: *mut CUarray, d: CUDA_ARRAY3D_DESCRIPTOR) -> Res {
    if out.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    validate(&d)?;
    let ctx: &Ctx = context::current()?;
    let bytes = array_bytes(&d).ok_or(CUDA_ERROR_OUT_OF_MEMORY)?;
    stats::reserve(ctx.physical, bytes)?;
    let a = Box::leak(Box::new(Array {
        desc: d,
        bytes,
        physical: ctx.physical,
        ctx: ctx as *const Ctx as usize,
        is_level: false,
    }));
    let h = a as *const Array as usize;
    set(&ARRAYS).insert(h);
    put(out, h as CUarray)
}

fn array(h: CUarray) -> Res<&'static Array> {
    crate::devices::visible()?;
    if h.is_null() || !set(&ARRAYS).contains(&(h as usize)) {
        return Err(CUDA_ERROR_INVALID_HANDLE);
    }
    Ok(unsafe { &*(h as *const Array) })
}

/// Destroys every array and mipmapped array made in the context at address `ctx` (its
/// destruction or primary-context reset); returns how many objects and bytes went.
pub fn free_context(ctx: usize) -> (u64, u64) {
    let (mut n, mut bytes) = (0, 0);
    let gone_mipmaps: Vec<&'static Mipmapped> = {
        let mut m = set(&MIPMAPS);
        let mine: Vec<usize> = m
            .iter()
            .copied()
            // SAFETY: handles in the set are leaked `Mipmapped`s.
            .filter(|&h| unsafe { &*(h as *const Mipmapped) }.ctx == ctx)
            .collect();
        mine.into_iter()
            .filter(|h| m.remove(h))
            .map(|h| unsafe { &*(h as *const Mipmapped) })
            .collect()
    };
    let gone_arrays: Vec<&'static Array> = {
        let mut a = set(&ARRAYS);
        for m in &gone_mipmaps {
            for l in &m.levels {
                a.remove(l);
            }
        }
        let mine: Vec<usize> = a
            .iter()
            .copied()
            // SAFETY: handles in the set are leaked `Array`s.
            .filter(|&h| {
                let x = unsafe { &*(h as *const Array) };
                x.ctx == ctx && !x.is_level
            })
            .collect();
        mine.into_iter()
            .filter(|h| a.remove(h))
            .map(|h| unsafe { &*(h as *const Array) })
            .collect()
    };
    for m in gone_mipmaps {
        stats::release(m.physical, m.bytes);
        n += 1;
        bytes += m.bytes;
    }
    for a in gone_arrays {
        stats::release(a.physical, a.bytes);
        n += 1;
        bytes += a.bytes;
    }
    (n, bytes)
}

cu_api! {
    fn cuArrayCreate_v2(out: *mut CUarray, desc: *const CUDA_ARRAY_DESCRIPTOR) {
        let d = get(desc)?;
        create(out, CUDA_ARRAY3D_DESCRIPTOR {
            width: d.width,
            height: d.height,
            depth: 0,
            format: d.format,
            num_channels: d.num_channels,
            flags: 0,
        })
    }

    fn cuArray3DCreate_v2(out: *mut CUarray, desc: *const CUDA_ARRAY3D_DESCRIPTOR) {
        create(out, get(desc)?)
    }

    fn cuArrayDestroy(h: CUarray) {
        let a = array(h)?;
        if a.is_level {
            return Err(CUDA_ERROR_INVALID_HANDLE);
        }
        if set(&ARRAYS).remove(&(h as usize)) {
            stats::release(a.physical, a.bytes);
        }
        Ok(())
    }

    fn cuArrayGetDescriptor_v2(desc: *mut CUDA_ARRAY_DESCRIPTOR, h: CUarray) {
        let a = array(h)?;
        // 3D arrays are described by cuArray3DGetDescriptor only.
        if a.desc.depth > 0 {
            return Err(CUDA_ERROR_INVALID_HANDLE);
        }
        put(desc, CUDA_ARRAY_DESCRIPTOR {
            width: a.desc.width,
            height: a.desc.height,
            format: a.desc.format,
            num_channels: a.desc.num_channels,
        })
    }

    fn cuArray3DGetDescriptor_v2(desc: *mut CUDA_ARRAY3D_DESCRIPTOR, h: CUarray) {
        let a = array(h)?;
        put(desc, a.desc)
    }

    fn cuMipmappedArrayCreate(out: *mut CUmipmappedArray, desc: *const CUDA_ARRAY3D_DESCRIPTOR, levels: u32) {
        let d = get(desc)?;
        if out.is_null() || levels == 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        validate(&d)?;
        let ctx = context::current()?;
        let bytes = mipmapped_bytes(&d, levels).ok_or(CUDA_ERROR_OUT_OF_MEMORY)?;
        stats::reserve(ctx.physical, bytes)?;
        let level_handles: Vec<usize> = (0..levels)
            .map(|l| {
                let ld = level_desc(&d, l);
                let a = Box::leak(Box::new(Array {
                    desc: ld,
                    bytes: array_bytes(&ld).unwrap_or(0),
                    physical: ctx.physical,
                    ctx: ctx as *const Ctx as usize,
                    is_level: true,
                }));
                a as *const Array as usize
            })
            .collect();
        set(&ARRAYS).extend(level_handles.iter().copied());
        let m = Box::leak(Box::new(Mipmapped {
            bytes,
            physical: ctx.physical,
            ctx: ctx as *const Ctx as usize,
            levels: level_handles,
        }));
        let h = m as *const Mipmapped as usize;
        set(&MIPMAPS).insert(h);
        put(out, h as CUmipmappedArray)
    }

    fn cuMipmappedArrayDestroy(h: CUmipmappedArray) {
        crate::devices::visible()?;
        if h.is_null() || !set(&MIPMAPS).remove(&(h as usize)) {
            return Err(CUDA_ERROR_INVALID_HANDLE);
        }
        let m = unsafe { &*(h as *const Mipmapped) };
        {
            let mut arrays = set(&ARRAYS);
            for l in &m.levels {
                arrays.remove(l);
            }
        }
        stats::release(m.physical, m.bytes);
        Ok(())
    }

    fn cuMipmappedArrayGetLevel(out: *mut CUarray, h: CUmipmappedArray, level: u32) {
        crate::devices::visible()?;
        if h.is_null() || !set(&MIPMAPS).contains(&(h as usize)) {
            return Err(CUDA_ERROR_INVALID_HANDLE);
        }
        let m = unsafe { &*(h as *const Mipmapped) };
        let l = *m.levels.get(level as usize).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        put(out, l as CUarray)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d3(
        w: usize,
        h: usize,
        d: usize,
        format: u32,
        ch: u32,
        flags: u32,
    ) -> CUDA_ARRAY3D_DESCRIPTOR {
        CUDA_ARRAY3D_DESCRIPTOR {
            width: w,
            height: h,
            depth: d,
            format,
            num_channels: ch,
            flags,
        }
    }

    #[test]
    fn sizes() {
        assert_eq!(array_bytes(&d3(100, 0, 0, 0x01, 1, 0)), Some(100));
        assert_eq!(
            array_bytes(&d3(100, 10, 0, 0x20, 4, 0)),
            Some(100 * 10 * 16)
        );
        assert_eq!(
            array_bytes(&d3(8, 8, 8, 0x10, 2, 0)),
            Some(8 * 8 * 8 * 2 * 2)
        );
        assert_eq!(array_bytes(&d3(1, 1, 1, 0xb0, 1, 0)), Some(4)); // unknown format: 4 bytes
        assert_eq!(
            array_bytes(&d3(usize::MAX, usize::MAX, 2, 0x20, 4, 0)),
            None
        );
    }

    #[test]
    fn mipmaps() {
        // 2D 64x64 float, 3 levels: 64*64 + 32*32 + 16*16 texels of 4 bytes
        let d = d3(64, 64, 0, 0x20, 1, 0);
        assert_eq!(mipmapped_bytes(&d, 3), Some(4 * (4096 + 1024 + 256)));
        // 3D: depth shrinks too
        let d = d3(8, 8, 8, 0x01, 1, 0);
        assert_eq!(mipmapped_bytes(&d, 4), Some(512 + 64 + 8 + 1));
        // layered: depth (layers) kept
        let d = d3(8, 8, 6, 0x01, 1, LAYERED);
        assert_eq!(mipmapped_bytes(&d, 2), Some(64 * 6 + 16 * 6));
        // past the smallest level, each level is 1x1
        let d = d3(2, 0, 0, 0x01, 1, 0);
        assert_eq!(mipmapped_bytes(&d, 4), Some(2 + 1 + 1 + 1));
    }
}
