//! Graph memory: what CUDA graphs' memory nodes hold (`cuGraphAddMemAllocNode`, and
//! `cuMemAllocAsync` captured from a stream).
//!
//! An allocation node takes no memory when it is added or instantiated; the driver takes its
//! physical memory from the device's graph memory pool when the executable graph is first
//! uploaded or launched, keeps it in that pool after the graph's frees and its destruction, and
//! gives it back only on `cuDeviceGraphMemTrim`. The shim therefore:
//! * records, when a graph is instantiated, how many bytes its allocation nodes ask on each
//!   device (`cuGraphGetNodes`, `cuGraphNodeGetType`, `cuGraphMemAllocNodeGetParams`);
//! * before an executable graph's first upload or launch, reserves in the device's budget what
//!   the pool must grow by — (pool used + the graph's bytes) − pool reserved, from the driver's
//!   `cuDeviceGetGraphMemAttribute` figures — and refuses the launch with
//!   `CUDA_ERROR_OUT_OF_MEMORY` if that passes the limit;
//! * after launches, destructions and trims, settles what it counts for the device's graph pool
//!   on the driver's `RESERVED_MEM_CURRENT`: what the driver holds, counted, and credited once
//!   trimmed.
//!
//! When the figures cannot be read, the whole of the graph's bytes is reserved (fail closed).
//! The hooks are handed out whenever a limit applies (`limit` in the hook table).
//!
//! The table of executable graphs is behind a bounded lock (`bounded`): an instantiation that
//! cannot be recorded is undone and refused, a launch whose graph cannot be looked up is
//! refused, and a settlement that cannot mark the graphs to check again credits nothing.

use std::collections::HashMap;
use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use gpushim_common::bounded::{Bounded, Guard, Stuck};

use crate::driver::ffi::*;
use crate::accounting::memory::MAX_DEVICES;

pub(crate) const NODE_TYPE_MEM_ALLOC: c_int = 10;
/// `CU_STREAM_CAPTURE_STATUS_ACTIVE`
pub(crate) const STREAM_CAPTURE_STATUS_ACTIVE: c_int = 1;
/// `CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT`, `CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT`
pub(crate) const USED_MEM_CURRENT: c_int = 0;
pub(crate) const RESERVED_MEM_CURRENT: c_int = 2;
/// Nodes of one graph the shim reads at most (a larger graph: its first this many nodes).
pub(crate) const MAX_NODES: usize = 1 << 20;

/// `CUDA_MEM_ALLOC_NODE_PARAMS`: the pool properties (88 bytes, the location at offset 8), the
/// access descriptors, their count, the size and the address.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct MemAllocNodeParams {
    pub(crate) pool_props: [u8; 88],
    pub(crate) access_descs: *const c_void,
    pub(crate) access_desc_count: usize,
    pub(crate) bytesize: usize,
    pub(crate) dptr: CUdeviceptr,
}

/// An executable graph's memory: (program device, bytes of its allocation nodes).
#[derive(Clone, Default)]
pub(crate) struct ExecMemory {
    pub(crate) needs: Vec<(CUdevice, u64)>,
    pub(crate) launched: bool,
}

pub struct Graphs {
    pub(crate) execs: Bounded<HashMap<usize, ExecMemory>>,
    /// What the shim counts for each device's graph pool.
    /// One per device, on the heap (see `State::budgets`).
    pub(crate) counted: Box<[AtomicU64]>,
}

impl Graphs {
    pub fn new() -> Self {
        Graphs { execs: Bounded::new("gpushim's table of graph memory", HashMap::new()), counted: (0..MAX_DEVICES).map(|_| AtomicU64::new(0)).collect() }
    }

    pub fn hold_for_fork(&'static self) {
        crate::platform::fork::hold(&self.execs);
    }

    /// A forked child holds nothing (`fork`).
    pub fn reset_after_fork(&self) {
        self.execs.reset_after_fork(HashMap::new());
        for c in &self.counted {
            c.store(0, Relaxed);
        }
    }

    pub(crate) fn execs(&self) -> Result<Guard<'_, HashMap<usize, ExecMemory>>, Stuck> {
        self.execs.lock()
    }
}

