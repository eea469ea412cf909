//! Green contexts (CUDA 12.4+): a device's SM resource, its split by count, resource
//! descriptors, green contexts and the `CUcontext` each one has (`cuCtxFromGreenCtx`), and the
//! SM count of every green context created, for the exit report.
//!
//! Modelled on the CUDA driver API documentation ("Green Contexts"): a device's SM resource has
//! 132 SMs (the simulated device is a compute capability 9.0 part); a split by count hands out
//! groups of `minCount` rounded up to the partition granularity (8 SMs on 9.0; 2 with
//! `CU_DEV_SM_RESOURCE_SPLIT_IGNORE_SM_COSCHEDULING`), as many as fit and as many as asked for,
//! the rest in `remainder`; split results cannot be split again. A green context retains the
//! device's primary context until it is destroyed; its `CUcontext` is current like any
//! context (allocations, streams, launches) but cannot be destroyed with `cuCtxDestroy` (the
//! documentation calls that undefined: here `CUDA_ERROR_INVALID_CONTEXT`). Memory allocated
//! while it is current belongs to the device's primary context (a green context shares the
//! primary context's address space): it goes when the primary context is destroyed (last
//! release, reset), not when the green context is. With `GPUSIM_DRIVER_VERSION` below 12040 the
//! functions answer `CUDA_ERROR_NOT_SUPPORTED` (see README).

use crate::context::{self, Ctx};
use crate::devices::{self, phys_of};
use crate::types::*;
use std::collections::HashSet;
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock};

pub type CUgreenCtx = *mut c_void;
pub type CUdevResourceDesc = *mut c_void;

pub const CUDA_ERROR_INVALID_RESOURCE_TYPE: CUresult = 914;
pub const CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION: CUresult = 915;

/// `CU_DEV_RESOURCE_TYPE_SM`.
const TYPE_SM: u32 = 1;
/// The SMs of every simulated device (its `MULTIPROCESSOR_COUNT`).
pub const DEVICE_SMS: u32 = 132;
/// Partition granularity of a compute capability 9.0 device (minimum size and multiple).
const GRANULARITY: u32 = 8;
/// `CU_DEV_SM_RESOURCE_SPLIT_IGNORE_SM_COSCHEDULING`: finer partitions.
const SPLIT_IGNORE_COSCHEDULING: u32 = 1;
const FINE_GRANULARITY: u32 = 2;
/// `CU_DEV_SM_RESOURCE_SPLIT_MAX_POTENTIAL_CLUSTER_SIZE`: accepted, changes nothing here.
const SPLIT_MAX_CLUSTER: u32 = 2;
/// `CU_GREEN_CTX_DEFAULT_STREAM`.
const GREEN_CTX_DEFAULT_STREAM: u32 = 1;
/// The first driver version with green contexts.
const FIRST_VERSION: i32 = 12040;

/// Where a resource came from, kept in the structure's internal bytes (as the real driver keeps
/// its own there).
const MAGIC: u32 = 0x6772_6e31; // "grn1"
const FROM_DEVICE: u32 = 1;
const FROM_SPLIT: u32 = 2;

/// `CUdevResource` (cuda.h, `RESOURCE_ABI_VERSION` 1): 144 bytes — the type, 92 internal bytes,
/// a 40-byte union whose SM member is five `unsigned int`s, and `nextResource`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct CUdevResource {
    pub type_: u32,
    /// [0] MAGIC, [1] visible ordinal, [2] origin; the rest zero.
    pub internal: [u32; 23],
    pub sm_count: u32,
    pub min_sm_partition_size: u32,
    pub sm_coscheduled_alignment: u32,
    pub flags: u32,
    pub locality_domain_id: u32,
    pub oversize: [u32; 5],
    pub next: *mut c_void,
}

fn sm_resource(dev: CUdevice, sms: u32, origin: u32) -> CUdevResource {
    let mut internal = [0u32; 23];
    internal[0] = MAGIC;
    internal[1] = dev as u32;
    internal[2] = origin;
    CUdevResource {
        type_: TYPE_SM,
        internal,
        sm_count: sms,
        min_sm_partition_size: GRANULARITY,
        sm_coscheduled_alignment: GRANULARITY,
        flags: 0,
        locality_domain_id: 0,
        oversize: [0; 5],
        next: std::ptr::null_mut(),
    }
}

/// A resource descriptor: the device and the SMs it describes.
struct Desc {
    dev: CUdevice,
    sms: u32,
}

