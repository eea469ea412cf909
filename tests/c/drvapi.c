/* The CUDA driver API reached three ways, chosen at compile time:
 *   -DMODE_LINK   linked with -lcuda; cuda.h binds calls to versioned exports (cuMemAlloc_v2 ...)
 *   -DMODE_DLSYM  dlopen("libcuda.so.1") + dlsym of the exact exported names
 *   -DMODE_GPA    dlopen + dlsym("cuGetProcAddress_v2") only, everything else by base name +
 *                 version through it; add -DGPA_V1 to use the v1 cuGetProcAddress (no status)
 * -DCUDA_API_PER_THREAD_DEFAULT_STREAM selects the per-thread-stream variants: the _ptsz
 * exports (link: through cuda.h, dlsym: by name) or cuGetProcAddress flags 2.
 *
 * Operations (see scenario.h; the ones both programs carry are in device_ops.h), after the automatic init (cuInit, device count, context on 0):
 *   dev=N  alloc=API:BYTES  free=K  memfree=K (plain cuMemFree)  info  infonull  totalmem  v1info  v1total  ident  gpaflags
 *   ids          identity of every device: ids.count, devD.{rc,name,uuid,uuid1,pci,pcibus,total}
 *   bypci=BUSID  cuDeviceGetByPCIBusId -> opI.rc, opI.dev
 *   get=N        cuDeviceGet(N) -> opI.rc, opI.dev
 * Virtual devices (GPUSHIM_VIRTUAL_DEVICES):
 *   attrs        selected attributes of every device: devD.attrA (rc != 0 prints devD.attrA.rc)
 *   ctxdev       cuCtxGetDevice of the current context -> opI.rc, opI.dev; with cuCtxGetDevice_v2:
 *                opI.rc2, opI.dev2 (NULL context) and opI.ctxK.rc / opI.ctxK.dev for every retained
 *                primary context K
 *   ctxcreate=N  cuCtxCreate_v2(flags 0) on device N (ctxcreate4=N: cuCtxCreate_v4, no params), the
 *                new context current -> opI.rc; ctxdev then also prints opI.created.rc/.dev
 *   ctxdestroy   cuCtxDestroy_v2 of that context, then the primary context of the current device
 *                is made current -> opI.rc, opI.back
 *   ptrdev=K     CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL of slot K: cuPointerGetAttribute -> opI.rc,
 *                opI.dev; cuPointerGetAttributes -> opI.rcs, opI.devs
 *   peer=A,B     cuDeviceCanAccessPeer(A, B) -> opI.rc, opI.can
 *   copy=K,L     fill slot K (cuMemcpyHtoD, at most 4 MiB), cuMemcpyPeer to slot L with the primary
 *                contexts of their devices, read L back -> opI.fill, opI.rc, opI.back, opI.equal
 *   copyasync=K,L  the same with cuMemcpyPeerAsync on the NULL stream, then cuCtxSynchronize
 *   hammer=SEED:ITERS:D,D..  one thread per device D with its own primary context (cuMemAlloc,
 *                cuMemFree, cuMemGetInfo): hammerD.* as described in device_ops.h
 *   splitident   where the device-translating names resolve: splitident.dlsym.NAME (dlsym on the
 *                driver's handle; link mode: the global scope) and, for cuGetProcAddress modes,
 *                splitident.gpa.NAME: driver / other / null
 * Virtual memory on a vmm slot K (mapped whole, or in two halves with API vmmhalves):
 *   vrelease=K   cuMemRelease of its handle (the mapping stays; cleanup then only unmaps) -> opI.rc
 *   vretain=K    cuMemRetainAllocationHandle of its address -> opI.rc, opI.same (the same handle)
 *   vunmap=K:OFF:LEN  cuMemUnmap(address + OFF, LEN) -> opI.rc
 * APIs: mem v1 pitch managed async pool vmm vmmhalves array array3d mipmap host hostalloc hostreg
 * BYTES must be a multiple of 2 MiB for vmm and of 256 KiB for the array APIs.
 */
#include <cuda.h>
#include <dlfcn.h>
#include <stdint.h>

#include "scenario.h"

#if defined(CUDA_API_PER_THREAD_DEFAULT_STREAM)
#define PTSZ 1
#else
#define PTSZ 0
#endif

#if !defined(MODE_LINK) && !defined(MODE_DLSYM) && !defined(MODE_GPA)
#error "define one of MODE_LINK, MODE_DLSYM, MODE_GPA"
#endif

