//! CUDA graphs, as far as their memory and time go: graphs of memory-allocation, memory-free
//! and kernel nodes (other nodes are not modelled), built explicitly (`cuGraphAddMemAllocNode`,
//! `cuGraphAddMemFreeNode`, `cuGraphAddKernelNode[_v2]`) or by stream capture
//! (`cuMemAllocAsync`/`cuMemAllocFromPoolAsync`/`cuMemFreeAsync` and kernel launches on a
//! capturing stream add such nodes and take no memory and no time), instantiated into
//! executable graphs that are uploaded and launched. A launch runs the graph's kernel nodes one
//! after another on its stream (`timeline`), each taking the duration fixed when it was added
//! (`kernels::duration` of its parameters then).
//!
//! Graph memory, as on the driver: an allocation node gets a virtual address when it is added;
//! physical memory comes from the device's graph memory pool when an executable graph is first
//! uploaded or launched. Each launch takes the sum of its allocation nodes' sizes on each device
//! from the pool (growing it when it has less free); what the graph's own free nodes free goes
//! back to the pool at the end of the launch, what they do not free stays allocated until the
//! executable graph is destroyed. The pool keeps
//! what it took (`RESERVED_MEM_CURRENT`) until `cuDeviceGraphMemTrim` gives back what no
//! executable graph holds. A launch whose memory the device does not have fails with
//! `CUDA_ERROR_OUT_OF_MEMORY`. Pool memory counts in the device's usage (the report's `used`).

use crate::devices::phys_of;
use crate::types::*;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

pub type CUgraph = *mut std::ffi::c_void;
pub type CUgraphNode = *mut std::ffi::c_void;
pub type CUgraphExec = *mut std::ffi::c_void;

const NODE_TYPE_KERNEL: i32 = 0;
const NODE_TYPE_EMPTY: i32 = 2;
const NODE_TYPE_MEM_ALLOC: i32 = 10;
const NODE_TYPE_MEM_FREE: i32 = 11;

/// `CUDA_MEM_ALLOC_NODE_PARAMS` (v1).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct MemAllocNodeParams {
    pub pool_props: CUmemPoolProps,
    pub access_descs: *const std::ffi::c_void,
    pub access_desc_count: usize,
    pub bytesize: usize,
    pub dptr: CUdeviceptr,
}

enum NodeKind {
    Alloc { params: MemAllocNodeParams, physical: usize },
    Free { dptr: CUdeviceptr },
    /// A kernel taking `ns` of simulated time.
    Kernel { ns: u64 },
}

struct Node {
    kind: NodeKind,
}

struct Graph {
    nodes: Mutex<Vec<usize>>,
}

struct Exec {
    /// The durations of its kernel nodes, in graph order.
    kernels: Vec<u64>,
    /// (physical device, bytes of its allocation nodes, bytes of those its free nodes free).
    needs: Vec<(usize, u64, u64)>,
    holding: AtomicBool,
}

/// A device's graph memory pool.
#[derive(Default)]
struct GraphPool {
    reserved: AtomicU64,
    used: AtomicU64,
    reserved_high: AtomicU64,
    used_high: AtomicU64,
}

#[derive(Default)]
struct Registry {
    graphs: HashSet<usize>,
    nodes: HashSet<usize>,
    execs: HashSet<usize>,
    /// Capturing stream -> the graph it captures into.
    capturing: HashMap<usize, usize>,
}

fn registry() -> std::sync::MutexGuard<'static, Registry> {
    static R: OnceLock<Mutex<Registry>> = OnceLock::new();
    R.get_or_init(Default::default).lock().unwrap_or_else(|e| e.into_inner())
}

fn pool(physical: usize) -> &'static GraphPool {
    static POOLS: OnceLock<Vec<GraphPool>> = OnceLock::new();
    let pools = POOLS.get_or_init(|| (0..crate::devices::physical().len()).map(|_| GraphPool::default()).collect());
    &pools[physical.min(pools.len().saturating_sub(1))]
}

/// Addresses of allocation nodes: a range of their own, never a host mapping's.
fn next_address(bytes: usize) -> CUdeviceptr {
    static NEXT: AtomicU64 = AtomicU64::new(0x6000_0000_0000);
    let len = (bytes as u64).max(1).div_ceil(1 << 21) << 21;
    NEXT.fetch_add(len, Ordering::Relaxed)
}

