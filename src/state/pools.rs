//! The state's side of memory pools: what the pool hooks reserve and credit on the budgets.


use std::ffi::c_void;
use crate::driver::ffi::*;

use crate::accounting::pools::*;
use crate::state::State;

impl State {
    /// The pools of program device `dev`, as the driver's handles (no duplicates); `None` when
    /// the list of pools the program created cannot be had (`bounded`): then nothing is
    /// credited (closed).
    fn device_pools(&self, dev: CUdevice) -> Option<Vec<CUmemoryPool>> {
        let mut pools = self.device_pools_of_driver(dev);
        let created = self.pools.lock().map_err(|stuck| crate::platform::log::stuck("reading what memory pools keep", stuck)).ok()?;
        for &(pool, d) in created.iter() {
            let pool = pool as CUmemoryPool;
            if d == dev && !pools.contains(&pool) {
                pools.push(pool);
            }
        }
        Some(pools)
    }

    /// The program device whose default or current pool `pool` is (asked of the driver).
    pub fn device_of_pool(&self, pool: CUmemoryPool) -> Option<CUdevice> {
        let count = self.program_devices().map(|d| d.list.len()).unwrap_or_else(|| self.api().devices().len());
        (0..count.min(crate::accounting::memory::MAX_DEVICES)).map(|d| d as CUdevice).find(|&d| self.device_pools_of_driver(d).contains(&pool))
    }

    /// The default and current pools of program device `dev` (the driver's handles).
    fn device_pools_of_driver(&self, dev: CUdevice) -> Vec<CUmemoryPool> {
        let api = self.api();
        let mut pools = Vec::new();
        if let Some(driver) = self.driver_of(dev) {
            for get in [api.device_get_default_mem_pool, api.device_get_mem_pool].into_iter().flatten() {
                let mut pool: CUmemoryPool = std::ptr::null_mut();
                // SAFETY: a valid out-pointer; `driver` is a driver ordinal.
                if unsafe { get(&mut pool, driver) } == CUDA_SUCCESS && !pool.is_null() && !pools.contains(&pool) {
                    pools.push(pool);
                }
            }
        }
        pools
    }

    /// What the device's pools keep beyond what they hand out, per the driver; `None` when a
    /// figure cannot be read (then nothing is credited: fail closed).
    fn pools_kept_by_driver(&self, pools: &[CUmemoryPool]) -> Option<u64> {
        let get = self.api().mem_pool_get_attribute?;
        let mut kept = 0u64;
        for &pool in pools {
            let (mut reserved, mut used) = (0u64, 0u64);
            // Used first: an allocation between the two reads raises both figures (or only
            // used, when it reuses what the pool kept), so reading reserved second can only
            // overstate what is kept (closed); the other order would understate it by the
            // allocation and credit memory the program holds. (A free between the reads is
            // caught by the epoch, see `DeviceBudget::pools_keep`.)
            // SAFETY: valid out-pointers of the attributes' size (cuuint64_t); `pool` is a
            // handle the driver gave.
            let ok = unsafe {
                get(pool, USED_MEM_CURRENT, (&mut used as *mut u64).cast::<c_void>()) == CUDA_SUCCESS
                    && get(pool, RESERVED_MEM_CURRENT, (&mut reserved as *mut u64).cast::<c_void>()) == CUDA_SUCCESS
            };
            if !ok {
                return None;
            }
            kept = kept.saturating_add(reserved.saturating_sub(used));
        }
        Some(kept)
    }

    /// Credits what the pools of `dev` gave back since their frees were counted as kept.
    pub fn reconcile_pools(&self, dev: CUdevice) {
        let Some(budget) = self.budget(dev) else { return };
        if budget.pool_kept() == 0 {
            return;
        }
        let Some(pools) = self.device_pools(dev) else { return };
        self.settle_pools(budget, &pools);
    }

    /// Reads the pools' figures and credits what they gave back; tried again (a few times) when
    /// a pool free by another thread raced with the reading.
    fn settle_pools(&self, budget: &crate::accounting::memory::DeviceBudget, pools: &[CUmemoryPool]) {
        for _ in 0..4 {
            let epoch = budget.pool_epoch();
            let Some(kept) = self.pools_kept_by_driver(pools) else { return };
            budget.pools_keep(kept, epoch);
            if budget.pool_epoch() == epoch {
                return;
            }
        }
    }

    /// Trims the pools of `dev` of what they keep unused, then credits what they gave back.
    /// Returns whether anything was credited.
    pub fn trim_pools(&self, dev: CUdevice) -> bool {
        let Some(budget) = self.budget(dev) else { return false };
        let before = budget.pool_kept();
        let Some(pools) = self.device_pools(dev) else { return false };
        if let Some(trim) = self.api().mem_pool_trim_to {
            for &pool in &pools {
                // SAFETY: a pool handle the driver gave; trimming only releases unused memory.
                unsafe { trim(pool, 0) };
            }
        }
        self.settle_pools(budget, &pools);
        let credited = budget.pool_kept() < before;
        if credited {
            crate::platform::log::log!(crate::platform::log::Level::Debug, "device {dev}: trimmed its memory pools; {} bytes they kept were given back", before - budget.pool_kept());
        }
        credited
    }
}