/* X(field, cuda.h symbol, export name, _ptsz export name, base name, version) */
#define API_TABLE(X)                                                                              \
    X(Init, cuInit, "cuInit", "cuInit", "cuInit", 2000)                                           \
    X(DeviceGetCount, cuDeviceGetCount, "cuDeviceGetCount", "cuDeviceGetCount", "cuDeviceGetCount", 2000) \
    X(DeviceGet, cuDeviceGet, "cuDeviceGet", "cuDeviceGet", "cuDeviceGet", 2000)                  \
    X(DevicePrimaryCtxRetain, cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain",              \
      "cuDevicePrimaryCtxRetain", "cuDevicePrimaryCtxRetain", 7000)                               \
    X(CtxSetCurrent, cuCtxSetCurrent, "cuCtxSetCurrent", "cuCtxSetCurrent", "cuCtxSetCurrent", 4000) \
    X(CtxSynchronize, cuCtxSynchronize, "cuCtxSynchronize", "cuCtxSynchronize", "cuCtxSynchronize", 2000) \
    X(DeviceTotalMem, cuDeviceTotalMem, "cuDeviceTotalMem_v2", "cuDeviceTotalMem_v2", "cuDeviceTotalMem", 3020) \
    X(MemGetInfo, cuMemGetInfo, "cuMemGetInfo_v2", "cuMemGetInfo_v2", "cuMemGetInfo", 3020)       \
    X(MemAlloc, cuMemAlloc, "cuMemAlloc_v2", "cuMemAlloc_v2", "cuMemAlloc", 3020)                 \
    X(MemFree, cuMemFree, "cuMemFree_v2", "cuMemFree_v2", "cuMemFree", 3020)                      \
    X(MemAllocPitch, cuMemAllocPitch, "cuMemAllocPitch_v2", "cuMemAllocPitch_v2", "cuMemAllocPitch", 3020) \
    X(MemAllocManaged, cuMemAllocManaged, "cuMemAllocManaged", "cuMemAllocManaged", "cuMemAllocManaged", 6000) \
    X(MemAllocAsync, cuMemAllocAsync, "cuMemAllocAsync", "cuMemAllocAsync_ptsz", "cuMemAllocAsync", 11020) \
    X(MemFreeAsync, cuMemFreeAsync, "cuMemFreeAsync", "cuMemFreeAsync_ptsz", "cuMemFreeAsync", 11020) \
    X(MemPoolCreate, cuMemPoolCreate, "cuMemPoolCreate", "cuMemPoolCreate", "cuMemPoolCreate", 11020) \
    X(MemPoolDestroy, cuMemPoolDestroy, "cuMemPoolDestroy", "cuMemPoolDestroy", "cuMemPoolDestroy", 11020) \
    X(MemAllocFromPoolAsync, cuMemAllocFromPoolAsync, "cuMemAllocFromPoolAsync",                  \
      "cuMemAllocFromPoolAsync_ptsz", "cuMemAllocFromPoolAsync", 11020)                           \
    X(MemCreate, cuMemCreate, "cuMemCreate", "cuMemCreate", "cuMemCreate", 10020)                 \
    X(MemRelease, cuMemRelease, "cuMemRelease", "cuMemRelease", "cuMemRelease", 10020)            \
    X(MemAddressReserve, cuMemAddressReserve, "cuMemAddressReserve", "cuMemAddressReserve", "cuMemAddressReserve", 10020) \
    X(MemAddressFree, cuMemAddressFree, "cuMemAddressFree", "cuMemAddressFree", "cuMemAddressFree", 10020) \
    X(MemMap, cuMemMap, "cuMemMap", "cuMemMap", "cuMemMap", 10020)                                \
    X(MemUnmap, cuMemUnmap, "cuMemUnmap", "cuMemUnmap", "cuMemUnmap", 10020)                      \
    X(MemSetAccess, cuMemSetAccess, "cuMemSetAccess", "cuMemSetAccess", "cuMemSetAccess", 10020)  \
    X(MemRetainAllocationHandle, cuMemRetainAllocationHandle, "cuMemRetainAllocationHandle",      \
      "cuMemRetainAllocationHandle", "cuMemRetainAllocationHandle", 11000)                        \
    X(ArrayCreate, cuArrayCreate, "cuArrayCreate_v2", "cuArrayCreate_v2", "cuArrayCreate", 3020)  \
    X(Array3DCreate, cuArray3DCreate, "cuArray3DCreate_v2", "cuArray3DCreate_v2", "cuArray3DCreate", 3020) \
    X(ArrayDestroy, cuArrayDestroy, "cuArrayDestroy", "cuArrayDestroy", "cuArrayDestroy", 2000)   \
    X(MipmappedArrayCreate, cuMipmappedArrayCreate, "cuMipmappedArrayCreate", "cuMipmappedArrayCreate", \
      "cuMipmappedArrayCreate", 5000)                                                             \
    X(MipmappedArrayDestroy, cuMipmappedArrayDestroy, "cuMipmappedArrayDestroy", "cuMipmappedArrayDestroy", \
      "cuMipmappedArrayDestroy", 5000)                                                            \
    X(MemAllocHost, cuMemAllocHost, "cuMemAllocHost_v2", "cuMemAllocHost_v2", "cuMemAllocHost", 3020) \
    X(MemFreeHost, cuMemFreeHost, "cuMemFreeHost", "cuMemFreeHost", "cuMemFreeHost", 2000)        \
    X(MemHostAlloc, cuMemHostAlloc, "cuMemHostAlloc", "cuMemHostAlloc", "cuMemHostAlloc", 2020)   \
    X(MemHostRegister, cuMemHostRegister, "cuMemHostRegister_v2", "cuMemHostRegister_v2", "cuMemHostRegister", 6050) \
    X(MemHostUnregister, cuMemHostUnregister, "cuMemHostUnregister", "cuMemHostUnregister", "cuMemHostUnregister", 4000) \
    X(LaunchKernel, cuLaunchKernel, "cuLaunchKernel", "cuLaunchKernel_ptsz", "cuLaunchKernel", 7000) \
    X(MemcpyHtoD, cuMemcpyHtoD, "cuMemcpyHtoD_v2", "cuMemcpyHtoD_v2_ptds", "cuMemcpyHtoD", 7000)   \
    X(StreamCreate, cuStreamCreate, "cuStreamCreate", "cuStreamCreate", "cuStreamCreate", 2000)

static struct {
#define FIELD(field, sym, name, ptsz_name, base, ver) __typeof__(&sym) field;
    API_TABLE(FIELD)
#undef FIELD
} api;

static const char *const export_names[] = {
#define NAME(field, sym, name, ptsz_name, base, ver) PTSZ ? ptsz_name : name,
    API_TABLE(NAME)
#undef NAME
};

/* Device identity queries, kept out of API_TABLE so that `ident` lists the same names as before.
 * X(field, cuda.h symbol, export name, base name, version) */
#define ID_TABLE(X)                                                                               \
    X(DeviceGetName, cuDeviceGetName, "cuDeviceGetName", "cuDeviceGetName", 2000)                 \
    X(DeviceGetUuid, cuDeviceGetUuid, "cuDeviceGetUuid_v2", "cuDeviceGetUuid", 11040)             \
    X(DeviceGetPCIBusId, cuDeviceGetPCIBusId, "cuDeviceGetPCIBusId", "cuDeviceGetPCIBusId", 4010) \
    X(DeviceGetByPCIBusId, cuDeviceGetByPCIBusId, "cuDeviceGetByPCIBusId", "cuDeviceGetByPCIBusId", 4010) \
    X(DeviceGetAttribute, cuDeviceGetAttribute, "cuDeviceGetAttribute", "cuDeviceGetAttribute", 2000)

static struct {
#define ID_FIELD(field, sym, name, base, ver) __typeof__(&sym) field;
    ID_TABLE(ID_FIELD)
#undef ID_FIELD
} id_api;

/* Contexts, pointers, peers and copies for the virtual-device operations (kept out of API_TABLE
 * so that `ident` lists the same names as before).
 * X(field, cuda.h symbol, export name, _ptsz export name, base name, version) */
#define VD_TABLE(X)                                                                               \
    X(CtxGetDevice, cuCtxGetDevice, "cuCtxGetDevice", "cuCtxGetDevice", "cuCtxGetDevice", 2000)   \
    X(CtxGetDevice2, cuCtxGetDevice_v2, "cuCtxGetDevice_v2", "cuCtxGetDevice_v2", "cuCtxGetDevice", 13000) \
    X(PointerGetAttribute, cuPointerGetAttribute, "cuPointerGetAttribute", "cuPointerGetAttribute", \
      "cuPointerGetAttribute", 4000)                                                              \
    X(PointerGetAttributes, cuPointerGetAttributes, "cuPointerGetAttributes", "cuPointerGetAttributes", \
      "cuPointerGetAttributes", 7000)                                                             \
    X(DeviceCanAccessPeer, cuDeviceCanAccessPeer, "cuDeviceCanAccessPeer", "cuDeviceCanAccessPeer", \
      "cuDeviceCanAccessPeer", 4000)                                                              \
    X(MemcpyPeer, cuMemcpyPeer, "cuMemcpyPeer", "cuMemcpyPeer_ptds", "cuMemcpyPeer", 4000)        \
    X(MemcpyPeerAsync, cuMemcpyPeerAsync, "cuMemcpyPeerAsync", "cuMemcpyPeerAsync_ptsz", "cuMemcpyPeerAsync", 4000) \
    X(MemcpyDtoH, cuMemcpyDtoH, "cuMemcpyDtoH_v2", "cuMemcpyDtoH_v2_ptds", "cuMemcpyDtoH", 3020)

static struct {
#define VD_FIELD(field, sym, name, ptsz_name, base, ver) __typeof__(&sym) field;
    VD_TABLE(VD_FIELD)
#undef VD_FIELD
} vd_api;

static void *(*sim_symbol)(const char *);

#if defined(MODE_LINK)
/* Weak so that a name the simulator lacks links anyway and shows up as NULL. */
#define WEAK(field, sym, name, ptsz_name, base, ver) extern __typeof__(sym) sym __attribute__((weak));
API_TABLE(WEAK)
#undef WEAK
#define ID_WEAK(field, sym, name, base, ver) extern __typeof__(sym) sym __attribute__((weak));
ID_TABLE(ID_WEAK)
#undef ID_WEAK
#define VD_WEAK(field, sym, name, ptsz_name, base, ver) extern __typeof__(sym) sym __attribute__((weak));
VD_TABLE(VD_WEAK)
#undef VD_WEAK
static const char *mode_name = PTSZ ? "link-ptsz" : "link";
static void resolve_api(void) {
#define LINK(field, sym, name, ptsz_name, base, ver) api.field = &sym;
    API_TABLE(LINK)
#undef LINK
#define ID_LINK(field, sym, name, base, ver) id_api.field = &sym;
    ID_TABLE(ID_LINK)
#undef ID_LINK
#define VD_LINK(field, sym, name, ptsz_name, base, ver) vd_api.field = &sym;
    VD_TABLE(VD_LINK)
#undef VD_LINK
    sim_symbol = (void *(*)(const char *))dlsym(RTLD_DEFAULT, "gpusim_symbol");
}
#else
static void *driver;
static void open_driver(void) {
    driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!driver) {
        kv("error=dlopen libcuda.so.1: %s", dlerror());
        exit(65);
    }
    sim_symbol = (void *(*)(const char *))dlsym(driver, "gpusim_symbol");
}
#endif