fn graph(h: CUgraph) -> Res<&'static Graph> {
    if h.is_null() || !registry().graphs.contains(&(h as usize)) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: registered graphs are leaked boxes, never freed while registered.
    Ok(unsafe { &*(h as *const Graph) })
}

fn new_graph() -> CUgraph {
    let g: &'static Graph = Box::leak(Box::new(Graph { nodes: Mutex::new(Vec::new()) }));
    registry().graphs.insert(g as *const Graph as usize);
    g as *const Graph as CUgraph
}

fn add_node(g: &'static Graph, kind: NodeKind) -> CUgraphNode {
    let n: &'static Node = Box::leak(Box::new(Node { kind }));
    let h = n as *const Node as usize;
    registry().nodes.insert(h);
    g.nodes.lock().unwrap_or_else(|e| e.into_inner()).push(h);
    h as CUgraphNode
}

fn node(h: CUgraphNode) -> Res<&'static Node> {
    if h.is_null() || !registry().nodes.contains(&(h as usize)) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: registered nodes are leaked boxes.
    Ok(unsafe { &*(h as *const Node) })
}

/// An allocation node of `bytes` on device ordinal `dev` in graph `g`; its address.
fn alloc_node(g: &'static Graph, mut params: MemAllocNodeParams) -> Res<(CUgraphNode, CUdeviceptr)> {
    if params.bytesize == 0 || params.pool_props.location.type_ != CU_MEM_LOCATION_TYPE_DEVICE {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let physical = phys_of(params.pool_props.location.id)?.index;
    params.dptr = next_address(params.bytesize);
    let dptr = params.dptr;
    Ok((add_node(g, NodeKind::Alloc { params, physical }), dptr))
}

/// The graph a stream captures into, if it is capturing.
pub fn capturing(s: CUstream) -> Option<CUgraph> {
    registry().capturing.get(&(s as usize)).map(|&g| g as CUgraph)
}

/// `cuMemAllocAsync` on a capturing stream: an allocation node on device ordinal `dev`.
pub fn capture_alloc(g: CUgraph, dev: CUdevice, bytes: usize) -> Res<CUdeviceptr> {
    // SAFETY: all-zero is a valid MemAllocNodeParams (plain data, NULL pointers).
    let mut params: MemAllocNodeParams = unsafe { std::mem::zeroed() };
    params.pool_props.alloc_type = 1;
    params.pool_props.location = CUmemLocation { type_: CU_MEM_LOCATION_TYPE_DEVICE, id: dev };
    params.bytesize = bytes;
    alloc_node(graph(g)?, params).map(|(_, p)| p)
}

/// A kernel launch on a capturing stream: a kernel node of `ns`.
pub fn capture_kernel(g: CUgraph, ns: u64) -> Res {
    add_node(graph(g)?, NodeKind::Kernel { ns });
    Ok(())
}

/// `cuGraphAddKernelNode[_v2]`: `CUDA_KERNEL_NODE_PARAMS[_v2]` is { func (0), grid and block
/// (6 × u32, 8), shared (u32, 32), kernelParams (40), extra (48) } and, v2, { kern (56), ctx
/// (64) }; a NULL `func` in v2 names the library kernel `kern`.
unsafe fn add_kernel_node(out: *mut CUgraphNode, g: CUgraph, params: *const u8, v2: bool) -> Res {
    if out.is_null() || params.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let g = graph(g)?;
    // SAFETY: the caller's CUDA_KERNEL_NODE_PARAMS (v1: 56 bytes, v2: 72).
    let (func, kp, extra, kern) = unsafe {
        let r = |off: usize| std::ptr::read_unaligned(params.add(off) as *const *mut std::ffi::c_void);
        (r(0), r(40) as *mut *mut std::ffi::c_void, r(48) as *mut *mut std::ffi::c_void, if v2 { r(56) } else { std::ptr::null_mut() })
    };
    let f = if func.is_null() { kern } else { func };
    // SAFETY: the node's parameters, as the API requires of the caller.
    let ns = unsafe { crate::kernels::function_duration(f, kp, extra) }?;
    put(out, add_node(g, NodeKind::Kernel { ns }))
}

/// `cuMemFreeAsync` on a capturing stream: a free node.
pub fn capture_free(g: CUgraph, dptr: CUdeviceptr) -> Res {
    add_node(graph(g)?, NodeKind::Free { dptr });
    Ok(())
}

fn exec(h: CUgraphExec) -> Res<&'static Exec> {
    if h.is_null() || !registry().execs.contains(&(h as usize)) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: registered executable graphs are leaked boxes.
    Ok(unsafe { &*(h as *const Exec) })
}