/// A green context.
pub struct Green {
    pub dev: CUdevice,
    pub sms: u32,
    pub ctx: &'static Ctx,
    alive: AtomicBool,
}

#[derive(Default)]
struct Registry {
    descs: HashSet<usize>,
    greens: HashSet<usize>,
    /// Every green context created, alive or not (their contexts' memory goes with the primary).
    all: Vec<&'static Green>,
}

fn registry() -> std::sync::MutexGuard<'static, Registry> {
    static R: OnceLock<Mutex<Registry>> = OnceLock::new();
    R.get_or_init(Default::default).lock().unwrap_or_else(|e| e.into_inner())
}

fn supported() -> Res {
    if crate::config::get().driver_version < FIRST_VERSION {
        return Err(CUDA_ERROR_NOT_SUPPORTED);
    }
    devices::visible().map(|_| ())
}

unsafe fn read_resource(p: *const CUdevResource) -> Res<CUdevResource> {
    let r = get(p)?;
    if r.type_ != TYPE_SM {
        return Err(CUDA_ERROR_INVALID_RESOURCE_TYPE);
    }
    if r.internal[0] != MAGIC {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    Ok(r)
}

fn green_of(h: CUgreenCtx) -> Res<&'static Green> {
    if h.is_null() || !registry().greens.contains(&(h as usize)) {
        return Err(CUDA_ERROR_INVALID_CONTEXT);
    }
    // SAFETY: in the set, so a leaked `Green`.
    let g = unsafe { &*(h as *const Green) };
    if !g.alive.load(Ordering::Acquire) {
        return Err(CUDA_ERROR_INVALID_CONTEXT);
    }
    Ok(g)
}

/// Whether `c` is the context of a green context (`cuCtxDestroy` refuses it).
pub fn is_green(c: &Ctx) -> bool {
    registry().all.iter().any(|g| std::ptr::eq(g.ctx, c))
}

/// The green context whose `CUcontext` is `c`.
fn green_with_ctx(c: &Ctx) -> Option<&'static Green> {
    registry().all.iter().copied().find(|g| std::ptr::eq(g.ctx, c))
}

/// The contexts of the green contexts of visible ordinal `dev`: their memory is the primary
/// context's (freed with it).
pub fn contexts_of(dev: CUdevice) -> Vec<&'static Ctx> {
    registry().all.iter().filter(|g| g.dev == dev).map(|g| g.ctx).collect()
}

/// `"green_contexts":[{"device":D,"physical":P,"sms":N},…]` for the report: every green
/// context created, in order.
pub fn report_json() -> String {
    let all: Vec<String> = registry()
        .all
        .iter()
        .map(|g| format!("{{\"device\":{},\"physical\":{},\"sms\":{}}}", g.dev, g.ctx.physical, g.sms))
        .collect();
    format!("[{}]", all.join(","))
}

