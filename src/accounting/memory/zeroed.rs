//! Zero-filled anonymous mappings for the tables: pages the kernel commits only as they are first written.

#[allow(unused_imports)]
use super::*;

/// The buckets, in an anonymous mapping of their own: zero pages the kernel commits only as
/// buckets are first written. (The allocator's zeroed memory would not do: for the buckets'
/// 64-byte alignment it allocates aligned and then writes 2 MiB of zeros, two million
/// instructions at every start-up.)
/// Types for which all-zero bytes are a valid value (atomic integers and pointers only).
///
/// # Safety
/// All-zero bytes must be a valid value of the type.
pub unsafe trait ZeroValid: Sync {}

// SAFETY: atomics only; all zero is an empty bucket.
unsafe impl ZeroValid for Bucket {}
// SAFETY: atomics only; all zero is `DeviceBudget::new()` (checked by a test).
unsafe impl ZeroValid for DeviceBudget {}

/// `len` values of `T`, all zero, in a private anonymous mapping: zero-filled pages the kernel
/// provides as they are first touched, without the process writing them (zeroing 256 budgets
/// with `memset` costs ~20,000 instructions at start-up, writing them one by one ~11,000).
pub struct Zeroed<T: ZeroValid> {
    pub(crate) ptr: *mut T,
    pub(crate) len: usize,
}

// SAFETY: the values are `Sync` (atomics) and the mapping is owned by this value.
unsafe impl<T: ZeroValid> Send for Zeroed<T> {}
unsafe impl<T: ZeroValid> Sync for Zeroed<T> {}

impl<T: ZeroValid> Zeroed<T> {
    /// `len` zeroed values; none (empty) if that cannot be mapped.
    pub fn new(len: usize) -> Self {
        let none = Zeroed { ptr: std::ptr::null_mut(), len: 0 };
        let Some(bytes) = len.checked_mul(std::mem::size_of::<T>()) else { return none };
        if bytes == 0 || std::mem::align_of::<T>() > 4096 {
            return none;
        }
        // SAFETY: a fresh private anonymous mapping (page-aligned, zero-filled); checked below.
        let p = unsafe {
            gpushim_common::sys::mmap(std::ptr::null_mut(), bytes, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1, 0)
        };
        if p == libc::MAP_FAILED {
            return none;
        }
        Zeroed { ptr: p.cast(), len }
    }
}

impl<T: ZeroValid> Zeroed<T> {
    /// Value `i`, or `None` if there are none.
    ///
    /// # Safety
    /// `i` is below the length if there are any values.
    #[inline(always)]
    pub(crate) unsafe fn get_below_len(&self, i: usize) -> Option<&T> {
        debug_assert!(self.len == 0 || i < self.len, "index {i} of {}", self.len);
        // SAFETY: `ptr` is a live mapping of `len` values and `i < len` (the caller's word).
        (self.len != 0).then(|| unsafe { &*self.ptr.add(i) })
    }
}

impl<T: ZeroValid> std::ops::Deref for Zeroed<T> {
    type Target = [T];
    #[inline]
    fn deref(&self) -> &[T] {
        if self.len == 0 {
            return &[];
        }
        // SAFETY: `ptr` is a live mapping of `len` values, all valid (zero, or changed since
        // only through the atomics' shared references).
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl<T: ZeroValid> Drop for Zeroed<T> {
    fn drop(&mut self) {
        if self.len != 0 {
            // SAFETY: the mapping made in `new`, of this size, no longer referenced.
            unsafe { gpushim_common::sys::munmap(self.ptr.cast(), self.len * std::mem::size_of::<T>()) };
        }
    }
}

/// The lock-free table's buckets.
pub(crate) type Table = Zeroed<Bucket>;

/// A table of `buckets` zeroed buckets (all-zero atomics: empty buckets). Empty if `buckets` is
/// not a power of two or the memory cannot be mapped (the map then keeps everything in its
/// mutex map).
pub(crate) fn zeroed_table(buckets: usize) -> Table {
    if !buckets.is_power_of_two() || buckets as u64 > 1 << 32 {
        return Zeroed::new(0);
    }
    Zeroed::new(buckets)
}