unsafe fn instantiate(out: *mut CUgraphExec, g: CUgraph) -> Res {
    if out.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let g = graph(g)?;
    let nodes = g.nodes.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let freed: Vec<CUdeviceptr> = nodes
        .iter()
        .filter_map(|&n| match node(n as CUgraphNode).ok()?.kind {
            NodeKind::Free { dptr } => Some(dptr),
            _ => None,
        })
        .collect();
    let mut needs: Vec<(usize, u64, u64)> = Vec::new();
    for &n in &nodes {
        if let NodeKind::Alloc { params, physical } = &node(n as CUgraphNode)?.kind {
            let bytes = params.bytesize as u64;
            let back = if freed.contains(&params.dptr) { bytes } else { 0 };
            match needs.iter_mut().find(|(p, _, _)| p == physical) {
                Some(e) => {
                    e.1 += bytes;
                    e.2 += back;
                }
                None => needs.push((*physical, bytes, back)),
            }
        }
    }
    let kernels = nodes
        .iter()
        .filter_map(|&n| match node(n as CUgraphNode).ok()?.kind {
            NodeKind::Kernel { ns } => Some(ns),
            _ => None,
        })
        .collect();
    let e: &'static Exec = Box::leak(Box::new(Exec { kernels, needs, holding: AtomicBool::new(false) }));
    registry().execs.insert(e as *const Exec as usize);
    put(out, e as *const Exec as CUgraphExec)
}

/// A launch: the executable graph takes its memory from the pools, and gives back at the end
/// what its own free nodes free; what they do not free stays (once) until it is destroyed.
fn take_memory(e: &'static Exec) -> Res {
    let first = !e.holding.swap(true, Ordering::AcqRel);
    let mut taken: Vec<(usize, u64)> = Vec::new();
    for &(physical, need, _) in &e.needs {
        let p = pool(physical);
        let free = p.reserved.load(Ordering::Acquire).saturating_sub(p.used.load(Ordering::Acquire));
        let grow = need.saturating_sub(free);
        if grow > 0 {
            if let Err(err) = crate::stats::reserve(physical, grow) {
                for (ph, n) in taken {
                    pool(ph).used.fetch_sub(n, Ordering::AcqRel);
                }
                if first {
                    e.holding.store(false, Ordering::Release);
                }
                return Err(err);
            }
            let r = p.reserved.fetch_add(grow, Ordering::AcqRel) + grow;
            p.reserved_high.fetch_max(r, Ordering::AcqRel);
        }
        let u = p.used.fetch_add(need, Ordering::AcqRel) + need;
        p.used_high.fetch_max(u, Ordering::AcqRel);
        taken.push((physical, need));
    }
    for &(physical, need, back) in &e.needs {
        // the end of the launch: freed inside goes back; the rest is held once
        let give = if first { back } else { need };
        let _ = pool(physical).used.fetch_update(Ordering::AcqRel, Ordering::Acquire, |u| Some(u.saturating_sub(give)));
    }
    Ok(())
}

fn launch(h: CUgraphExec, s: CUstream, ptsz: bool, run: bool) -> Res {
    let t = crate::timeline::target(s, ptsz)?;
    let e = exec(h)?;
    take_memory(e)?;
    if run {
        for &ns in &e.kernels {
            crate::timeline::submit(&t, crate::timeline::Op::kernel(ns));
        }
        if !e.kernels.is_empty() {
            crate::timeline::mark_used(t.ctx.physical);
        }
    }
    Ok(())
}

unsafe fn mem_attribute(dev: CUdevice, attr: i32, value: *mut std::ffi::c_void, set: bool) -> Res {
    let p = pool(phys_of(dev)?.index);
    let cell = match attr {
        0 => &p.used,
        1 => &p.used_high,
        2 => &p.reserved,
        3 => &p.reserved_high,
        _ => return Err(CUDA_ERROR_INVALID_VALUE),
    };
    if set {
        // only the high-water marks can be reset, to 0
        if !matches!(attr, 1 | 3) || get(value as *const u64)? != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let now = if attr == 1 { &p.used } else { &p.reserved };
        cell.store(now.load(Ordering::Acquire), Ordering::Release);
        return Ok(());
    }
    put(value as *mut u64, cell.load(Ordering::Acquire))
}

