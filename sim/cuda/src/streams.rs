//! Streams and events. Everything this driver does completes before the call returns, so
//! streams only remember their context (which device stream-ordered allocations land on) and
//! events only remember when they were recorded.

use crate::context::{self, Ctx};
use crate::types::*;
use std::collections::HashSet;
use std::sync::{Mutex, OnceLock, RwLock};
use std::time::Instant;

pub struct Stream {
    pub ctx: &'static Ctx,
    pub flags: u32,
    pub priority: i32,
}

pub struct Event {
    pub flags: u32,
    recorded: Mutex<Option<Instant>>,
}

/// `CU_STREAM_LEGACY` and `CU_STREAM_PER_THREAD`.
pub const STREAM_LEGACY: usize = 1;
pub const STREAM_PER_THREAD: usize = 2;

static STREAMS: OnceLock<RwLock<HashSet<usize>>> = OnceLock::new();
static EVENTS: OnceLock<RwLock<HashSet<usize>>> = OnceLock::new();

fn set(s: &'static OnceLock<RwLock<HashSet<usize>>>) -> &'static RwLock<HashSet<usize>> {
    s.get_or_init(|| RwLock::new(HashSet::new()))
}

fn contains(s: &'static OnceLock<RwLock<HashSet<usize>>>, h: usize) -> bool {
    set(s)
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .contains(&h)
}

fn remove(s: &'static OnceLock<RwLock<HashSet<usize>>>, h: usize) -> bool {
    set(s).write().unwrap_or_else(|e| e.into_inner()).remove(&h)
}

fn insert(s: &'static OnceLock<RwLock<HashSet<usize>>>, h: usize) {
    set(s).write().unwrap_or_else(|e| e.into_inner()).insert(h);
}

/// A created stream, or `None` for the NULL / legacy / per-thread default streams; an unknown
/// handle is `CUDA_ERROR_INVALID_HANDLE`.
pub fn lookup(h: CUstream) -> Res<Option<&'static Stream>> {
    crate::devices::visible()?;
    match h as usize {
        0 | STREAM_LEGACY | STREAM_PER_THREAD => Ok(None),
        x if contains(&STREAMS, x) => Ok(Some(unsafe { &*(x as *const Stream) })),
        _ => Err(CUDA_ERROR_INVALID_HANDLE),
    }
}

/// The context of a stream: its own, or the current one for the default streams.
pub fn ctx_of(h: CUstream) -> Res<&'static Ctx> {
    match lookup(h)? {
        Some(s) if s.ctx.is_alive() => Ok(s.ctx),
        Some(_) => Err(CUDA_ERROR_INVALID_CONTEXT),
        None => context::current(),
    }
}

fn event(h: CUevent) -> Res<&'static Event> {
    crate::devices::visible()?;
    if h.is_null() || !contains(&EVENTS, h as usize) {
        return Err(CUDA_ERROR_INVALID_HANDLE);
    }
    Ok(unsafe { &*(h as *const Event) })
}

unsafe fn create_stream(ph: *mut CUstream, flags: u32, priority: i32) -> Res {
    if ph.is_null() || flags > 1 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let ctx = context::current()?;
    let s: &'static Stream = Box::leak(Box::new(Stream {
        ctx,
        flags,
        priority: priority.clamp(-5, 0),
    }));
    let h = s as *const Stream as usize;
    insert(&STREAMS, h);
    put(ph, h as CUstream)
}

fn destroy_stream(h: CUstream) -> Res {
    crate::devices::visible()?;
    if !remove(&STREAMS, h as usize) {
        return Err(CUDA_ERROR_INVALID_HANDLE);
    }
    Ok(())
}

unsafe fn stream_ctx(h: CUstream, pctx: *mut CUcontext) -> Res {
    if pctx.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let c = ctx_of(h)?;
    put(pctx, c.handle())
}

unsafe fn stream_ctx_v2(
    h: CUstream,
    pctx: *mut CUcontext,
    pgreen: *mut *mut std::ffi::c_void,
) -> Res {
    stream_ctx(h, pctx)?;
    put_opt(pgreen, std::ptr::null_mut());
    Ok(())
}

fn record(e: CUevent, s: CUstream) -> Res {
    let ev = event(e)?;
    lookup(s)?;
    *ev.recorded.lock().unwrap_or_else(|p| p.into_inner()) = Some(Instant::now());
    Ok(())
}

fn wait_event(s: CUstream, e: CUevent, flags: u32) -> Res {
    let _ = flags;
    lookup(s)?;
    event(e)?;
    Ok(())
}