cu_api! {
    fn cuDeviceGetDevResource(dev: CUdevice, resource: *mut CUdevResource, type_: u32) {
        supported()?;
        phys_of(dev)?;
        if resource.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        if type_ != TYPE_SM {
            return Err(CUDA_ERROR_INVALID_RESOURCE_TYPE);
        }
        put(resource, sm_resource(dev, DEVICE_SMS, FROM_DEVICE))
    }

    fn cuCtxGetDevResource(ctx: CUcontext, resource: *mut CUdevResource, type_: u32) {
        supported()?;
        let c = context::from_handle(ctx)?;
        if resource.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        if type_ != TYPE_SM {
            return Err(CUDA_ERROR_INVALID_RESOURCE_TYPE);
        }
        let sms = green_with_ctx(c).map_or(DEVICE_SMS, |g| g.sms);
        put(resource, sm_resource(c.ordinal, sms, FROM_DEVICE))
    }

    fn cuGreenCtxGetDevResource(green: CUgreenCtx, resource: *mut CUdevResource, type_: u32) {
        supported()?;
        let g = green_of(green)?;
        if resource.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        if type_ != TYPE_SM {
            return Err(CUDA_ERROR_INVALID_RESOURCE_TYPE);
        }
        put(resource, sm_resource(g.dev, g.sms, FROM_DEVICE))
    }

    fn cuDevSmResourceSplitByCount(result: *mut CUdevResource, nb_groups: *mut u32, input: *const CUdevResource, remainder: *mut CUdevResource, flags: u32, min_count: u32) {
        supported()?;
        let input = read_resource(input)?;
        if nb_groups.is_null() || flags & !(SPLIT_IGNORE_COSCHEDULING | SPLIT_MAX_CLUSTER) != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        if input.internal[2] == FROM_SPLIT {
            // "the output results cannot be split again without first creating a descriptor
            // and a green context with that descriptor"
            return Err(CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION);
        }
        if min_count > input.sm_count {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let gran = if flags & SPLIT_IGNORE_COSCHEDULING != 0 { FINE_GRANULARITY } else { GRANULARITY };
        let group = min_count.max(gran).div_ceil(gran) * gran;
        let possible = input.sm_count / group;
        let dev = input.internal[1] as CUdevice;
        if result.is_null() {
            return put(nb_groups, possible);
        }
        let asked = get(nb_groups)?;
        if asked == 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let made = asked.min(possible);
        for i in 0..made as usize {
            let mut r = sm_resource(dev, group, FROM_SPLIT);
            r.min_sm_partition_size = gran;
            r.sm_coscheduled_alignment = gran;
            put(result.add(i), r)?;
        }
        put(nb_groups, made)?;
        if !remainder.is_null() {
            put(remainder, sm_resource(dev, input.sm_count - made * group, FROM_SPLIT))?;
        }
        Ok(())
    }

    fn cuDevResourceGenerateDesc(desc: *mut CUdevResourceDesc, resources: *mut CUdevResource, nb: u32) {
        supported()?;
        if desc.is_null() || resources.is_null() || nb == 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        // Several SM resources are merged (they must be of one device); zero SMs is invalid.
        let mut sms = 0u32;
        let mut dev = None;
        for i in 0..nb as usize {
            let r = read_resource(resources.add(i))?;
            let d = r.internal[1] as CUdevice;
            if dev.is_some_and(|x| x != d) {
                return Err(CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION);
            }
            dev = Some(d);
            sms = sms.saturating_add(r.sm_count);
        }
        if sms == 0 || sms > DEVICE_SMS {
            return Err(CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION);
        }
        let d: &'static Desc = Box::leak(Box::new(Desc { dev: dev.unwrap_or(0), sms }));
        let h = d as *const Desc as usize;
        registry().descs.insert(h);
        put(desc, h as CUdevResourceDesc)
    }

    fn cuGreenCtxCreate(out: *mut CUgreenCtx, desc: CUdevResourceDesc, dev: CUdevice, flags: u32) {
        supported()?;
        if out.is_null() || desc.is_null() || !registry().descs.contains(&(desc as usize)) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        phys_of(dev)?;
        if flags & !GREEN_CTX_DEFAULT_STREAM != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: in the set, so a leaked `Desc`.
        let d = unsafe { &*(desc as *const Desc) };
        if d.dev != dev {
            return Err(CUDA_ERROR_INVALID_DEVICE);
        }
        // "This API will retain the primary context on device dev, which is released when the
        // green context is destroyed."
        context::primary_retain(dev)?;
        let ctx = context::new_context(dev, 0)?;
        let g: &'static Green = Box::leak(Box::new(Green { dev, sms: d.sms, ctx, alive: AtomicBool::new(true) }));
        let mut r = registry();
        r.greens.insert(g as *const Green as usize);
        r.all.push(g);
        drop(r);
        put(out, g as *const Green as CUgreenCtx)
    }

    fn cuCtxFromGreenCtx(ctx: *mut CUcontext, green: CUgreenCtx) {
        supported()?;
        if ctx.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let g = green_of(green)?;
        put(ctx, g.ctx.handle())
    }

    fn cuGreenCtxDestroy(green: CUgreenCtx) {
        supported()?;
        let g = green_of(green)?;
        if g.alive.swap(false, Ordering::AcqRel) {
            registry().greens.remove(&(green as usize));
            context::retire(g.ctx);
            context::primary_release_of(g.dev)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::context::*;

    fn lock() -> std::sync::MutexGuard<'static, ()> {
        crate::DRIVER_TESTS.lock().unwrap_or_else(|e| e.into_inner())
    }

    #[test]
    fn the_resource_has_the_header_layout() {
        assert_eq!(std::mem::size_of::<CUdevResource>(), 144);
        assert_eq!(std::mem::offset_of!(CUdevResource, sm_count), 96);
        assert_eq!(std::mem::offset_of!(CUdevResource, next), 136);
    }

    #[test]
    fn a_green_context_of_a_split_works_like_a_context() {
        let _g = lock();
        unsafe {
            assert_eq!(crate::devices::cuInit(0), CUDA_SUCCESS);
            let dev = 0;
            let mut all: CUdevResource = std::mem::zeroed();
            assert_eq!(cuDeviceGetDevResource(dev, &mut all, TYPE_SM), CUDA_SUCCESS);
            assert_eq!((all.sm_count, all.min_sm_partition_size), (132, 8));
            assert_eq!(cuDeviceGetDevResource(dev, &mut all, 1000), CUDA_ERROR_INVALID_RESOURCE_TYPE);

            // 39 SMs asked: groups of 40 (rounded up to 8), one asked for, 92 left
            let mut n = 0u32;
            assert_eq!(cuDevSmResourceSplitByCount(std::ptr::null_mut(), &mut n, &all, std::ptr::null_mut(), 0, 39), CUDA_SUCCESS);
            assert_eq!(n, 3);
            let (mut part, mut rest): (CUdevResource, CUdevResource) = (std::mem::zeroed(), std::mem::zeroed());
            n = 1;
            assert_eq!(cuDevSmResourceSplitByCount(&mut part, &mut n, &all, &mut rest, 0, 39), CUDA_SUCCESS);
            assert_eq!((n, part.sm_count, rest.sm_count), (1, 40, 92));
            let mut again = std::mem::zeroed();
            n = 1;
            assert_eq!(cuDevSmResourceSplitByCount(&mut again, &mut n, &part, std::ptr::null_mut(), 0, 8), CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION);
            n = 1;
            assert_eq!(cuDevSmResourceSplitByCount(&mut again, &mut n, &all, std::ptr::null_mut(), 0, 133), CUDA_ERROR_INVALID_VALUE);

            let mut desc: CUdevResourceDesc = std::ptr::null_mut();
            assert_eq!(cuDevResourceGenerateDesc(&mut desc, &mut part, 1), CUDA_SUCCESS);
            let mut green: CUgreenCtx = std::ptr::null_mut();
            assert_eq!(cuGreenCtxCreate(&mut green, desc, 1, GREEN_CTX_DEFAULT_STREAM), CUDA_ERROR_INVALID_DEVICE);
            assert_eq!(cuGreenCtxCreate(&mut green, desc, dev, GREEN_CTX_DEFAULT_STREAM), CUDA_SUCCESS);
            let mut state = (0u32, 0i32);
            assert_eq!(cuDevicePrimaryCtxGetState(dev, &mut state.0, &mut state.1), CUDA_SUCCESS);
            assert_eq!(state.1, 1, "the green context retains the primary context");

            let mut ctx: CUcontext = std::ptr::null_mut();
            assert_eq!(cuCtxFromGreenCtx(&mut ctx, green), CUDA_SUCCESS);
            let mut got = std::mem::zeroed();
            assert_eq!(cuCtxGetDevResource(ctx, &mut got, TYPE_SM), CUDA_SUCCESS);
            assert_eq!(got.sm_count, 40);
            assert_eq!(cuGreenCtxGetDevResource(green, &mut got, TYPE_SM), CUDA_SUCCESS);
            assert_eq!(got.sm_count, 40);
            assert!(report_json().contains("{\"device\":0,\"physical\":0,\"sms\":40}"));

            assert_eq!(cuCtxPushCurrent_v2(ctx), CUDA_SUCCESS);
            let phys = crate::devices::visible().unwrap()[0];
            let before = crate::stats::used(phys);
            let mut p: CUdeviceptr = 0;
            assert_eq!(crate::memory::cuMemAlloc_v2(&mut p, 4096), CUDA_SUCCESS);
            assert_eq!(crate::stats::used(phys), before + 4096);
            assert_eq!(cuCtxDestroy_v2(ctx), CUDA_ERROR_INVALID_CONTEXT, "not with cuCtxDestroy");
            let mut popped: CUcontext = std::ptr::null_mut();
            assert_eq!(cuCtxPopCurrent_v2(&mut popped), CUDA_SUCCESS);

            // destroyed: the handle is stale, the primary context released with its memory
            assert_eq!(cuGreenCtxDestroy(green), CUDA_SUCCESS);
            assert_eq!(cuGreenCtxDestroy(green), CUDA_ERROR_INVALID_CONTEXT);
            assert_eq!(cuCtxFromGreenCtx(&mut ctx, green), CUDA_ERROR_INVALID_CONTEXT);
            assert_eq!(cuDevicePrimaryCtxGetState(dev, &mut state.0, &mut state.1), CUDA_SUCCESS);
            assert_eq!(state.1, 0);
            assert_eq!(crate::stats::used(phys), before, "the primary context's last release frees it");
        }
    }
}
