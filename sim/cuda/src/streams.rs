//! Streams and events: their handles and contexts, and the calls that put marks on the
//! simulated timeline (`timeline`): an event is stamped with the time its stream reaches it,
//! queries answer `CUDA_ERROR_NOT_READY` until then, synchronisations sleep until then, host
//! functions run on the worker (`hostfn`) when their stream reaches them.

use crate::context::{self, Ctx};
use crate::types::*;
use std::collections::HashSet;
use std::sync::atomic::AtomicU64;
use std::sync::{OnceLock, RwLock};
use crate::timeline::{self, Op};

pub struct Stream {
    pub ctx: &'static Ctx,
    pub flags: u32,
    pub priority: i32,
}

pub struct Event {
    pub flags: u32,
    /// When its stream reaches it (a `timeline::Stamp`); 0 until first recorded (see
    /// `timeline::submit_event`: it may still move to the start of its stream's next work).
    recorded: AtomicU64,
    /// The solo start of the kernel submitted right after it on its stream (0: none yet).
    with: AtomicU64,
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

fn record(e: CUevent, s: CUstream, ptsz: bool) -> Res {
    let ev = event(e)?;
    let t = timeline::target(s, ptsz)?;
    timeline::submit_event(&t, &ev.recorded, &ev.with);
    Ok(())
}

fn stamp(ev: &Event) -> Option<timeline::Stamp> {
    use std::sync::atomic::Ordering::Acquire;
    timeline::Stamp::unpack(ev.recorded.load(Acquire), ev.with.load(Acquire))
}

/// `cuStreamWaitEvent`: later work on the stream starts no earlier than the event's time (an
/// event never recorded is complete: nothing to wait for).
fn wait_event(s: CUstream, e: CUevent, flags: u32, ptsz: bool) -> Res {
    let _ = flags;
    let t = timeline::target(s, ptsz)?;
    let after = stamp(event(e)?).map_or(0, |st| st.on(t.ctx.physical));
    timeline::submit(&t, Op { after, ..Op::mark() });
    Ok(())
}

/// `cuEventQuery`: `CUDA_ERROR_NOT_READY` until its stream has reached it; an event never
/// recorded is complete (`CUDA_SUCCESS`, as the driver documents).
fn query_event(e: CUevent) -> Res {
    match stamp(event(e)?) {
        Some(st) if !st.reached() => Err(CUDA_ERROR_NOT_READY),
        _ => Ok(()),
    }
}

fn sync_event(e: CUevent) -> Res {
    let ev = event(e)?;
    if let Some(st) = stamp(ev) {
        timeline::sleep_until(st.p, st.t, || stamp(ev).is_none_or(|st| st.reached()));
    }
    crate::pools::synchronised();
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
    let ta = stamp(a).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
    let tb = stamp(b).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
    if !ta.reached() || !tb.reached() {
        return Err(CUDA_ERROR_NOT_READY);
    }
    let d = (tb.real() as i128 - ta.real() as i128) as f64 / 1e6;
    put(ms, d as f32)
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

/// The application's function and data, moved to the worker thread.
struct Raw(usize, usize, usize);
// SAFETY: plain addresses the application handed over for another thread to call, as the
// driver does (host functions run on a driver thread).
unsafe impl Send for Raw {}

/// Schedules `run` on the worker at the time the stream reaches it (now, if the stream has
/// nothing pending); later work on the stream waits for it.
fn submit_host(s: CUstream, ptsz: bool, run: Box<dyn FnOnce() + Send>) -> Res {
    let t = timeline::target(s, ptsz)?;
    let (at, _) = timeline::submit(&t, Op { host: true, ..Op::mark() });
    crate::hostfn::push(at, crate::hostfn::Job { key: t.key, ctx: t.ctx.id, p: t.ctx.physical, run });
    Ok(())
}

unsafe fn host_fn(s: CUstream, f: HostFn, data: *mut std::ffi::c_void, ptsz: bool) -> Res {
    lookup(s)?;
    let f = f.ok_or(CUDA_ERROR_INVALID_VALUE)?;
    let raw = Raw(f as usize, data as usize, 0);
    submit_host(
        s,
        ptsz,
        Box::new(move || {
            let raw = raw;
            // SAFETY: the application's host function and its argument, as given.
            unsafe {
                let f: unsafe extern "C" fn(*mut std::ffi::c_void) = std::mem::transmute(raw.0);
                f(raw.1 as *mut std::ffi::c_void)
            }
        }),
    )
}

unsafe fn add_callback(
    s: CUstream,
    f: StreamCallback,
    data: *mut std::ffi::c_void,
    flags: u32,
    ptsz: bool,
) -> Res {
    lookup(s)?;
    let f = f.ok_or(CUDA_ERROR_INVALID_VALUE)?;
    if flags != 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let raw = Raw(f as usize, data as usize, s as usize);
    submit_host(
        s,
        ptsz,
        Box::new(move || {
            let raw = raw;
            // SAFETY: the application's callback, its stream and argument, as given.
            unsafe {
                let f: unsafe extern "C" fn(CUstream, CUresult, *mut std::ffi::c_void) = std::mem::transmute(raw.0);
                f(raw.2 as CUstream, CUDA_SUCCESS, raw.1 as *mut std::ffi::c_void)
            }
        }),
    )
}

fn stream_sync(h: CUstream, ptsz: bool) -> Res {
    let t = timeline::target(h, ptsz)?;
    timeline::stream_sync(&t);
    crate::pools::synchronised();
    Ok(())
}

fn stream_query(h: CUstream, ptsz: bool) -> Res {
    let t = timeline::target(h, ptsz)?;
    if timeline::stream_query(&t) {
        Ok(())
    } else {
        Err(CUDA_ERROR_NOT_READY)
    }
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
    fn cuLaunchHostFunc(s: CUstream, f: HostFn, data: *mut std::ffi::c_void) { host_fn(s, f, data, false) }
    fn cuLaunchHostFunc_ptsz(s: CUstream, f: HostFn, data: *mut std::ffi::c_void) { host_fn(s, f, data, true) }
    fn cuLaunchHostFunc_v2(s: CUstream, f: HostFn, data: *mut std::ffi::c_void, sync_mode: u32) {
        let _ = sync_mode;
        host_fn(s, f, data, false)
    }
    fn cuLaunchHostFunc_v2_ptsz(s: CUstream, f: HostFn, data: *mut std::ffi::c_void, sync_mode: u32) {
        let _ = sync_mode;
        host_fn(s, f, data, true)
    }
    fn cuStreamAddCallback(s: CUstream, f: StreamCallback, data: *mut std::ffi::c_void, flags: u32) {
        add_callback(s, f, data, flags, false)
    }
    fn cuStreamAddCallback_ptsz(s: CUstream, f: StreamCallback, data: *mut std::ffi::c_void, flags: u32) {
        add_callback(s, f, data, flags, true)
    }

    fn cuStreamCreate(ph: *mut CUstream, flags: u32) { create_stream(ph, flags, 0) }
    fn cuStreamCreateWithPriority(ph: *mut CUstream, flags: u32, priority: i32) { create_stream(ph, flags, priority) }
    fn cuStreamDestroy(h: CUstream) { destroy_stream(h) }
    fn cuStreamDestroy_v2(h: CUstream) { destroy_stream(h) }
    fn cuStreamSynchronize(h: CUstream) { stream_sync(h, false) }
    fn cuStreamSynchronize_ptsz(h: CUstream) { stream_sync(h, true) }
    fn cuStreamQuery(h: CUstream) { stream_query(h, false) }
    fn cuStreamQuery_ptsz(h: CUstream) { stream_query(h, true) }
    fn cuStreamGetCtx(h: CUstream, pctx: *mut CUcontext) { stream_ctx(h, pctx) }
    fn cuStreamGetCtx_ptsz(h: CUstream, pctx: *mut CUcontext) { stream_ctx(h, pctx) }
    fn cuStreamGetCtx_v2(h: CUstream, pctx: *mut CUcontext, pgreen: *mut *mut std::ffi::c_void) { stream_ctx_v2(h, pctx, pgreen) }
    fn cuStreamGetCtx_v2_ptsz(h: CUstream, pctx: *mut CUcontext, pgreen: *mut *mut std::ffi::c_void) { stream_ctx_v2(h, pctx, pgreen) }
    fn cuStreamWaitEvent(h: CUstream, e: CUevent, flags: u32) { wait_event(h, e, flags, false) }
    fn cuStreamWaitEvent_ptsz(h: CUstream, e: CUevent, flags: u32) { wait_event(h, e, flags, true) }

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
        let e: &'static Event = Box::leak(Box::new(Event { flags, recorded: AtomicU64::new(0), with: AtomicU64::new(0) }));
        let h = e as *const Event as usize;
        insert(&EVENTS, h);
        put(ph, h as CUevent)
    }

    fn cuEventRecord(e: CUevent, s: CUstream) { record(e, s, false) }
    fn cuEventRecord_ptsz(e: CUevent, s: CUstream) { record(e, s, true) }
    /// Flags: `CU_EVENT_RECORD_DEFAULT` (0) or `CU_EVENT_RECORD_EXTERNAL` (1, matters only in
    /// graph capture, which does not capture events here).
    fn cuEventRecordWithFlags(e: CUevent, s: CUstream, flags: u32) {
        if flags > 1 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        record(e, s, false)
    }
    fn cuEventRecordWithFlags_ptsz(e: CUevent, s: CUstream, flags: u32) {
        if flags > 1 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        record(e, s, true)
    }
    fn cuEventSynchronize(e: CUevent) { sync_event(e) }
    fn cuEventQuery(e: CUevent) { query_event(e) }
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
