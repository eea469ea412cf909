//! The state's side of graphs: what instantiating, launching and destroying a graph reserves and credits on the devices' budgets.


use std::ffi::{c_int, c_void};
use std::sync::atomic::Ordering::Relaxed;
use gpushim_common::bounded::Stuck;
use crate::driver::ffi::*;

use crate::accounting::graphs::*;
use crate::state::State;

impl State {
    /// Whether `stream` is capturing into a graph: a stream-ordered allocation on it is then a
    /// node of that graph and takes no memory until the graph is launched (counted there). The
    /// default streams cannot capture; a stream whose state cannot be read is not capturing
    /// (its allocation is counted: closed).
    pub fn capturing(&self, stream: CUstream) -> bool {
        if is_default_stream(stream) {
            return false;
        }
        let Some(get) = self.api().stream_is_capturing else { return false };
        let mut status: c_int = 0;
        // SAFETY: the program's stream handle, passed on as given; valid out-pointer.
        (unsafe { get(stream, &mut status) }) == CUDA_SUCCESS && status == STREAM_CAPTURE_STATUS_ACTIVE
    }

    /// `graph` was instantiated into `exec`: records its allocation nodes' bytes per device.
    /// `Err`: not recorded (the caller undoes the instantiation: launches of a graph the shim
    /// does not know would not be counted).
    pub fn graph_instantiated(&self, exec: usize, graph: *mut c_void) -> Result<(), Stuck> {
        let api = self.api();
        let (Some(get_nodes), Some(get_type), Some(get_params)) = (api.graph_get_nodes, api.graph_node_get_type, api.graph_mem_alloc_node_get_params) else {
            return Ok(());
        };
        let mut count = 0usize;
        // SAFETY: NULL nodes asks the count only; valid out-pointer.
        if unsafe { get_nodes(graph, std::ptr::null_mut(), &mut count) } != CUDA_SUCCESS || count == 0 {
            return Ok(());
        }
        let mut nodes = vec![std::ptr::null_mut::<c_void>(); count.min(MAX_NODES)];
        let mut n = nodes.len();
        // SAFETY: room for `n` handles; the driver writes at most `n` and says how many.
        if unsafe { get_nodes(graph, nodes.as_mut_ptr(), &mut n) } != CUDA_SUCCESS {
            return Ok(());
        }
        let mut memory = ExecMemory::default();
        for &node in nodes.iter().take(n.min(nodes.len())) {
            let mut kind: c_int = 0;
            // SAFETY: a node handle the driver gave; valid out-pointer.
            if unsafe { get_type(node, &mut kind) } != CUDA_SUCCESS || kind != NODE_TYPE_MEM_ALLOC {
                continue;
            }
            // SAFETY: all-zero is a valid value of this plain C struct.
            let mut params: MemAllocNodeParams = unsafe { std::mem::zeroed() };
            // SAFETY: an allocation node; the out-struct has the driver's layout and size.
            if unsafe { get_params(node, (&mut params as *mut MemAllocNodeParams).cast()) } != CUDA_SUCCESS {
                continue;
            }
            let location_type = u32::from_ne_bytes(params.pool_props[8..12].try_into().unwrap_or_default());
            let id = i32::from_ne_bytes(params.pool_props[12..16].try_into().unwrap_or_default());
            if location_type != MEM_LOCATION_TYPE_DEVICE as u32 {
                continue;
            }
            let dev = self.program_of(id);
            match memory.needs.iter_mut().find(|(d, _)| *d == dev) {
                Some(e) => e.1 = e.1.saturating_add(params.bytesize as u64),
                None => memory.needs.push((dev, params.bytesize as u64)),
            }
        }
        if !memory.needs.is_empty() {
            self.graphs.execs()?.insert(exec, memory);
        }
        Ok(())
    }

    /// The driver's (used, reserved) graph-pool figures of program device `dev`.
    fn graph_pool(&self, dev: CUdevice) -> Option<(u64, u64)> {
        let get = self.api().device_get_graph_mem_attribute?;
        let driver = self.driver_of(dev)?;
        let (mut used, mut reserved) = (0u64, 0u64);
        // SAFETY: valid out-pointers of the attributes' size (cuuint64_t).
        let ok = unsafe {
            get(driver, USED_MEM_CURRENT, (&mut used as *mut u64).cast()) == CUDA_SUCCESS
                && get(driver, RESERVED_MEM_CURRENT, (&mut reserved as *mut u64).cast()) == CUDA_SUCCESS
        };
        ok.then_some((used, reserved))
    }