cu_api! {
    fn cuGraphCreate(out: *mut CUgraph, flags: u32) {
        crate::devices::visible()?;
        if flags != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        put(out, new_graph())
    }
    fn cuGraphDestroy(g: CUgraph) {
        graph(g)?;
        registry().graphs.remove(&(g as usize));
        Ok(())
    }
    fn cuGraphAddMemAllocNode(out: *mut CUgraphNode, g: CUgraph, deps: *const CUgraphNode, ndeps: usize, params: *mut MemAllocNodeParams) {
        let _ = (deps, ndeps);
        if out.is_null() || params.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let (n, dptr) = alloc_node(graph(g)?, *params)?;
        (*params).dptr = dptr;
        put(out, n)
    }
    fn cuGraphAddMemFreeNode(out: *mut CUgraphNode, g: CUgraph, deps: *const CUgraphNode, ndeps: usize, dptr: CUdeviceptr) {
        let _ = (deps, ndeps);
        let g = graph(g)?;
        put(out, add_node(g, NodeKind::Free { dptr }))
    }
    fn cuGraphAddKernelNode(out: *mut CUgraphNode, g: CUgraph, deps: *const CUgraphNode, ndeps: usize, params: *const u8) {
        let _ = (deps, ndeps);
        add_kernel_node(out, g, params, false)
    }
    fn cuGraphAddKernelNode_v2(out: *mut CUgraphNode, g: CUgraph, deps: *const CUgraphNode, ndeps: usize, params: *const u8) {
        let _ = (deps, ndeps);
        add_kernel_node(out, g, params, true)
    }
    fn cuGraphMemAllocNodeGetParams(n: CUgraphNode, params: *mut MemAllocNodeParams) {
        match &node(n)?.kind {
            NodeKind::Alloc { params: p, .. } => put(params, *p),
            _ => Err(CUDA_ERROR_INVALID_VALUE),
        }
    }
    fn cuGraphNodeGetType(n: CUgraphNode, kind: *mut i32) {
        let k = match node(n)?.kind {
            NodeKind::Alloc { .. } => NODE_TYPE_MEM_ALLOC,
            NodeKind::Free { .. } => NODE_TYPE_MEM_FREE,
            NodeKind::Kernel { .. } => NODE_TYPE_KERNEL,
        };
        let _ = NODE_TYPE_EMPTY;
        put(kind, k)
    }
    /// NULL `nodes`: the count only; otherwise up to `*count` handles, and `*count` set to how
    /// many were written.
    fn cuGraphGetNodes(g: CUgraph, nodes: *mut CUgraphNode, count: *mut usize) {
        let all = graph(g)?.nodes.lock().unwrap_or_else(|e| e.into_inner()).clone();
        if count.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        if nodes.is_null() {
            return put(count, all.len());
        }
        let n = (*count).min(all.len());
        for (i, &h) in all.iter().take(n).enumerate() {
            *nodes.add(i) = h as CUgraphNode;
        }
        put(count, n)
    }
    fn cuGraphInstantiateWithFlags(out: *mut CUgraphExec, g: CUgraph, flags: u64) {
        let _ = flags;
        instantiate(out, g)
    }
    fn cuGraphInstantiateWithParams(out: *mut CUgraphExec, g: CUgraph, params: *mut std::ffi::c_void) {
        let _ = params;
        instantiate(out, g)
    }
    fn cuGraphInstantiateWithParams_ptsz(out: *mut CUgraphExec, g: CUgraph, params: *mut std::ffi::c_void) {
        let _ = params;
        instantiate(out, g)
    }
    fn cuGraphExecDestroy(h: CUgraphExec) {
        let e = exec(h)?;
        registry().execs.remove(&(h as usize));
        if e.holding.swap(false, Ordering::AcqRel) {
            for &(physical, need, back) in &e.needs {
                let held = need - back;
                let _ = pool(physical).used.fetch_update(Ordering::AcqRel, Ordering::Acquire, |u| Some(u.saturating_sub(held)));
            }
        }
        Ok(())
    }
    fn cuGraphUpload(h: CUgraphExec, s: CUstream) { launch(h, s, false, false) }
    fn cuGraphUpload_ptsz(h: CUgraphExec, s: CUstream) { launch(h, s, true, false) }
    fn cuGraphLaunch(h: CUgraphExec, s: CUstream) { launch(h, s, false, true) }
    fn cuGraphLaunch_ptsz(h: CUgraphExec, s: CUstream) { launch(h, s, true, true) }
    fn cuDeviceGraphMemTrim(dev: CUdevice) {
        let physical = phys_of(dev)?.index;
        let p = pool(physical);
        let used = p.used.load(Ordering::Acquire);
        if let Ok(before) = p.reserved.fetch_update(Ordering::AcqRel, Ordering::Acquire, |r| (r > used).then_some(used)) {
            crate::stats::release_bytes(physical, before - used);
        }
        Ok(())
    }
    fn cuDeviceGetGraphMemAttribute(dev: CUdevice, attr: i32, value: *mut std::ffi::c_void) { mem_attribute(dev, attr, value, false) }
    fn cuDeviceSetGraphMemAttribute(dev: CUdevice, attr: i32, value: *mut std::ffi::c_void) { mem_attribute(dev, attr, value, true) }

    /// Capture on a created stream (the default streams cannot be captured).
    fn cuStreamBeginCapture_v2(s: CUstream, mode: u32) {
        let _ = mode;
        begin_capture(s)
    }
    fn cuStreamBeginCapture_v2_ptsz(s: CUstream, mode: u32) {
        let _ = mode;
        begin_capture(s)
    }
    fn cuStreamEndCapture(s: CUstream, out: *mut CUgraph) { end_capture(s, out) }
    fn cuStreamEndCapture_ptsz(s: CUstream, out: *mut CUgraph) { end_capture(s, out) }
}