#if defined(MODE_DLSYM)
static const char *mode_name = PTSZ ? "dlsym-ptsz" : "dlsym";
static void resolve_api(void) {
    open_driver();
#define DLSYM(field, sym, name, ptsz_name, base, ver) \
    api.field = (__typeof__(api.field))dlsym(driver, PTSZ ? ptsz_name : name);
    API_TABLE(DLSYM)
#undef DLSYM
#define ID_DLSYM(field, sym, name, base, ver) id_api.field = (__typeof__(id_api.field))dlsym(driver, name);
    ID_TABLE(ID_DLSYM)
#undef ID_DLSYM
#define VD_DLSYM(field, sym, name, ptsz_name, base, ver) \
    vd_api.field = (__typeof__(vd_api.field))dlsym(driver, PTSZ ? ptsz_name : name);
    VD_TABLE(VD_DLSYM)
#undef VD_DLSYM
}
#endif

#if defined(MODE_GPA)
typedef CUresult (*gpa_v2_t)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);
typedef CUresult (*gpa_v1_t)(const char *, void **, int, cuuint64_t);
static const unsigned long long gpa_flags = PTSZ ? CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM : 0;
#if defined(GPA_V1)
static const char *mode_name = "gpa-v1";
static const char *gpa_export = "cuGetProcAddress";
#else
static const char *mode_name = PTSZ ? "gpa-ptsz" : "gpa";
static const char *gpa_export = "cuGetProcAddress_v2";
#endif
static void *gpa_fn;

/* cuGetProcAddress(base, version, flags): the pointer, or NULL (then *rc says why). */
static void *gpa(const char *base, int version, unsigned long long flags, CUresult *rc) {
    void *p = NULL;
#if defined(GPA_V1)
    *rc = ((gpa_v1_t)gpa_fn)(base, &p, version, flags);
#else
    CUdriverProcAddressQueryResult status = CU_GET_PROC_ADDRESS_SUCCESS;
    *rc = ((gpa_v2_t)gpa_fn)(base, &p, version, flags, &status);
#endif
    return p;
}

static void resolve_api(void) {
    open_driver();
    gpa_fn = dlsym(driver, gpa_export);
    if (!gpa_fn) {
        kv("error=dlsym %s failed", gpa_export);
        exit(65);
    }
    CUresult rc;
#define GPA(field, sym, name, ptsz_name, base, ver) \
    api.field = (__typeof__(api.field))gpa(base, ver, gpa_flags, &rc);
    API_TABLE(GPA)
#undef GPA
#define ID_GPA(field, sym, name, base, ver) id_api.field = (__typeof__(id_api.field))gpa(base, ver, gpa_flags, &rc);
    ID_TABLE(ID_GPA)
#undef ID_GPA
#define VD_GPA(field, sym, name, ptsz_name, base, ver) \
    vd_api.field = (__typeof__(vd_api.field))gpa(base, ver, gpa_flags, &rc);
    VD_TABLE(VD_GPA)
#undef VD_GPA
}
#endif

/* The unversioned exports keep their CUDA 2.0 ABI: 32-bit sizes and device pointers.
 * Resolved by export name (link: the process' global lookup, as the loader would bind them),
 * or by base name with version 2000 through cuGetProcAddress. */