    /// Runs a launch or upload of `exec`: reserves what its first one makes the graph pools
    /// grow by, refusing it past a limit, then settles on the driver's figures.
    pub fn graph_launch(&self, what: &str, exec: usize, launch: impl FnOnce() -> CUresult) -> CUresult {
        let memory = match self.graphs.execs() {
            Ok(execs) => execs.get(&exec).cloned(),
            Err(stuck) => return crate::platform::log::refuse(what, stuck, CUDA_ERROR_OUT_OF_MEMORY),
        };
        let Some(memory) = memory.filter(|m| !m.launched) else { return launch() };
        let mut reserved: Vec<(CUdevice, u64)> = Vec::new();
        for &(dev, need) in &memory.needs {
            let (Some(budget), Some(limit)) = (self.budget(dev), self.limit(dev)) else {
                // a device the shim cannot account for: refused while limits apply (closed)
                for &(d, g) in &reserved {
                    self.budgets_of(d as usize).release(g);
                }
                self.report_refusal(what, dev, need);
                return CUDA_ERROR_OUT_OF_MEMORY;
            };
            // what the pool must grow by; all of it when the figures cannot be read
            let grow = self.graph_pool(dev).map_or(need, |(used, pool)| used.saturating_add(need).saturating_sub(pool));
            if grow == 0 {
                continue;
            }
            if budget.try_reserve(grow, limit).is_err() && !self.wait_for_room(what, dev, grow, limit) {
                for &(d, g) in &reserved {
                    self.budgets_of(d as usize).release(g);
                }
                self.report_refusal(what, dev, need);
                return CUDA_ERROR_OUT_OF_MEMORY;
            }
            reserved.push((dev, grow));
        }
        let result = launch();
        if result != CUDA_SUCCESS {
            for &(d, g) in &reserved {
                self.budgets_of(d as usize).release(g);
            }
            return result;
        }
        for &(dev, grow) in &reserved {
            self.budgets_of(dev as usize).take(grow);
            self.graphs.counted[dev as usize].fetch_add(grow, Relaxed);
        }
        // (not marked if the table cannot be had: the next launch is checked like a first one)
        if let Some(m) = self.graphs.execs().ok().as_mut().and_then(|e| e.get_mut(&exec)) {
            m.launched = true;
        }
        for &(dev, _) in &memory.needs {
            self.settle_graph_pool(dev);
        }
        result
    }

    /// `exec` was destroyed: forgets it and settles its devices' graph pools.
    pub fn graph_destroyed(&self, exec: usize) {
        // (if the table cannot be had the entry stays: a handle the driver hands out again
        // replaces it at its instantiation)
        let memory = self.graphs.execs().ok().and_then(|mut e| e.remove(&exec));
        for (dev, _) in memory.map(|m| m.needs).unwrap_or_default() {
            self.settle_graph_pool(dev);
        }
    }

    /// Counts exactly what the driver's graph pool of `dev` holds (`RESERVED_MEM_CURRENT`).
    pub fn settle_graph_pool(&self, dev: CUdevice) {
        let (Some(budget), Some((_, held))) = (self.budget(dev), self.graph_pool(dev)) else { return };
        // (taken first: a settlement that could not mark the graphs to check again credits
        // nothing, closed)
        let Ok(mut execs) = self.graphs.execs() else { return };
        let counted = &self.graphs.counted[dev as usize];
        let before = counted.swap(held, Relaxed);
        if held < before {
            // The pool gave memory back (a trim): a graph launched before may need it again at
            // its next launch, which is then checked like a first one.
            for m in execs.values_mut() {
                if m.needs.iter().any(|&(d, _)| d == dev) {
                    m.launched = false;
                }
            }
            budget.freed(before - held);
        } else if held > before {
            // the driver took more than predicted (rounding, another thread's launch): count it
            let _ = budget.try_reserve(held - before, u64::MAX);
            budget.take(held - before);
        }
    }
}