/// `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED`, `CUDA_ERROR_ILLEGAL_STATE`
const STREAM_CAPTURE_UNSUPPORTED: CUresult = 900;
const ILLEGAL_STATE: CUresult = 401;

fn begin_capture(s: CUstream) -> Res {
    if crate::streams::lookup(s)?.is_none() {
        return Err(STREAM_CAPTURE_UNSUPPORTED);
    }
    if capturing(s).is_some() {
        return Err(ILLEGAL_STATE);
    }
    let g = new_graph();
    registry().capturing.insert(s as usize, g as usize);
    Ok(())
}

unsafe fn end_capture(s: CUstream, out: *mut CUgraph) -> Res {
    crate::streams::lookup(s)?;
    if out.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    match registry().capturing.remove(&(s as usize)) {
        Some(g) => put(out, g as CUgraph),
        None => Err(ILLEGAL_STATE),
    }
}

/// `CU_STREAM_CAPTURE_STATUS_NONE` / `_ACTIVE`.
const CAPTURE_STATUS_NONE: u32 = 0;
const CAPTURE_STATUS_ACTIVE: u32 = 1;

/// `CUgraphEdgeData`: all-default (zero) edge data, for `cuStreamGetCaptureInfo_v3`.
static DEFAULT_EDGE: [u8; 8] = [0; 8];

/// `cuStreamGetCaptureInfo[_v2|_v3][_ptsz]`: the capture status of a stream, from what
/// `cuStreamBeginCapture`/`cuStreamEndCapture` recorded. While capturing: the sequence id (the
/// graph's handle: unique, graphs are never reused), the graph, and the stream's dependency set —
/// a capture on one stream is a chain, so that is the last captured node (none before the first).
/// The dependency array points into the graph's node list and stays valid until the next node
/// is captured (the driver documents it as valid until the next call on the stream). Everything
/// but the status is written only while capturing, as the driver documents these outputs as
/// meaningful only for `CU_STREAM_CAPTURE_STATUS_ACTIVE`.
unsafe fn capture_info(
    s: CUstream,
    status: *mut u32,
    id: *mut u64,
    graph_out: *mut CUgraph,
    deps: *mut *const CUgraphNode,
    edges: *mut *const std::ffi::c_void,
    count: *mut usize,
) -> Res {
    crate::streams::lookup(s)?;
    if status.is_null() || (!edges.is_null() && deps.is_null()) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let Some(g) = capturing(s) else {
        return put(status, CAPTURE_STATUS_NONE);
    };
    put(status, CAPTURE_STATUS_ACTIVE)?;
    put_opt(id, g as u64);
    put_opt(graph_out, g);
    let gr = graph(g)?;
    let nodes = gr.nodes.lock().unwrap_or_else(|e| e.into_inner());
    let (ptr, n) = match nodes.last() {
        Some(last) => (last as *const usize as *const CUgraphNode, 1),
        None => (std::ptr::null(), 0),
    };
    put_opt(deps, ptr);
    put_opt(edges, if n == 0 { std::ptr::null() } else { DEFAULT_EDGE.as_ptr() as *const std::ffi::c_void });
    put_opt(count, n);
    Ok(())
}