typedef CUresult (*mem_alloc_v1_t)(unsigned int *, unsigned int);
typedef CUresult (*mem_free_v1_t)(unsigned int);
typedef CUresult (*mem_get_info_v1_t)(unsigned int *, unsigned int *);
typedef CUresult (*device_total_mem_v1_t)(unsigned int *, CUdevice);

static void *resolve_v1(const char *name) {
#if defined(MODE_LINK)
    return dlsym(RTLD_DEFAULT, name);
#elif defined(MODE_DLSYM)
    return dlsym(driver, name);
#else
    CUresult rc;
    return gpa(name, 2000, gpa_flags, &rc);
#endif
}

static void *need_v1(const char *name) {
    void *p = resolve_v1(name);
    if (!p) {
        kv("missing=%s", name);
        exit(66);
    }
    return p;
}

/* Call a table function; a missing one is reported and ends the program (exit 66). */
#define CALL(field, ...) \
    (api.field ? api.field(__VA_ARGS__) : (kv("missing=%s", #field), exit(66), CUDA_ERROR_NOT_FOUND))

#define ID_CALL(field, ...) \
    (id_api.field ? id_api.field(__VA_ARGS__) : (kv("missing=%s", #field), exit(66), CUDA_ERROR_NOT_FOUND))

#define VD_CALL(field, ...) \
    (vd_api.field ? vd_api.field(__VA_ARGS__) : (kv("missing=%s", #field), exit(66), CUDA_ERROR_NOT_FOUND))

/* ---- devices, contexts, streams ---- */

#define MAX_DEVICES 16
static int device_count;
static int current_device;
static CUcontext contexts[MAX_DEVICES];
static CUmemoryPool pools[MAX_DEVICES];

static CUresult use_device(int dev) {
    if (dev < 0 || dev >= MAX_DEVICES) return CUDA_ERROR_INVALID_DEVICE;
    CUresult rc = CUDA_SUCCESS;
    if (!contexts[dev]) {
        CUdevice d;
        rc = CALL(DeviceGet, &d, dev);
        if (rc == CUDA_SUCCESS) rc = CALL(DevicePrimaryCtxRetain, &contexts[dev], d);
        if (rc != CUDA_SUCCESS) return rc;
    }
    rc = CALL(CtxSetCurrent, contexts[dev]);
    if (rc == CUDA_SUCCESS) current_device = dev;
    return rc;
}

static CUmemLocation device_location(void) {
    CUmemLocation loc;
    memset(&loc, 0, sizeof loc);
    loc.type = CU_MEM_LOCATION_TYPE_DEVICE;
    loc.id = current_device;
    return loc;
}

static CUresult device_pool(CUmemoryPool *out) {
    if (!pools[current_device]) {
        CUmemPoolProps props;
        memset(&props, 0, sizeof props);
        props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
        props.handleTypes = CU_MEM_HANDLE_TYPE_NONE;
        props.location = device_location();
        CUresult rc = CALL(MemPoolCreate, &pools[current_device], &props);
        if (rc != CUDA_SUCCESS) return rc;
    }
    *out = pools[current_device];
    return CUDA_SUCCESS;
}

/* ---- allocations: one slot per operation ---- */

enum kind { K_NONE, K_DPTR, K_V1, K_ASYNC, K_VMM, K_ARRAY, K_MIPMAP, K_HOST, K_HOSTREG };

struct slot {
    enum kind kind;
    int device;
    CUdeviceptr dptr;
    unsigned int dptr_v1;
    CUmemGenericAllocationHandle handle;
    int refs; /* vmm: references still to release */
    size_t bytes;
    CUarray array;
    CUmipmappedArray mipmap;
    void *host;
};
static struct slot slots[MAX_OPS];

#include "device_ops.h"

static CUDA_ARRAY3D_DESCRIPTOR desc3d(size_t w, size_t h, size_t d) {
    CUDA_ARRAY3D_DESCRIPTOR desc;
    memset(&desc, 0, sizeof desc);
    desc.Width = w;
    desc.Height = h;
    desc.Depth = d;
    desc.Format = CU_AD_FORMAT_FLOAT; /* 4 bytes x 4 channels = 16 bytes per element */
    desc.NumChannels = 4;
    return desc;
}

/* Allocate `bytes` counted bytes through `name`; prints opI.rc (and API details). */
static void do_alloc(int i, const char *name, unsigned long long bytes) {
    struct slot *s = &slots[i];
    CUresult rc;
    s->device = current_device;
    s->bytes = bytes;
    if (!strcmp(name, "mem")) {
        s->kind = K_DPTR;
        rc = CALL(MemAlloc, &s->dptr, bytes);
    } else if (!strcmp(name, "v1")) {
        s->kind = K_V1;
        rc = ((mem_alloc_v1_t)need_v1("cuMemAlloc"))(&s->dptr_v1, (unsigned int)bytes);
    } else if (!strcmp(name, "pitch")) {
        /* width 1000 bytes: the pitch is 1000 rounded up (1024 on the simulator) */
        size_t pitch = 0, height = bytes / 1024;
        s->kind = K_DPTR;
        rc = CALL(MemAllocPitch, &s->dptr, &pitch, 1000, height, 4);
        kv("op%d.pitch=%zu", i, pitch);
        kv("op%d.height=%zu", i, height);
    } else if (!strcmp(name, "managed")) {
        s->kind = K_DPTR;
        rc = CALL(MemAllocManaged, &s->dptr, bytes, CU_MEM_ATTACH_GLOBAL);
    } else if (!strcmp(name, "async")) {
        s->kind = K_ASYNC;
        rc = CALL(MemAllocAsync, &s->dptr, bytes, (CUstream)0);
        if (rc == CUDA_SUCCESS) kv("op%d.sync=%d", i, (int)CALL(CtxSynchronize));
    } else if (!strcmp(name, "pool")) {
        CUmemoryPool pool = NULL;
        s->kind = K_ASYNC;
        rc = device_pool(&pool);
        if (rc != CUDA_SUCCESS) {
            kv("op%d.poolrc=%d", i, (int)rc);
        } else {
            rc = CALL(MemAllocFromPoolAsync, &s->dptr, bytes, pool, (CUstream)0);
            if (rc == CUDA_SUCCESS) kv("op%d.sync=%d", i, (int)CALL(CtxSynchronize));
        }
    } else if (!strcmp(name, "vmm") || !strcmp(name, "vmmhalves")) {
        CUmemAllocationProp prop;
        memset(&prop, 0, sizeof prop);
        prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
        prop.location = device_location();
        s->kind = K_VMM;
        s->refs = 1;
        rc = CALL(MemCreate, &s->handle, bytes, &prop, 0);
        if (rc == CUDA_SUCCESS) {
            /* map it like PyTorch's expandable segments do */
            CUmemAccessDesc access;
            memset(&access, 0, sizeof access);
            access.location = device_location();
            access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
            CUresult m = CALL(MemAddressReserve, &s->dptr, bytes, 0, 0, 0);
            if (m == CUDA_SUCCESS && !strcmp(name, "vmmhalves")) {
                m = CALL(MemMap, s->dptr, bytes / 2, 0, s->handle, 0);
                if (m == CUDA_SUCCESS) m = CALL(MemMap, s->dptr + bytes / 2, bytes / 2, bytes / 2, s->handle, 0);
            } else if (m == CUDA_SUCCESS) {
                m = CALL(MemMap, s->dptr, bytes, 0, s->handle, 0);
            }
            if (m == CUDA_SUCCESS) m = CALL(MemSetAccess, s->dptr, bytes, &access, 1);
            kv("op%d.maprc=%d", i, (int)m);
        }
    } else if (!strcmp(name, "array")) {
        CUDA_ARRAY_DESCRIPTOR desc;
        memset(&desc, 0, sizeof desc);
        desc.Width = 1024;
        desc.Height = bytes / (1024 * 16);
        desc.Format = CU_AD_FORMAT_FLOAT;
        desc.NumChannels = 4;
        s->kind = K_ARRAY;
        rc = CALL(ArrayCreate, &s->array, &desc);
    } else if (!strcmp(name, "array3d")) {
        CUDA_ARRAY3D_DESCRIPTOR desc = desc3d(256, 64, bytes / (256 * 64 * 16));
        s->kind = K_ARRAY;
        rc = CALL(Array3DCreate, &s->array, &desc);
    } else if (!strcmp(name, "mipmap")) {
        CUDA_ARRAY3D_DESCRIPTOR desc = desc3d(1024, bytes / (1024 * 16), 0);
        s->kind = K_MIPMAP;
        rc = CALL(MipmappedArrayCreate, &s->mipmap, &desc, 1);
    } else if (!strcmp(name, "host")) {
        s->kind = K_HOST;
        rc = CALL(MemAllocHost, &s->host, bytes);
    } else if (!strcmp(name, "hostalloc")) {
        s->kind = K_HOST;
        rc = CALL(MemHostAlloc, &s->host, bytes, 0);
    } else if (!strcmp(name, "hostreg")) {
        s->kind = K_HOSTREG;
        s->host = malloc(bytes);
        rc = s->host ? CALL(MemHostRegister, s->host, bytes, 0) : CUDA_ERROR_OUT_OF_MEMORY;
        if (rc != CUDA_SUCCESS) free(s->host);
    } else {
        kv("error=unknown api '%s'", name);
        exit(64);
    }
    if (rc != CUDA_SUCCESS) s->kind = K_NONE;
    kv("op%d.rc=%d", i, (int)rc);
}

/* Free slot k in the context of its device; returns the driver's answer. */
static int release_slot(int k) {
    struct slot *s = &slots[k];
    CUresult rc = CUDA_SUCCESS;
    int back = current_device;
    if (s->kind == K_NONE) return CUDA_ERROR_INVALID_VALUE;
    if (s->device != current_device) use_device(s->device);
    switch (s->kind) {
    case K_DPTR: rc = CALL(MemFree, s->dptr); break;
    case K_V1: rc = ((mem_free_v1_t)need_v1("cuMemFree"))(s->dptr_v1); break;
    case K_ASYNC:
        rc = CALL(MemFreeAsync, s->dptr, (CUstream)0);
        if (rc == CUDA_SUCCESS) rc = CALL(CtxSynchronize);
        break;
    case K_VMM:
        if (s->dptr) {
            CALL(MemUnmap, s->dptr, s->bytes);
            CALL(MemAddressFree, s->dptr, s->bytes);
        }
        rc = CUDA_SUCCESS;
        while (s->refs-- > 0 && rc == CUDA_SUCCESS) rc = CALL(MemRelease, s->handle);
        break;
    case K_ARRAY: rc = CALL(ArrayDestroy, s->array); break;
    case K_MIPMAP: rc = CALL(MipmappedArrayDestroy, s->mipmap); break;
    case K_HOST: rc = CALL(MemFreeHost, s->host); break;
    case K_HOSTREG:
        rc = CALL(MemHostUnregister, s->host);
        free(s->host);
        break;
    case K_NONE: break;
    }
    s->kind = K_NONE;
    if (back != current_device) use_device(back);
    return rc;
}

/* vrelease=K, vretain=K, vunmap=K:OFF:LEN on a vmm slot */
static void do_vmm_op(int i, const char *arg) {
    const char *eq = strchr(arg, '=') + 1;
    int k = atoi(eq);
    struct slot *s = (k >= 0 && k < MAX_OPS) ? &slots[k] : NULL;
    CUresult rc = CUDA_ERROR_INVALID_VALUE;
    if (!s || s->kind != K_VMM) {
        kv("op%d.rc=%d", i, (int)rc);
        return;
    }
    if (starts_with(arg, "vrelease=")) {
        rc = CALL(MemRelease, s->handle);
        if (rc == CUDA_SUCCESS) s->refs--;
    } else if (starts_with(arg, "vretain=")) {
        CUmemGenericAllocationHandle h = 0;
        rc = CALL(MemRetainAllocationHandle, &h, (void *)(uintptr_t)s->dptr);
        if (rc == CUDA_SUCCESS) s->refs++;
        kv("op%d.same=%d", i, h == s->handle);
    } else {
        const char *c1 = strchr(eq, ':');
        const char *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
        if (!c2) usage_error(arg);
        size_t off = strtoull(c1 + 1, NULL, 10), len = strtoull(c2 + 1, NULL, 10);
        rc = CALL(MemUnmap, s->dptr + off, len);
    }
    kv("op%d.rc=%d", i, (int)rc);
}

/* ---- queries ---- */

static int mem_info(size_t *free_b, size_t *total_b) {
    return CALL(MemGetInfo, free_b, total_b);
}

static void do_infonull(int i) {
    size_t free_b = 0, total_b = 0;
    kv("op%d.rc_null_free=%d", i, (int)CALL(MemGetInfo, NULL, &total_b));
    kv("op%d.total=%zu", i, total_b);
    kv("op%d.rc_null_total=%d", i, (int)CALL(MemGetInfo, &free_b, NULL));
    kv("op%d.free=%zu", i, free_b);
    kv("op%d.rc_null_both=%d", i, (int)CALL(MemGetInfo, NULL, NULL));
}

static void do_totalmem(int i) {
    for (int d = 0; d < device_count; d++) {
        CUdevice dev;
        size_t total = 0;
        CUresult rc = CALL(DeviceGet, &dev, d);
        if (rc == CUDA_SUCCESS) rc = CALL(DeviceTotalMem, &total, dev);
        kv("op%d.rc%d=%d", i, d, (int)rc);
        kv("op%d.total%d=%zu", i, d, total);
    }
}

/* v1 cuMemGetInfo / cuDeviceTotalMem write 32-bit values: the word after each must stay. */
#define CANARY 0xCAFEBABEu
static void do_v1info(int i) {
    unsigned int f[2] = {0, CANARY}, t[2] = {0, CANARY};
    CUresult rc = ((mem_get_info_v1_t)need_v1("cuMemGetInfo"))(&f[0], &t[0]);
    kv("op%d.rc=%d", i, (int)rc);
    kv("op%d.free=%u", i, f[0]);
    kv("op%d.total=%u", i, t[0]);
    kv("op%d.canary=%s", i, f[1] == CANARY && t[1] == CANARY ? "ok" : "smashed");
}

static void do_v1total(int i) {
    for (int d = 0; d < device_count; d++) {
        unsigned int t[2] = {0, CANARY};
        CUdevice dev;
        CUresult rc = CALL(DeviceGet, &dev, d);
        if (rc == CUDA_SUCCESS) rc = ((device_total_mem_v1_t)need_v1("cuDeviceTotalMem"))(&t[0], dev);
        kv("op%d.rc%d=%d", i, d, (int)rc);
        kv("op%d.total%d=%u", i, d, t[0]);
        kv("op%d.canary%d=%s", i, d, t[1] == CANARY ? "ok" : "smashed");
    }
}

/* identity of a pointer against the simulator's own function of that export name */
static const char *identity(void *p, const char *export_name) {
    if (!p) return "null";
    if (!sim_symbol) return "unknown";
    return p == sim_symbol(export_name) ? "driver" : "other";
}

static void do_ident(void) {
    size_t n = sizeof export_names / sizeof export_names[0];
    void *const *ptrs = (void *const *)&api;
    for (size_t k = 0; k < n; k++) kv("ident.%s=%s", export_names[k], identity(ptrs[k], export_names[k]));
#if !defined(MODE_LINK)
    /* the resolvers themselves, as the program's own dlsym sees them */
    kv("ident.dlsym.cuGetProcAddress_v2=%s",
       identity(dlsym(driver, "cuGetProcAddress_v2"), "cuGetProcAddress_v2"));
    kv("ident.dlsym.cuGetProcAddress=%s", identity(dlsym(driver, "cuGetProcAddress"), "cuGetProcAddress"));
#endif
}

#if defined(MODE_GPA)
/* The same base name asked for with flags 0 and 2 must give the variant of each. */
static void do_gpaflags(void) {
    static const struct { const char *base; int ver; const char *f0, *f2; } names[] = {
        {"cuMemAllocAsync", 11020, "cuMemAllocAsync", "cuMemAllocAsync_ptsz"},
        {"cuMemFreeAsync", 11020, "cuMemFreeAsync", "cuMemFreeAsync_ptsz"},
        {"cuMemAllocFromPoolAsync", 11020, "cuMemAllocFromPoolAsync", "cuMemAllocFromPoolAsync_ptsz"},
        {"cuLaunchKernel", 7000, "cuLaunchKernel", "cuLaunchKernel_ptsz"},
        {"cuMemAlloc", 3020, "cuMemAlloc_v2", "cuMemAlloc_v2"},
    };
    for (size_t k = 0; k < sizeof names / sizeof names[0]; k++) {
        CUresult rc0, rc2;
        void *p0 = gpa(names[k].base, names[k].ver, 0, &rc0);
        void *p2 = gpa(names[k].base, names[k].ver, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, &rc2);
        kv("gpaflags.%s.f0=%s", names[k].base, identity(p0, names[k].f0));
        kv("gpaflags.%s.f2=%s", names[k].base, identity(p2, names[k].f2));
        kv("gpaflags.%s.same=%d", names[k].base, p0 == p2);
    }
}
#endif

/* ---- identity ---- */

typedef CUresult (*device_get_uuid_v1_t)(CUuuid *, CUdevice);

static void *resolve_versioned(const char *export_name, const char *base, int version) {
#if defined(MODE_LINK)
    (void)base, (void)version;
    return dlsym(RTLD_DEFAULT, export_name);
#elif defined(MODE_DLSYM)
    (void)base, (void)version;
    return dlsym(driver, export_name);
#else
    (void)export_name;
    CUresult rc;
    return gpa(base, version, gpa_flags, &rc);
#endif
}

static void do_ids(void) {
    int n = -1;
    kv("ids.count.rc=%d", (int)CALL(DeviceGetCount, &n));
    kv("ids.count=%d", n);
    device_get_uuid_v1_t uuid_v1 = (device_get_uuid_v1_t)resolve_versioned("cuDeviceGetUuid", "cuDeviceGetUuid", 9020);
    for (int d = 0; d < n && d < 64; d++) {
        CUdevice dev = -1;
        char name[256] = "", uuid[64] = "", pci[64] = "";
        CUuuid u;
        int bus = -1;
        size_t total = 0;
        CUresult rc = CALL(DeviceGet, &dev, d);
        kv("dev%d.rc=%d", d, (int)rc);
        if (rc != CUDA_SUCCESS) continue;
        kv("dev%d.name.rc=%d", d, (int)ID_CALL(DeviceGetName, name, sizeof name, dev));
        kv("dev%d.name=%s", d, name);
        memset(&u, 0, sizeof u);
        kv("dev%d.uuid.rc=%d", d, (int)ID_CALL(DeviceGetUuid, &u, dev));
        uuid_string(uuid, sizeof uuid, (const unsigned char *)u.bytes);
        kv("dev%d.uuid=%s", d, uuid);
        if (uuid_v1) {
            memset(&u, 0, sizeof u);
            kv("dev%d.uuid1.rc=%d", d, (int)uuid_v1(&u, dev));
            uuid_string(uuid, sizeof uuid, (const unsigned char *)u.bytes);
            kv("dev%d.uuid1=%s", d, uuid);
        }
        kv("dev%d.pci.rc=%d", d, (int)ID_CALL(DeviceGetPCIBusId, pci, sizeof pci, dev));
        kv("dev%d.pci=%s", d, pci);
        kv("dev%d.pcibus.rc=%d", d,
           (int)ID_CALL(DeviceGetAttribute, &bus, CU_DEVICE_ATTRIBUTE_PCI_BUS_ID, dev));
        kv("dev%d.pcibus=%d", d, bus);
        kv("dev%d.total.rc=%d", d, (int)CALL(DeviceTotalMem, &total, dev));
        kv("dev%d.total=%zu", d, total);
    }
}

static int device_by_pci(int *dev, const char *bus_id) {
    return ID_CALL(DeviceGetByPCIBusId, dev, bus_id);
}

static void do_get(int i, int ordinal) {
    CUdevice dev = -1;
    CUresult rc = CALL(DeviceGet, &dev, ordinal);
    kv_rc_and(i, (int)rc, "dev", (int)dev);
}

/* ---- virtual devices ---- */

static void do_attrs(void) {
    static const int attrs[] = {1, 10, 16, 33, 34, 50, 75, 76, 83, 89, 102, 115};
    int n = 0;
    CALL(DeviceGetCount, &n);
    for (int d = 0; d < n && d < 64; d++) {
        CUdevice dev;
        if (CALL(DeviceGet, &dev, d) != CUDA_SUCCESS) continue;
        for (size_t k = 0; k < sizeof attrs / sizeof attrs[0]; k++) {
            int v = -1;
            CUresult rc = ID_CALL(DeviceGetAttribute, &v, (CUdevice_attribute)attrs[k], dev);
            if (rc != CUDA_SUCCESS) kv("dev%d.attr%d.rc=%d", d, attrs[k], (int)rc);
            kv("dev%d.attr%d=%d", d, attrs[k], v);
        }
    }
}

static CUcontext created_ctx;

static void do_ctxdev(int i) {
    CUdevice dev = -1;
    kv("op%d.rc=%d", i, (int)VD_CALL(CtxGetDevice, &dev));
    kv("op%d.dev=%d", i, (int)dev);
    if (!vd_api.CtxGetDevice2) return;
    dev = -1;
    kv("op%d.rc2=%d", i, (int)vd_api.CtxGetDevice2(&dev, NULL));
    kv("op%d.dev2=%d", i, (int)dev);
    for (int k = 0; k < MAX_DEVICES; k++) {
        if (!contexts[k]) continue;
        dev = -1;
        kv("op%d.ctx%d.rc=%d", i, k, (int)vd_api.CtxGetDevice2(&dev, contexts[k]));
        kv("op%d.ctx%d.dev=%d", i, k, (int)dev);
    }
    if (created_ctx) {
        dev = -1;
        kv("op%d.created.rc=%d", i, (int)vd_api.CtxGetDevice2(&dev, created_ctx));
        kv("op%d.created.dev=%d", i, (int)dev);
    }
}

typedef CUresult (*ctx_create_v2_t)(CUcontext *, unsigned int, CUdevice);
typedef CUresult (*ctx_create_v4_t)(CUcontext *, void *, unsigned int, CUdevice);
typedef CUresult (*ctx_destroy_t)(CUcontext);

static void do_ctxcreate(int i, int n, int v4) {
    CUdevice dev;
    CUresult rc = CALL(DeviceGet, &dev, n);
    if (rc == CUDA_SUCCESS) {
        void *f = v4 ? resolve_versioned("cuCtxCreate_v4", "cuCtxCreate", 12050)
                     : resolve_versioned("cuCtxCreate_v2", "cuCtxCreate", 3020);
        if (!f) {
            kv("missing=cuCtxCreate_v%d", v4 ? 4 : 2);
            exit(66);
        }
        rc = v4 ? ((ctx_create_v4_t)f)(&created_ctx, NULL, 0, dev) : ((ctx_create_v2_t)f)(&created_ctx, 0, dev);
    }
    if (rc == CUDA_SUCCESS) current_device = n;
    kv("op%d.rc=%d", i, (int)rc);
}

static void do_ctxdestroy(int i) {
    ctx_destroy_t f = (ctx_destroy_t)resolve_versioned("cuCtxDestroy_v2", "cuCtxDestroy", 4000);
    if (!f) {
        kv("missing=cuCtxDestroy_v2");
        exit(66);
    }
    kv("op%d.rc=%d", i, (int)f(created_ctx));
    created_ctx = NULL;
    kv("op%d.back=%d", i, (int)use_device(current_device));
}

static int set_device(int dev) {
    return (int)use_device(dev);
}

static int slot_is_dptr(int k) {
    return k > 0 && k < MAX_OPS && (slots[k].kind == K_DPTR || slots[k].kind == K_ASYNC);
}

static size_t slot_bytes(int k) {
    return slots[k].bytes;
}

static void do_ptrdev(int i, int k) {
    int ord = -7;
    kv("op%d.rc=%d", i, (int)VD_CALL(PointerGetAttribute, &ord, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, slots[k].dptr));
    kv("op%d.dev=%d", i, ord);
    CUpointer_attribute a = CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL;
    int ord2 = -7;
    void *data[1] = {&ord2};
    kv("op%d.rcs=%d", i, (int)VD_CALL(PointerGetAttributes, 1, &a, data, slots[k].dptr));
    kv("op%d.devs=%d", i, ord2);
}

static int can_access_peer(int *can, int a, int b) {
    CUdevice da, db;
    CUresult rc = CALL(DeviceGet, &da, a);
    if (rc == CUDA_SUCCESS) rc = CALL(DeviceGet, &db, b);
    if (rc == CUDA_SUCCESS) rc = VD_CALL(DeviceCanAccessPeer, can, da, db);
    return (int)rc;
}

/* copies between the primary contexts of the slots' devices (both retained before the fill) */
static int copy_fill(int k, int l, const void *src, size_t n) {
    use_device(slots[k].device);
    use_device(slots[l].device);
    use_device(slots[k].device);
    return (int)CALL(MemcpyHtoD, slots[k].dptr, src, n);
}

static int copy_peer(int k, int l, size_t n, int async) {
    CUresult rc;
    if (async) {
        rc = VD_CALL(MemcpyPeerAsync, slots[l].dptr, contexts[slots[l].device], slots[k].dptr,
                     contexts[slots[k].device], n, (CUstream)0);
        if (rc == CUDA_SUCCESS) rc = CALL(CtxSynchronize);
    } else {
        rc = VD_CALL(MemcpyPeer, slots[l].dptr, contexts[slots[l].device], slots[k].dptr,
                     contexts[slots[k].device], n);
    }
    return (int)rc;
}

static int copy_read_back(void *back, int l, size_t n) {
    use_device(slots[l].device);
    return (int)VD_CALL(MemcpyDtoH, back, slots[l].dptr, n);
}

static void copy_end(int was) {
    use_device(was);
}

/* hammer: the device's primary context, cuMemAlloc / cuMemFree */
static int hammer_enter(int dev) {
    CUdevice d;
    CUcontext ctx = NULL;
    CUresult rc = CALL(DeviceGet, &d, dev);
    if (rc == CUDA_SUCCESS) rc = CALL(DevicePrimaryCtxRetain, &ctx, d);
    if (rc == CUDA_SUCCESS) rc = CALL(CtxSetCurrent, ctx);
    return (int)rc;
}

static enum hammer_alloc_result hammer_alloc(unsigned long long *ptr, size_t size) {
    CUdeviceptr p = 0;
    CUresult rc = CALL(MemAlloc, &p, size);
    *ptr = p;
    return rc == CUDA_SUCCESS ? HAMMER_OK : rc == CUDA_ERROR_OUT_OF_MEMORY ? HAMMER_REFUSED : HAMMER_OTHER;
}

static int hammer_free(unsigned long long ptr) {
    return (int)CALL(MemFree, (CUdeviceptr)ptr);
}

static void do_splitident(void) {
    static const struct { const char *export_name, *base; int ver; } names[] = {
        {"cuDeviceGet", "cuDeviceGet", 2000},
        {"cuDeviceGetCount", "cuDeviceGetCount", 2000},
        {"cuDeviceGetAttribute", "cuDeviceGetAttribute", 2000},
        {"cuDeviceGetName", "cuDeviceGetName", 2000},
        {"cuDeviceGetUuid_v2", "cuDeviceGetUuid", 11040},
        {"cuDeviceGetPCIBusId", "cuDeviceGetPCIBusId", 4010},
        {"cuDeviceCanAccessPeer", "cuDeviceCanAccessPeer", 4000},
        {"cuDevicePrimaryCtxRetain", "cuDevicePrimaryCtxRetain", 7000},
        {"cuCtxGetDevice", "cuCtxGetDevice", 2000},
        {"cuPointerGetAttribute", "cuPointerGetAttribute", 4000},
    };
    for (size_t k = 0; k < sizeof names / sizeof names[0]; k++) {
#if defined(MODE_LINK)
        kv("splitident.dlsym.%s=%s", names[k].base, identity(dlsym(RTLD_DEFAULT, names[k].export_name), names[k].export_name));
#else
        kv("splitident.dlsym.%s=%s", names[k].base, identity(dlsym(driver, names[k].export_name), names[k].export_name));
#endif
#if defined(MODE_GPA)
        CUresult rc;
        kv("splitident.gpa.%s=%s", names[k].base, identity(gpa(names[k].base, names[k].ver, 0, &rc), names[k].export_name));
#endif
    }
}

int main(int argc, char **argv) {
    kv("mode=%s", mode_name);
    resolve_api();
    CUresult rc = CALL(Init, 0);
    kv("init.rc=%d", (int)rc);
    if (rc != CUDA_SUCCESS) {
        kv("count.rc=%d", (int)CALL(DeviceGetCount, &device_count));
        kv("done=1");
        return 0;
    }
    rc = CALL(DeviceGetCount, &device_count);
    kv("count.rc=%d", (int)rc);
    kv("count=%d", device_count);
    if (device_count > 0) kv("ctx.rc=%d", (int)use_device(0));

    for (int i = 1; i < argc && i < MAX_OPS; i++) {
        const char *arg = argv[i];
        if (device_op(i, arg)) continue;
        if (starts_with(arg, "memfree=")) {
            /* plain cuMemFree of any device pointer (stream-ordered ones included) */
            int k = atoi(arg + 8);
            CUresult rc = CUDA_ERROR_INVALID_VALUE;
            if (slot_is_dptr(k)) {
                rc = CALL(MemFree, slots[k].dptr);
                slots[k].kind = K_NONE;
            }
            kv("op%d.rc=%d", i, (int)rc);
        } else if (starts_with(arg, "vrelease=") || starts_with(arg, "vretain=") || starts_with(arg, "vunmap=")) {
            do_vmm_op(i, arg);
        } else if (!strcmp(arg, "infonull")) {
            do_infonull(i);
        } else if (!strcmp(arg, "totalmem")) {
            do_totalmem(i);
        } else if (!strcmp(arg, "v1info")) {
            do_v1info(i);
        } else if (!strcmp(arg, "v1total")) {
            do_v1total(i);
        } else if (starts_with(arg, "get=")) {
            do_get(i, atoi(arg + 4));
        } else if (!strcmp(arg, "ident")) {
            do_ident();
        } else if (starts_with(arg, "ctxcreate=")) {
            do_ctxcreate(i, atoi(arg + 10), 0);
        } else if (starts_with(arg, "ctxcreate4=")) {
            do_ctxcreate(i, atoi(arg + 11), 1);
        } else if (!strcmp(arg, "ctxdestroy")) {
            do_ctxdestroy(i);
        } else if (!strcmp(arg, "ctxdev")) {
            do_ctxdev(i);
        } else if (!strcmp(arg, "splitident")) {
            do_splitident();
#if defined(MODE_GPA)
        } else if (!strcmp(arg, "gpaflags")) {
            do_gpaflags();
#endif
        } else {
            usage_error(arg);
        }
    }

    /* give everything back so that the simulator's report ends at 0 bytes in use */
    int failures = 0;
    for (int k = 0; k < MAX_OPS; k++)
        if (slots[k].kind != K_NONE && release_slot(k) != CUDA_SUCCESS) failures++;
    for (int d = 0; d < MAX_DEVICES; d++)
        if (pools[d]) {
            use_device(d);
            if (CALL(MemPoolDestroy, pools[d]) != CUDA_SUCCESS) failures++;
        }
    kv("cleanup.failures=%d", failures);
    kv("done=1");
    return 0;
}