unsafe fn elapsed(ms: *mut f32, start: CUevent, end: CUevent) -> Res {
    let (a, b) = (event(start)?, event(end)?);
    if ms.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // CU_EVENT_DISABLE_TIMING = 2
    if a.flags & 2 != 0 || b.flags & 2 != 0 {
        return Err(CUDA_ERROR_INVALID_HANDLE);
    }
    let ta =
        (*a.recorded.lock().unwrap_or_else(|p| p.into_inner())).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
    let tb =
        (*b.recorded.lock().unwrap_or_else(|p| p.into_inner())).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
    let d = if tb >= ta {
        (tb - ta).as_secs_f32() * 1000.0
    } else {
        -((ta - tb).as_secs_f32() * 1000.0)
    };
    put(ms, d)
}

fn destroy_event(e: CUevent) -> Res {
    crate::devices::visible()?;
    if !remove(&EVENTS, e as usize) {
        return Err(CUDA_ERROR_INVALID_HANDLE);
    }
    Ok(())
}

pub type HostFn = Option<unsafe extern "C" fn(*mut std::ffi::c_void)>;
pub type StreamCallback = Option<unsafe extern "C" fn(CUstream, CUresult, *mut std::ffi::c_void)>;

/// Host functions run at once, on the calling thread: the stream has nothing pending.
unsafe fn host_fn(s: CUstream, f: HostFn, data: *mut std::ffi::c_void) -> Res {
    lookup(s)?;
    let f = f.ok_or(CUDA_ERROR_INVALID_VALUE)?;
    f(data);
    Ok(())
}

unsafe fn add_callback(
    s: CUstream,
    f: StreamCallback,
    data: *mut std::ffi::c_void,
    flags: u32,
) -> Res {
    lookup(s)?;
    let f = f.ok_or(CUDA_ERROR_INVALID_VALUE)?;
    if flags != 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    f(s, CUDA_SUCCESS, data);
    Ok(())
}

/// Never capturing: `CU_STREAM_CAPTURE_STATUS_NONE`.
/// `CU_STREAM_CAPTURE_STATUS_ACTIVE` (1) while `cuStreamBeginCapture` captures into a graph.
unsafe fn is_capturing(s: CUstream, status: *mut u32) -> Res {
    lookup(s)?;
    put(status, crate::graphs::capturing(s).is_some() as u32)
}

/// A created stream's id is its handle; the default streams get 1 (legacy) and 2 (per-thread).
unsafe fn stream_id(s: CUstream, id: *mut u64) -> Res {
    let v = match lookup(s)? {
        Some(st) => st as *const Stream as u64,
        None if s as usize == STREAM_PER_THREAD => 2,
        None => 1,
    };
    put(id, v)
}