thread_local! {
    /// This thread's `CUstreamCaptureMode`: `CU_STREAM_CAPTURE_MODE_GLOBAL` (0) at first.
    static CAPTURE_MODE: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

/// `cuThreadExchangeStreamCaptureMode`: sets the calling thread's capture mode to `*mode`
/// (GLOBAL 0, THREAD_LOCAL 1, RELAXED 2) and returns the previous one in `*mode`.
unsafe fn exchange_capture_mode(mode: *mut u32) -> Res {
    if mode.is_null() || *mode > 2 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let old = CAPTURE_MODE.with(|m| m.replace(*mode));
    put(mode, old)
}

cu_api! {
    fn cuStreamGetCaptureInfo(s: CUstream, status: *mut u32, id: *mut u64) {
        capture_info(s, status, id, std::ptr::null_mut(), std::ptr::null_mut(), std::ptr::null_mut(), std::ptr::null_mut())
    }
    fn cuStreamGetCaptureInfo_ptsz(s: CUstream, status: *mut u32, id: *mut u64) {
        capture_info(s, status, id, std::ptr::null_mut(), std::ptr::null_mut(), std::ptr::null_mut(), std::ptr::null_mut())
    }
    fn cuStreamGetCaptureInfo_v2(s: CUstream, status: *mut u32, id: *mut u64, graph_out: *mut CUgraph, deps: *mut *const CUgraphNode, count: *mut usize) {
        capture_info(s, status, id, graph_out, deps, std::ptr::null_mut(), count)
    }
    fn cuStreamGetCaptureInfo_v2_ptsz(s: CUstream, status: *mut u32, id: *mut u64, graph_out: *mut CUgraph, deps: *mut *const CUgraphNode, count: *mut usize) {
        capture_info(s, status, id, graph_out, deps, std::ptr::null_mut(), count)
    }
    fn cuStreamGetCaptureInfo_v3(s: CUstream, status: *mut u32, id: *mut u64, graph_out: *mut CUgraph, deps: *mut *const CUgraphNode, edges: *mut *const std::ffi::c_void, count: *mut usize) {
        capture_info(s, status, id, graph_out, deps, edges, count)
    }
    fn cuStreamGetCaptureInfo_v3_ptsz(s: CUstream, status: *mut u32, id: *mut u64, graph_out: *mut CUgraph, deps: *mut *const CUgraphNode, edges: *mut *const std::ffi::c_void, count: *mut usize) {
        capture_info(s, status, id, graph_out, deps, edges, count)
    }
    fn cuThreadExchangeStreamCaptureMode(mode: *mut u32) { exchange_capture_mode(mode) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capture_info_mode_exchange_and_unmodelled_calls() {
        use crate::context::*;
        use crate::pools::*;
        use crate::streams::*;
        use crate::vmm::*;
        let _g = crate::DRIVER_TESTS.lock().unwrap_or_else(|e| e.into_inner());
        unsafe {
            assert_eq!(crate::devices::cuInit(0), CUDA_SUCCESS);
            let mut ctx: CUcontext = std::ptr::null_mut();
            assert_eq!(cuCtxCreate_v2(&mut ctx, 0, 0), CUDA_SUCCESS);
            let mut s: CUstream = std::ptr::null_mut();
            assert_eq!(cuStreamCreate(&mut s, 0), CUDA_SUCCESS);
            let null = std::ptr::null_mut();
            // not capturing: status NONE, the other outputs untouched
            let (mut st, mut id, mut g, mut deps, mut edges, mut n) =
                (7u32, 9u64, null as CUgraph, std::ptr::null::<CUgraphNode>(), std::ptr::null::<std::ffi::c_void>(), 5usize);
            assert_eq!(cuStreamGetCaptureInfo(s, &mut st, &mut id), CUDA_SUCCESS);
            assert_eq!((st, id), (CAPTURE_STATUS_NONE, 9));
            assert_eq!(cuStreamGetCaptureInfo_v3_ptsz(std::ptr::null_mut(), &mut st, &mut id, &mut g, &mut deps, &mut edges, &mut n), CUDA_SUCCESS);
            assert_eq!((st, n), (CAPTURE_STATUS_NONE, 5));
            assert_eq!(cuStreamGetCaptureInfo(0x1234 as CUstream, &mut st, &mut id), CUDA_ERROR_INVALID_HANDLE);
            assert_eq!(cuStreamGetCaptureInfo(s, null as *mut u32, &mut id), CUDA_ERROR_INVALID_VALUE);
            // capturing: ACTIVE, the graph, no dependency before the first node, then the last node
            assert_eq!(cuStreamBeginCapture_v2(s, 0), CUDA_SUCCESS);
            assert_eq!(cuStreamGetCaptureInfo_v2(s, &mut st, &mut id, &mut g, &mut deps, &mut n), CUDA_SUCCESS);
            assert_eq!((st, n, id), (CAPTURE_STATUS_ACTIVE, 0, g as u64));
            assert!(!g.is_null());
            let mut p: CUdeviceptr = 0;
            assert_eq!(cuMemAllocAsync(&mut p, 1 << 20, s), CUDA_SUCCESS);
            assert_eq!(cuStreamGetCaptureInfo_v3(s, &mut st, &mut id, &mut g, &mut deps, &mut edges, &mut n), CUDA_SUCCESS);
            assert_eq!((st, n), (CAPTURE_STATUS_ACTIVE, 1));
            assert_eq!(cuGraphNodeGetType(*deps, &mut 0i32 as *mut i32), CUDA_SUCCESS);
            assert!(!edges.is_null());
            let mut out: CUgraph = null;
            assert_eq!(cuStreamEndCapture(s, &mut out), CUDA_SUCCESS);
            assert_eq!(out, g);
            assert_eq!(cuStreamGetCaptureInfo_ptsz(s, &mut st, &mut id), CUDA_SUCCESS);
            assert_eq!(st, CAPTURE_STATUS_NONE);
            // capture mode: per thread, GLOBAL at first
            let mut mode = 2u32;
            assert_eq!(cuThreadExchangeStreamCaptureMode(&mut mode), CUDA_SUCCESS);
            assert_eq!(mode, 0);
            assert_eq!(cuThreadExchangeStreamCaptureMode(&mut mode), CUDA_SUCCESS);
            assert_eq!(mode, 2);
            std::thread::spawn(|| {
                let mut m = 1u32;
                assert_eq!(cuThreadExchangeStreamCaptureMode(&mut m), CUDA_SUCCESS);
                assert_eq!(m, 0);
            })
            .join()
            .unwrap();
            let mut bad = 3u32;
            assert_eq!(cuThreadExchangeStreamCaptureMode(&mut bad), CUDA_ERROR_INVALID_VALUE);
            assert_eq!(cuThreadExchangeStreamCaptureMode(null as *mut u32), CUDA_ERROR_INVALID_VALUE);
            // stream memory operations and shareable handles are not modelled
            assert_eq!(cuStreamWriteValue32_v2(s, 0, 1, 0), CUDA_ERROR_NOT_SUPPORTED);
            assert_eq!(cuStreamWriteValue32(0x1234 as CUstream, 0, 1, 0), CUDA_ERROR_INVALID_HANDLE);
            let mut fd = 0i32;
            assert_eq!(
                cuMemExportToShareableHandle(&mut fd as *mut i32 as *mut std::ffi::c_void, 0xdead, 1, 0),
                CUDA_ERROR_INVALID_VALUE
            );
            let mut h: CUmemGenericAllocationHandle = 0;
            assert_eq!(
                cuMemImportFromShareableHandle(&mut h, 3 as *mut std::ffi::c_void, 1),
                CUDA_ERROR_NOT_SUPPORTED
            );
            assert_eq!(cuStreamDestroy_v2(s), CUDA_SUCCESS);
            assert_eq!(cuCtxDestroy_v2(ctx), CUDA_SUCCESS);
        }
    }
}
