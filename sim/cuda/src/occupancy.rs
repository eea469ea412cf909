//! Occupancy queries (`cuOccupancy*`) and parameter counts, answered for a loaded kernel as the
//! simulated sm_90 GPU would: every kernel uses 16 registers per thread and no static shared
//! memory (as `cuFuncGetAttribute` reports).

use crate::types::*;
use std::ffi::c_void;

/// sm_90 limits per multiprocessor: threads, blocks, registers, shared memory (bytes), the
/// shared memory the driver reserves per block, a function's default dynamic shared memory
/// limit, the multiprocessor count (`devices`), threads per warp.
const SM_THREADS: i64 = 2048;
const SM_BLOCKS: i64 = 32;
const SM_REGS: i64 = 65536;
const SM_SHARED: i64 = 233_472;
const BLOCK_RESERVED: i64 = 1024;
const MAX_DYNAMIC: i64 = 48 << 10;
const SMS: i64 = 132;
const WARP: i64 = 32;
const REGS_PER_THREAD: i64 = 16;
const MAX_BLOCK: i64 = 1024;

/// Resident blocks of `block` threads using `dynamic` bytes of shared memory each.
fn blocks_per_sm(block: i64, dynamic: i64) -> i64 {
    if block > MAX_BLOCK || dynamic > MAX_DYNAMIC {
        return 0;
    }
    let warps = (block + WARP - 1) / WARP;
    let by_threads = SM_THREADS / (warps * WARP);
    let by_regs = SM_REGS / (warps * WARP * REGS_PER_THREAD);
    let by_shared = SM_SHARED / (dynamic + BLOCK_RESERVED);
    SM_BLOCKS.min(by_threads).min(by_regs).min(by_shared)
}

/// `CUoccupancyB2DSize`: the dynamic shared memory a block size needs.
type B2D = Option<unsafe extern "C" fn(i32) -> usize>;

/// The block size (a multiple of the warp, at most `limit`) with the most resident threads
/// (the largest of equals), and the grid that fills the GPU with it.
unsafe fn potential(min_grid: *mut i32, block_size: *mut i32, f: CUfunction, b2d: B2D, dynamic: usize, limit: i32, flags: u32) -> Res {
    if min_grid.is_null() || block_size.is_null() || flags > 1 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    crate::kernels::launchable_handle(f as *mut c_void)?;
    let limit = if limit <= 0 { MAX_BLOCK } else { i64::from(limit).min(MAX_BLOCK) };
    let (mut best, mut best_blocks) = (0i64, 0i64);
    let mut b = limit / WARP * WARP;
    while b > 0 {
        // SAFETY: the caller's callback, as the driver API calls it.
        let dynamic = match b2d {
            Some(cb) => unsafe { cb(b as i32) },
            None => dynamic,
        };
        let n = blocks_per_sm(b, i64::try_from(dynamic).unwrap_or(i64::MAX));
        if n * b > best * best_blocks {
            (best, best_blocks) = (b, n);
        }
        b -= WARP;
    }
    // SAFETY: non-NULL out-pointers of the caller.
    unsafe {
        put(min_grid, (best_blocks * SMS) as i32)?;
        put(block_size, best as i32)
    }
}

cu_api! {
    fn cuOccupancyMaxActiveBlocksPerMultiprocessor(blocks: *mut i32, f: CUfunction, block: i32, dynamic: usize) {
        cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags_impl(blocks, f, block, dynamic, 0)
    }

    /// flags: `CU_OCCUPANCY_DEFAULT` (0) or `CU_OCCUPANCY_DISABLE_CACHING_OVERRIDE` (1).
    fn cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(blocks: *mut i32, f: CUfunction, block: i32, dynamic: usize, flags: u32) {
        cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags_impl(blocks, f, block, dynamic, flags)
    }

    fn cuOccupancyMaxPotentialBlockSize(min_grid: *mut i32, block: *mut i32, f: CUfunction, b2d: B2D, dynamic: usize, limit: i32) {
        potential(min_grid, block, f, b2d, dynamic, limit, 0)
    }

    fn cuOccupancyMaxPotentialBlockSizeWithFlags(min_grid: *mut i32, block: *mut i32, f: CUfunction, b2d: B2D, dynamic: usize, limit: i32, flags: u32) {
        potential(min_grid, block, f, b2d, dynamic, limit, flags)
    }

    /// The dynamic shared memory each of `blocks` resident blocks of `block` threads can have.
    fn cuOccupancyAvailableDynamicSMemPerBlock(size: *mut usize, f: CUfunction, blocks: i32, block: i32) {
        if size.is_null() || blocks <= 0 || block <= 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        crate::kernels::launchable_handle(f as *mut c_void)?;
        let fits = blocks_per_sm(i64::from(block), 0) >= i64::from(blocks);
        let per_block = if fits { (SM_SHARED / i64::from(blocks) - BLOCK_RESERVED).clamp(0, MAX_DYNAMIC) } else { 0 };
        put(size, per_block as usize)
    }

    fn cuFuncGetParamCount(f: CUfunction, count: *mut usize) {
        put(count, crate::kernels::launchable_handle(f as *mut c_void)?)
    }

    fn cuKernelGetParamCount(k: *mut c_void, count: *mut usize) {
        put(count, crate::kernels::launchable_handle(k)?)
    }
}

#[allow(non_snake_case)]
unsafe fn cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags_impl(blocks: *mut i32, f: CUfunction, block: i32, dynamic: usize, flags: u32) -> Res {
    if blocks.is_null() || block <= 0 || flags > 1 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    crate::kernels::launchable_handle(f as *mut c_void)?;
    // SAFETY: the caller's non-NULL out-pointer.
    unsafe { put(blocks, blocks_per_sm(i64::from(block), i64::try_from(dynamic).unwrap_or(i64::MAX)) as i32) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn occupancy_follows_the_sm_limits() {
        assert_eq!(blocks_per_sm(128, 0), 16); // 2048 threads
        assert_eq!(blocks_per_sm(32, 0), 32); // 32 blocks
        assert_eq!(blocks_per_sm(1024, 0), 2);
        assert_eq!(blocks_per_sm(100, 0), 16); // rounded up to 4 warps
        assert_eq!(blocks_per_sm(64, 40 << 10), 5); // shared memory: 233472 / 41984
        assert_eq!(blocks_per_sm(1025, 0), 0);
        assert_eq!(blocks_per_sm(64, 49 << 10), 0);
    }
}