cu_api! {
    fn cuStreamIsCapturing(s: CUstream, status: *mut u32) { is_capturing(s, status) }
    fn cuStreamIsCapturing_ptsz(s: CUstream, status: *mut u32) { is_capturing(s, status) }
    fn cuStreamGetId(s: CUstream, id: *mut u64) { stream_id(s, id) }
    fn cuStreamGetId_ptsz(s: CUstream, id: *mut u64) { stream_id(s, id) }
    fn cuLaunchHostFunc(s: CUstream, f: HostFn, data: *mut std::ffi::c_void) { host_fn(s, f, data) }
    fn cuLaunchHostFunc_ptsz(s: CUstream, f: HostFn, data: *mut std::ffi::c_void) { host_fn(s, f, data) }
    fn cuLaunchHostFunc_v2(s: CUstream, f: HostFn, data: *mut std::ffi::c_void, sync_mode: u32) {
        let _ = sync_mode;
        host_fn(s, f, data)
    }
    fn cuLaunchHostFunc_v2_ptsz(s: CUstream, f: HostFn, data: *mut std::ffi::c_void, sync_mode: u32) {
        let _ = sync_mode;
        host_fn(s, f, data)
    }
    fn cuStreamAddCallback(s: CUstream, f: StreamCallback, data: *mut std::ffi::c_void, flags: u32) {
        add_callback(s, f, data, flags)
    }
    fn cuStreamAddCallback_ptsz(s: CUstream, f: StreamCallback, data: *mut std::ffi::c_void, flags: u32) {
        add_callback(s, f, data, flags)
    }

    fn cuStreamCreate(ph: *mut CUstream, flags: u32) { create_stream(ph, flags, 0) }
    fn cuStreamCreateWithPriority(ph: *mut CUstream, flags: u32, priority: i32) { create_stream(ph, flags, priority) }
    fn cuStreamDestroy(h: CUstream) { destroy_stream(h) }
    fn cuStreamDestroy_v2(h: CUstream) { destroy_stream(h) }
    fn cuStreamSynchronize(h: CUstream) {
        ctx_of(h)?;
        crate::pools::synchronised();
        Ok(())
    }
    fn cuStreamSynchronize_ptsz(h: CUstream) {
        ctx_of(h)?;
        crate::pools::synchronised();
        Ok(())
    }
    fn cuStreamQuery(h: CUstream) { ctx_of(h).map(|_| ()) }
    fn cuStreamQuery_ptsz(h: CUstream) { ctx_of(h).map(|_| ()) }
    fn cuStreamGetCtx(h: CUstream, pctx: *mut CUcontext) { stream_ctx(h, pctx) }
    fn cuStreamGetCtx_ptsz(h: CUstream, pctx: *mut CUcontext) { stream_ctx(h, pctx) }
    fn cuStreamGetCtx_v2(h: CUstream, pctx: *mut CUcontext, pgreen: *mut *mut std::ffi::c_void) { stream_ctx_v2(h, pctx, pgreen) }
    fn cuStreamGetCtx_v2_ptsz(h: CUstream, pctx: *mut CUcontext, pgreen: *mut *mut std::ffi::c_void) { stream_ctx_v2(h, pctx, pgreen) }
    fn cuStreamWaitEvent(h: CUstream, e: CUevent, flags: u32) { wait_event(h, e, flags) }
    fn cuStreamWaitEvent_ptsz(h: CUstream, e: CUevent, flags: u32) { wait_event(h, e, flags) }

    fn cuStreamGetFlags(h: CUstream, flags: *mut u32) {
        let f = lookup(h)?.map_or(0, |s| s.flags);
        put(flags, f)
    }
    fn cuStreamGetFlags_ptsz(h: CUstream, flags: *mut u32) {
        let f = lookup(h)?.map_or(0, |s| s.flags);
        put(flags, f)
    }
    fn cuStreamGetPriority(h: CUstream, priority: *mut i32) {
        let p = lookup(h)?.map_or(0, |s| s.priority);
        put(priority, p)
    }
    fn cuStreamGetPriority_ptsz(h: CUstream, priority: *mut i32) {
        let p = lookup(h)?.map_or(0, |s| s.priority);
        put(priority, p)
    }

    fn cuEventCreate(ph: *mut CUevent, flags: u32) {
        if ph.is_null() || flags > 0xf {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        context::current()?;
        let e: &'static Event = Box::leak(Box::new(Event { flags, recorded: Mutex::new(None) }));
        let h = e as *const Event as usize;
        insert(&EVENTS, h);
        put(ph, h as CUevent)
    }

    fn cuEventRecord(e: CUevent, s: CUstream) { record(e, s) }
    fn cuEventRecord_ptsz(e: CUevent, s: CUstream) { record(e, s) }
    fn cuEventSynchronize(e: CUevent) {
        event(e)?;
        crate::pools::synchronised();
        Ok(())
    }
    fn cuEventQuery(e: CUevent) { event(e).map(|_| ()) }
    fn cuEventDestroy(e: CUevent) { destroy_event(e) }
    fn cuEventDestroy_v2(e: CUevent) { destroy_event(e) }
    fn cuEventElapsedTime(ms: *mut f32, start: CUevent, end: CUevent) { elapsed(ms, start, end) }
    fn cuEventElapsedTime_v2(ms: *mut f32, start: CUevent, end: CUevent) { elapsed(ms, start, end) }
}

/// Stream memory operations (`cuStreamWriteValue32`, `cuStreamWaitValue32`): this driver reports
/// `CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_MEM_OPS_V1` (92) as 0, and the real driver answers
/// `CUDA_ERROR_NOT_SUPPORTED` on such a device; an unknown stream is still `INVALID_HANDLE`.
fn stream_mem_op(s: CUstream, flags: u32) -> Res {
    let _ = flags;
    ctx_of(s)?;
    Err(CUDA_ERROR_NOT_SUPPORTED)
}

cu_api! {
    fn cuStreamWriteValue32(s: CUstream, addr: CUdeviceptr, value: u32, flags: u32) { let _ = (addr, value); stream_mem_op(s, flags) }
    fn cuStreamWriteValue32_ptsz(s: CUstream, addr: CUdeviceptr, value: u32, flags: u32) { let _ = (addr, value); stream_mem_op(s, flags) }
    fn cuStreamWriteValue32_v2(s: CUstream, addr: CUdeviceptr, value: u32, flags: u32) { let _ = (addr, value); stream_mem_op(s, flags) }
    fn cuStreamWriteValue32_v2_ptsz(s: CUstream, addr: CUdeviceptr, value: u32, flags: u32) { let _ = (addr, value); stream_mem_op(s, flags) }
    fn cuStreamWaitValue32(s: CUstream, addr: CUdeviceptr, value: u32, flags: u32) { let _ = (addr, value); stream_mem_op(s, flags) }
    fn cuStreamWaitValue32_ptsz(s: CUstream, addr: CUdeviceptr, value: u32, flags: u32) { let _ = (addr, value); stream_mem_op(s, flags) }
    fn cuStreamWaitValue32_v2(s: CUstream, addr: CUdeviceptr, value: u32, flags: u32) { let _ = (addr, value); stream_mem_op(s, flags) }
    fn cuStreamWaitValue32_v2_ptsz(s: CUstream, addr: CUdeviceptr, value: u32, flags: u32) { let _ = (addr, value); stream_mem_op(s, flags) }
}
