/* The memory modes (GPUSHIM_MEMORY_MODE passthrough / grow / preallocate) through the driver
 * API, linked with -lcuda. After cuInit and cuDeviceGet(0) there is NO context: the operations
 * make one, so that a test sees what happens when a context is created. Operation I prints keys
 * prefixed with `opI.`; every operation prints opI.rc unless said otherwise. Slots are the
 * operation indices of allocations (a freed slot keeps its pointer, for queries after the free).
 *
 * Contexts
 *   dev=N          the device later ctx= operations use (cuDeviceGet) -> opI.rc
 *   ctx=primary    cuDevicePrimaryCtxRetain + cuCtxSetCurrent
 *   ctx=retain     cuDevicePrimaryCtxRetain only (nothing made current)
 *   ctx=v2|v3|v4   cuCtxCreate_v2 / _v3 (no affinity params) / _v4 (no params), flags 0: the new
 *                  context is current
 *   ctxdestroy     cuCtxDestroy_v2 of the last created context; nothing is current afterwards
 *   reset          cuDevicePrimaryCtxReset_v2 of the device
 *   (both: what the driver destroys with the context, the slots of device memory, managed
 *   memory and arrays made in it, are no longer live -> opI.dropped)
 * Allocations (slot I) -> opI.rc, opI.ptr (decimal), pitched: opI.pitch
 *   alloc=mem:N  alloc=v1:N (32-bit cuMemAlloc)  alloc=pitch:W:H[:E]  alloc=pitchv1:W:H[:E]
 *   (E = element size, default 4)  alloc=managed:N  alloc=async:N (NULL stream, synchronised)
 *   alloc=vmm:N (cuMemCreate on the device, N a multiple of 2 MiB)  alloc=array:N (a 2D float4
 *   array of 1024 x N/16384 elements: N bytes)  alloc=host:N (cuMemAllocHost)
 * Frees and queries (K a slot, OFF a byte offset into it, default 0)
 *   free=K         the API's own free for the slot's kind (cuMemFree_v2 for device memory)
 *   freev1=K       the v1 cuMemFree (32-bit pointer)
 *   freeat=K:OFF   cuMemFree_v2(slot K + OFF), whatever the slot holds (interior pointers,
 *                  double frees); freeat=0:ADDR frees the absolute address ADDR
 *   range=K:OFF    cuMemGetAddressRange_v2 -> opI.rc, opI.base, opI.off (base - slot K), opI.size
 *   rangev1=K:OFF  the v1 cuMemGetAddressRange (32-bit) -> the same keys
 *   attr=K:OFF     cuPointerGetAttribute of RANGE_START_ADDR (11), RANGE_SIZE (12), BUFFER_ID (7),
 *                  DEVICE_ORDINAL (9), IS_LEGACY_CUDA_IPC_CAPABLE (10, one byte) ->
 *                  opI.a11.rc, opI.start_off (start - slot K), opI.a12.rc, opI.size, opI.a7.rc,
 *                  opI.buffer, opI.a9.rc, opI.dev, opI.a10.rc, opI.ipc; and cuPointerGetAttributes
 *                  of the same five -> opI.s.rc, opI.s.start_off, opI.s.size, opI.s.buffer,
 *                  opI.s.dev, opI.s.ipc
 *   ipc=K:OFF      cuIpcGetMemHandle -> opI.rc; on success opI.sim_handle (1: the simulator's
 *                  encoding, "gpusimIP") and opI.base_off (the handle's base - slot K)
 *   diff=K,L       opI.diff = pointer of L - pointer of K (signed)
 *   touch=K        the driver knows slot K's memory: cuMemsetD8 of its first and last byte
 *                  (0x5A, 0xA5) and cuMemcpyDtoH of both back -> opI.rc (the first failure),
 *                  opI.ok (the bytes came back)
 *   info           cuMemGetInfo_v2 -> opI.rc, opI.free, opI.total
 *   usage=D        the shim's C API (include/gpushim.h), found with dlsym(RTLD_DEFAULT):
 *                  opI.api (1: found), gpushim_memory_usage(D) -> opI.rc, opI.in_use,
 *                  opI.peak, opI.limit; gpushim_version() -> opI.version; with only NULL
 *                  out-pointers -> opI.rc_null (no opI.* but opI.api without the shim)
 *   sim=P          the simulator's state of physical device P (sim_hooks.h) (no opI.rc)
 *   sync           cuCtxSynchronize
 *   poolkeep       the device's current memory pool keeps what is freed into it
 *                  (CU_MEMPOOL_ATTR_RELEASE_THRESHOLD = UINT64_MAX) -> opI.rc
 *   pool           the current pool's RESERVED_MEM_CURRENT and USED_MEM_CURRENT -> opI.rc,
 *                  opI.reserved, opI.used
 * Graphs (graph slot I)
 *   galloc=N       a graph with one memory-allocation node of N bytes on the device and a free
 *                  node, instantiated (cuGraphInstantiate) -> opI.rc
 *   gcapture=N     a stream captures cuMemAllocAsync(N) and cuMemFreeAsync into a graph, which
 *                  is instantiated -> opI.rc (the first failure)
 *   glaunch=K      cuGraphLaunch(graph K, NULL stream) -> opI.rc;  gupload=K: cuGraphUpload
 *   gdestroy=K     cuGraphExecDestroy(graph K) -> opI.rc
 *   gtrim          cuDeviceGraphMemTrim(device) -> opI.rc
 *   gmem           the device's graph memory: opI.rc, opI.used, opI.reserved
 * Data
 *   neighbours=K,L  slots K and L (device memory of N_K and N_L bytes): cuMemsetD8 K to 0xAA and
 *                  L to 0x55, read both back; cuMemcpyHtoD a pattern into all of K, read both;
 *                  cuMemcpyDtoD K -> L (min size), read both; cuMemsetD8 L to 0x11, read K ->
 *                  opI.{set,htod,dtod,reset}.rc and opI.{set,htod,dtod,reset}.ok (every byte of
 *                  both buffers is what it must be)
 * Workloads
 *   random=SEED:STEPS:MAXBYTES  seeded xorshift: each step allocates (60%; sizes log-uniform in
 *                  1..MAXBYTES, cuMemAlloc_v2) or frees (40%) one of at most 512 live allocations;
 *                  each new allocation is filled with its own byte pattern. After every step,
 *                  for every live allocation: cuMemGetAddressRange_v2 of a random address in it
 *                  gives exactly [base, base+size), its first and last (up to) 16 bytes hold its
 *                  pattern, bases are 512-aligned and no two allocations (rounded up to 512
 *                  bytes) overlap; a free first checks the whole buffer. At the end everything is
 *                  freed -> random.{ok,oom,other,frees,free_errors,range_bad,overlap,misaligned,
 *                  bytes_bad,whole_bad,maxlive,max_held,checks} and random.info.{rc,free,total}
 * At the end every live slot is freed (cleanup.failures) and done=1 printed.
 */
#include <cuda.h>
#include <dlfcn.h>
#include <stdint.h>

#include "scenario.h"
#include "sim_hooks.h"

/* versioned names cuda.h does not declare (it maps the plain names to the newest ABI) */
CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev);
CUresult cuCtxCreate_v3(CUcontext *pctx, CUexecAffinityParam *params, int n, unsigned int flags, CUdevice dev);

typedef CUresult (*mem_alloc_v1_t)(unsigned int *, unsigned int);
typedef CUresult (*mem_alloc_pitch_v1_t)(unsigned int *, unsigned int *, unsigned int, unsigned int, unsigned int);
typedef CUresult (*mem_free_v1_t)(unsigned int);
typedef CUresult (*mem_range_v1_t)(unsigned int *, unsigned int *, unsigned int);

#define SLOTS 1024

enum kind { K_NONE, K_DEV, K_V1, K_MANAGED, K_ASYNC, K_VMM, K_ARRAY, K_HOST };

struct slot {
    enum kind kind; /* what the slot held (kept after a free) */
    int live;
    CUdeviceptr ptr;
    size_t bytes;
    CUmemGenericAllocationHandle vmm;
    CUarray array;
    void *host;
    CUcontext ctx; /* current when it was made */
};
static struct slot slots[SLOTS];
static CUdevice device;
static CUgraphExec graph_execs[SLOTS];
static CUcontext created, primary;

/* The v1 (32-bit) entry points, as a linked program would get them: the global scope (the shim
 * where it is preloaded, else the driver). cuda.h maps the plain names to _v2. */
static void *v1(const char *name) {
    void *f = dlsym(RTLD_DEFAULT, name);
    if (!f) {
        kv("missing=%s", name);
        exit(66);
    }
    return f;
}

static int slot_arg(const char *s, int *k, long long *off) {
    *off = 0;
    int n = sscanf(s, "%d:%lld", k, off);
    if (n < 1 || *k < 0 || *k >= SLOTS) return -1;
    return 0;
}

static CUdeviceptr slot_addr(int k, long long off) {
    return (CUdeviceptr)((long long)slots[k].ptr + off);
}

/* ---- contexts ---- */

static CUresult make_context(const char *how) {
    CUresult rc;
    if (!strcmp(how, "primary")) {
        rc = cuDevicePrimaryCtxRetain(&primary, device);
        if (rc == CUDA_SUCCESS) rc = cuCtxSetCurrent(primary);
    } else if (!strcmp(how, "retain")) {
        rc = cuDevicePrimaryCtxRetain(&primary, device);
    } else if (!strcmp(how, "v2")) {
        rc = cuCtxCreate_v2(&created, 0, device);
    } else if (!strcmp(how, "v3")) {
        rc = cuCtxCreate_v3(&created, NULL, 0, 0, device);
    } else if (!strcmp(how, "v4")) {
        rc = cuCtxCreate_v4(&created, NULL, 0, device);
    } else {
        usage_error(how);
        rc = CUDA_ERROR_INVALID_VALUE;
    }
    return rc;
}

/* ---- allocations ---- */

static void do_alloc(int i, const char *spec) {
    struct slot *s = &slots[i];
    char api[16] = "";
    unsigned long long a = 0, b = 0, e = 4;
    int n = sscanf(spec, "%15[^:]:%llu:%llu:%llu", api, &a, &b, &e);
    if (n < 2) usage_error(spec);
    CUresult rc;
    memset(s, 0, sizeof *s);
    s->bytes = (size_t)a;
    cuCtxGetCurrent(&s->ctx);
    if (!strcmp(api, "mem")) {
        s->kind = K_DEV;
        rc = cuMemAlloc(&s->ptr, (size_t)a);
    } else if (!strcmp(api, "v1")) {
        unsigned int p = 0;
        s->kind = K_V1;
        rc = ((mem_alloc_v1_t)v1("cuMemAlloc"))(&p, (unsigned int)a);
        s->ptr = p;
    } else if (!strcmp(api, "pitch")) {
        size_t pitch = 0;
        if (n < 3) usage_error(spec);
        s->kind = K_DEV;
        rc = cuMemAllocPitch(&s->ptr, &pitch, (size_t)a, (size_t)b, (unsigned int)e);
        s->bytes = pitch * (size_t)b;
        kv("op%d.pitch=%zu", i, pitch);
    } else if (!strcmp(api, "pitchv1")) {
        unsigned int p = 0, pitch = 0;
        if (n < 3) usage_error(spec);
        s->kind = K_V1;
        rc = ((mem_alloc_pitch_v1_t)v1("cuMemAllocPitch"))(&p, &pitch, (unsigned int)a, (unsigned int)b,
                                                             (unsigned int)e);
        s->ptr = p;
        s->bytes = (size_t)pitch * (size_t)b;
        kv("op%d.pitch=%u", i, pitch);
    } else if (!strcmp(api, "managed")) {
        s->kind = K_MANAGED;
        rc = cuMemAllocManaged(&s->ptr, (size_t)a, CU_MEM_ATTACH_GLOBAL);
    } else if (!strcmp(api, "async")) {
        s->kind = K_ASYNC;
        rc = cuMemAllocAsync(&s->ptr, (size_t)a, (CUstream)0);
        if (rc == CUDA_SUCCESS) rc = cuCtxSynchronize();
    } else if (!strcmp(api, "vmm")) {
        CUmemAllocationProp prop;
        memset(&prop, 0, sizeof prop);
        prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
        prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        prop.location.id = device;
        s->kind = K_VMM;
        rc = cuMemCreate(&s->vmm, (size_t)a, &prop, 0);
    } else if (!strcmp(api, "array")) {
        CUDA_ARRAY_DESCRIPTOR d;
        memset(&d, 0, sizeof d);
        d.Width = 1024;
        d.Height = (size_t)a / (1024 * 16);
        d.Format = CU_AD_FORMAT_FLOAT;
        d.NumChannels = 4;
        s->kind = K_ARRAY;
        rc = cuArrayCreate(&s->array, &d);
    } else if (!strcmp(api, "host")) {
        s->kind = K_HOST;
        rc = cuMemAllocHost(&s->host, (size_t)a);
    } else {
        usage_error(spec);
        rc = CUDA_ERROR_INVALID_VALUE;
    }
    s->live = rc == CUDA_SUCCESS;
    if (!s->live) s->kind = K_NONE;
    kv("op%d.rc=%d", i, (int)rc);
    if (s->live && (s->kind == K_DEV || s->kind == K_V1 || s->kind == K_MANAGED || s->kind == K_ASYNC))
        kv("op%d.ptr=%llu", i, (unsigned long long)s->ptr);
}

/* What the driver destroys with context c (cuCtxDestroy, primary-context reset): the slots of
 * device memory, managed memory and arrays made in it are no longer live; returns how many. */
static int drop_context_slots(CUcontext c) {
    int n = 0;
    for (int k = 0; k < SLOTS; k++) {
        struct slot *s = &slots[k];
        if (s->live && c && s->ctx == c &&
            (s->kind == K_DEV || s->kind == K_V1 || s->kind == K_MANAGED || s->kind == K_ARRAY)) {
            s->live = 0;
            n++;
        }
    }
    return n;
}

static CUresult release(int k) {
    struct slot *s = &slots[k];
    CUresult rc = CUDA_ERROR_INVALID_VALUE;
    if (!s->live) return rc;
    switch (s->kind) {
    case K_DEV:
    case K_MANAGED: rc = cuMemFree(s->ptr); break;
    case K_V1: rc = ((mem_free_v1_t)v1("cuMemFree"))((unsigned int)s->ptr); break;
    case K_ASYNC:
        rc = cuMemFreeAsync(s->ptr, (CUstream)0);
        if (rc == CUDA_SUCCESS) rc = cuCtxSynchronize();
        break;
    case K_VMM: rc = cuMemRelease(s->vmm); break;
    case K_ARRAY: rc = cuArrayDestroy(s->array); break;
    case K_HOST: rc = cuMemFreeHost(s->host); break;
    case K_NONE: break;
    }
    s->live = 0;
    return rc;
}

/* ---- queries ---- */

static void print_range(int i, CUresult rc, unsigned long long base, unsigned long long size, int k) {
    kv("op%d.rc=%d", i, (int)rc);
    if (rc != CUDA_SUCCESS) return;
    kv("op%d.base=%llu", i, base);
    kv("op%d.off=%lld", i, (long long)(base - (unsigned long long)slots[k].ptr));
    kv("op%d.size=%llu", i, size);
}

static void do_range(int i, const char *arg, int use_v1) {
    int k;
    long long off;
    if (slot_arg(arg, &k, &off)) usage_error(arg);
    if (use_v1) {
        unsigned int base = 0, size = 0;
        CUresult rc = ((mem_range_v1_t)v1("cuMemGetAddressRange"))(&base, &size, (unsigned int)slot_addr(k, off));
        print_range(i, rc, base, size, k);
    } else {
        CUdeviceptr base = 0;
        size_t size = 0;
        CUresult rc = cuMemGetAddressRange(&base, &size, slot_addr(k, off));
        print_range(i, rc, base, size, k);
    }
}

static void do_attr(int i, const char *arg) {
    int k;
    long long off;
    if (slot_arg(arg, &k, &off)) usage_error(arg);
    CUdeviceptr p = slot_addr(k, off);
    unsigned long long start = 0, buffer = 0;
    size_t size = 0;
    int dev = -7;
    unsigned char ipc = 0xee;
    CUresult rc = cuPointerGetAttribute(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, p);
    kv("op%d.a11.rc=%d", i, (int)rc);
    kv("op%d.start_off=%lld", i, (long long)(start - slots[k].ptr));
    kv("op%d.a12.rc=%d", i, (int)cuPointerGetAttribute(&size, CU_POINTER_ATTRIBUTE_RANGE_SIZE, p));
    kv("op%d.size=%zu", i, size);
    kv("op%d.a7.rc=%d", i, (int)cuPointerGetAttribute(&buffer, CU_POINTER_ATTRIBUTE_BUFFER_ID, p));
    kv("op%d.buffer=%llu", i, buffer);
    kv("op%d.a9.rc=%d", i, (int)cuPointerGetAttribute(&dev, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, p));
    kv("op%d.dev=%d", i, dev);
    kv("op%d.a10.rc=%d", i,
       (int)cuPointerGetAttribute(&ipc, CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, p));
    kv("op%d.ipc=%d", i, ipc);

    CUpointer_attribute attrs[5] = {CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, CU_POINTER_ATTRIBUTE_RANGE_SIZE,
                                    CU_POINTER_ATTRIBUTE_BUFFER_ID, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                                    CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE};
    start = buffer = 0;
    size = 0;
    dev = -7;
    ipc = 0xee;
    void *data[5] = {&start, &size, &buffer, &dev, &ipc};
    kv("op%d.s.rc=%d", i, (int)cuPointerGetAttributes(5, attrs, data, p));
    kv("op%d.s.start_off=%lld", i, (long long)(start - slots[k].ptr));
    kv("op%d.s.size=%zu", i, size);
    kv("op%d.s.buffer=%llu", i, buffer);
    kv("op%d.s.dev=%d", i, dev);
    kv("op%d.s.ipc=%d", i, ipc);
}

static void do_ipc(int i, const char *arg) {
    int k;
    long long off;
    if (slot_arg(arg, &k, &off)) usage_error(arg);
    CUipcMemHandle h;
    memset(&h, 0, sizeof h);
    CUresult rc = cuIpcGetMemHandle(&h, slot_addr(k, off));
    kv("op%d.rc=%d", i, (int)rc);
    if (rc != CUDA_SUCCESS) return;
    int sim = memcmp(h.reserved, "gpusimIP", 8) == 0;
    kv("op%d.sim_handle=%d", i, sim);
    if (sim) {
        unsigned long long base = 0;
        memcpy(&base, h.reserved + 8, 8);
        kv("op%d.base_off=%lld", i, (long long)(base - slots[k].ptr));
    }
}

/* ---- data ---- */

static unsigned char *host_read(CUdeviceptr p, size_t n, CUresult *rc) {
    unsigned char *b = malloc(n ? n : 1);
    memset(b, 0, n ? n : 1);
    *rc = cuMemcpyDtoH(b, p, n);
    return b;
}

static int all_bytes(const unsigned char *b, size_t n, unsigned char v) {
    for (size_t j = 0; j < n; j++)
        if (b[j] != v) return 0;
    return 1;
}

static void do_neighbours(int i, const char *arg) {
    int k = -1, l = -1;
    if (sscanf(arg, "%d,%d", &k, &l) != 2 || k < 0 || l < 0 || k >= SLOTS || l >= SLOTS || !slots[k].live ||
        !slots[l].live) {
        kv("op%d.error=neighbours needs two live slots: '%s'", i, arg);
        return;
    }
    CUdeviceptr a = slots[k].ptr, b = slots[l].ptr;
    size_t na = slots[k].bytes, nb = slots[l].bytes, n = na < nb ? na : nb;
    CUresult r1, r2, r3;
    unsigned char *x, *y;

    /* 1: memset each */
    r1 = cuMemsetD8(a, 0xAA, na);
    r2 = cuMemsetD8(b, 0x55, nb);
    kv("op%d.set.rc=%d", i, (int)(r1 ? r1 : r2));
    x = host_read(a, na, &r1);
    y = host_read(b, nb, &r2);
    kv("op%d.set.ok=%d", i, !r1 && !r2 && all_bytes(x, na, 0xAA) && all_bytes(y, nb, 0x55));
    free(x);
    free(y);

    /* 2: a pattern into all of a */
    unsigned char *pat = malloc(na);
    for (size_t j = 0; j < na; j++) pat[j] = (unsigned char)(j * 31 + 7);
    r3 = cuMemcpyHtoD(a, pat, na);
    kv("op%d.htod.rc=%d", i, (int)r3);
    x = host_read(a, na, &r1);
    y = host_read(b, nb, &r2);
    kv("op%d.htod.ok=%d", i, !r1 && !r2 && memcmp(x, pat, na) == 0 && all_bytes(y, nb, 0x55));
    free(x);
    free(y);

    /* 3: a -> b */
    r3 = cuMemcpyDtoD(b, a, n);
    kv("op%d.dtod.rc=%d", i, (int)r3);
    x = host_read(a, na, &r1);
    y = host_read(b, nb, &r2);
    kv("op%d.dtod.ok=%d", i,
       !r1 && !r2 && memcmp(x, pat, na) == 0 && memcmp(y, pat, n) == 0 && all_bytes(y + n, nb - n, 0x55));
    free(x);
    free(y);

    /* 4: b again, a untouched */
    r3 = cuMemsetD8(b, 0x11, nb);
    kv("op%d.reset.rc=%d", i, (int)r3);
    x = host_read(a, na, &r1);
    y = host_read(b, nb, &r2);
    kv("op%d.reset.ok=%d", i, !r1 && !r2 && memcmp(x, pat, na) == 0 && all_bytes(y, nb, 0x11));
    free(x);
    free(y);
    free(pat);
}

/* ---- the randomized workload ---- */

#define RANDOM_LIVE 512
#define EDGE 16

struct live {
    CUdeviceptr base;
    size_t size;
    unsigned id;
};

static int by_base(const void *x, const void *y) {
    const struct live *a = x, *b = y;
    return a->base < b->base ? -1 : a->base > b->base;
}

/* The pattern of allocation `id`: PAT[id % 251 ..] (PAT holds MAXBYTES + 256 bytes). */
static unsigned char *PAT;

static const unsigned char *pattern(unsigned id) {
    return PAT + (id % 251);
}

static void do_random(const char *arg) {
    unsigned long long seed = 0, steps = 0, max_bytes = 0;
    if (sscanf(arg, "%llu:%llu:%llu", &seed, &steps, &max_bytes) != 3 || max_bytes == 0) usage_error(arg);
    uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
    PAT = malloc(max_bytes + 256);
    for (size_t j = 0; j < max_bytes + 256; j++) PAT[j] = (unsigned char)next_random(&s);
    int bits = 0;
    while ((1ull << (bits + 1)) <= max_bytes) bits++; /* 2^bits <= max_bytes */

    struct live live[RANDOM_LIVE], sorted[RANDOM_LIVE];
    int n = 0;
    unsigned next_id = 1;
    long ok = 0, oom = 0, other = 0, frees = 0, free_errors = 0, range_bad = 0, overlap = 0, misaligned = 0,
         bytes_bad = 0, whole_bad = 0, maxlive = 0, checks = 0;
    unsigned long long held = 0, max_held = 0;
    unsigned char edge[EDGE];

    for (unsigned long long step = 0; step < steps; step++) {
        uint64_t r = next_random(&s);
        int do_free = n == RANDOM_LIVE || (n > 0 && r % 10 < 4);
        if (do_free) {
            int j = (int)(next_random(&s) % (uint64_t)n);
            /* the whole buffer first */
            CUresult rc;
            unsigned char *b = host_read(live[j].base, live[j].size, &rc);
            if (rc != CUDA_SUCCESS || memcmp(b, pattern(live[j].id), live[j].size) != 0) whole_bad++;
            free(b);
            if (cuMemFree(live[j].base) == CUDA_SUCCESS) frees++;
            else free_errors++;
            held -= live[j].size;
            live[j] = live[--n];
        } else {
            /* log-uniform: an exponent in 0..bits, then uniform in [2^e, 2^(e+1)) capped */
            int e = (int)(next_random(&s) % (uint64_t)(bits + 1));
            unsigned long long lo = 1ull << e;
            unsigned long long size = lo + next_random(&s) % lo;
            if (size > max_bytes) size = max_bytes;
            CUdeviceptr p = 0;
            CUresult rc = cuMemAlloc(&p, (size_t)size);
            if (rc == CUDA_SUCCESS) {
                ok++;
                live[n].base = p;
                live[n].size = (size_t)size;
                live[n].id = next_id++;
                if (cuMemcpyHtoD(p, pattern(live[n].id), (size_t)size) != CUDA_SUCCESS) bytes_bad++;
                n++;
                held += size;
                if (held > max_held) max_held = held;
                if (n > maxlive) maxlive = n;
            } else if (rc == CUDA_ERROR_OUT_OF_MEMORY) {
                oom++;
            } else {
                other++;
            }
        }
        /* every live allocation: its range, its edges, its alignment; then no overlap */
        for (int j = 0; j < n; j++) {
            CUdeviceptr base = 0;
            size_t size = 0;
            CUdeviceptr probe = live[j].base + (CUdeviceptr)(next_random(&s) % live[j].size);
            checks++;
            if (cuMemGetAddressRange(&base, &size, probe) != CUDA_SUCCESS || base != live[j].base ||
                size != live[j].size)
                range_bad++;
            if (live[j].base % 512 != 0) misaligned++;
            size_t m = live[j].size < EDGE ? live[j].size : EDGE;
            const unsigned char *want = pattern(live[j].id);
            if (cuMemcpyDtoH(edge, live[j].base, m) != CUDA_SUCCESS || memcmp(edge, want, m) != 0) bytes_bad++;
            if (cuMemcpyDtoH(edge, live[j].base + live[j].size - m, m) != CUDA_SUCCESS ||
                memcmp(edge, want + live[j].size - m, m) != 0)
                bytes_bad++;
        }
        memcpy(sorted, live, sizeof(struct live) * (size_t)n);
        qsort(sorted, (size_t)n, sizeof(struct live), by_base);
        for (int j = 0; j + 1 < n; j++) {
            CUdeviceptr end = sorted[j].base + ((sorted[j].size + 511) & ~(CUdeviceptr)511);
            if (end > sorted[j + 1].base) overlap++;
        }
    }
    while (n > 0) {
        n--;
        CUresult rc;
        unsigned char *b = host_read(live[n].base, live[n].size, &rc);
        if (rc != CUDA_SUCCESS || memcmp(b, pattern(live[n].id), live[n].size) != 0) whole_bad++;
        free(b);
        if (cuMemFree(live[n].base) == CUDA_SUCCESS) frees++;
        else free_errors++;
    }
    kv("random.ok=%ld", ok);
    kv("random.oom=%ld", oom);
    kv("random.other=%ld", other);
    kv("random.frees=%ld", frees);
    kv("random.free_errors=%ld", free_errors);
    kv("random.range_bad=%ld", range_bad);
    kv("random.overlap=%ld", overlap);
    kv("random.misaligned=%ld", misaligned);
    kv("random.bytes_bad=%ld", bytes_bad);
    kv("random.whole_bad=%ld", whole_bad);
    kv("random.maxlive=%ld", maxlive);
    kv("random.max_held=%llu", max_held);
    kv("random.checks=%ld", checks);
    size_t f = 0, t = 0;
    kv("random.info.rc=%d", (int)cuMemGetInfo(&f, &t));
    kv("random.info.free=%zu", f);
    kv("random.info.total=%zu", t);
    free(PAT);
}

int main(int argc, char **argv) {
    CUresult rc = cuInit(0);
    kv("init.rc=%d", (int)rc);
    if (rc != CUDA_SUCCESS) {
        kv("done=1");
        return 0;
    }
    kv("device.rc=%d", (int)cuDeviceGet(&device, 0));

    for (int i = 1; i < argc && i < SLOTS; i++) {
        const char *arg = argv[i];
        if (starts_with(arg, "dev=")) {
            kv("op%d.rc=%d", i, (int)cuDeviceGet(&device, atoi(arg + 4)));
        } else if (starts_with(arg, "ctx=")) {
            kv("op%d.rc=%d", i, (int)make_context(arg + 4));
        } else if (!strcmp(arg, "ctxdestroy")) {
            CUresult r = cuCtxDestroy(created);
            kv("op%d.rc=%d", i, (int)r);
            if (r == CUDA_SUCCESS) kv("op%d.dropped=%d", i, drop_context_slots(created));
            created = NULL;
        } else if (!strcmp(arg, "reset")) {
            CUresult r = cuDevicePrimaryCtxReset(device);
            kv("op%d.rc=%d", i, (int)r);
            if (r == CUDA_SUCCESS) kv("op%d.dropped=%d", i, drop_context_slots(primary));
        } else if (starts_with(arg, "alloc=")) {
            do_alloc(i, arg + 6);
        } else if (starts_with(arg, "free=")) {
            kv("op%d.rc=%d", i, (int)release(atoi(arg + 5)));
        } else if (starts_with(arg, "freev1=")) {
            int k = atoi(arg + 7);
            kv("op%d.rc=%d", i, (int)((mem_free_v1_t)v1("cuMemFree"))((unsigned int)slots[k].ptr));
            slots[k].live = 0;
        } else if (starts_with(arg, "freeat=")) {
            int k;
            long long off;
            if (slot_arg(arg + 7, &k, &off)) usage_error(arg);
            CUdeviceptr p = slot_addr(k, off);
            CUresult r = cuMemFree(p);
            if (r == CUDA_SUCCESS && off == 0) slots[k].live = 0;
            kv("op%d.rc=%d", i, (int)r);
        } else if (starts_with(arg, "range=")) {
            do_range(i, arg + 6, 0);
        } else if (starts_with(arg, "rangev1=")) {
            do_range(i, arg + 8, 1);
        } else if (starts_with(arg, "attr=")) {
            do_attr(i, arg + 5);
        } else if (starts_with(arg, "ipc=")) {
            do_ipc(i, arg + 4);
        } else if (starts_with(arg, "diff=")) {
            int k = -1, l = -1;
            if (sscanf(arg + 5, "%d,%d", &k, &l) != 2 || k < 0 || l < 0 || k >= SLOTS || l >= SLOTS) usage_error(arg);
            kv("op%d.diff=%lld", i, (long long)(slots[l].ptr - slots[k].ptr));
        } else if (starts_with(arg, "touch=")) {
            int k = atoi(arg + 6);
            if (k < 0 || k >= SLOTS || slots[k].bytes == 0) usage_error(arg);
            CUdeviceptr first = slots[k].ptr, last = slots[k].ptr + slots[k].bytes - 1;
            unsigned char a = 0, b = 0;
            CUresult r = cuMemsetD8(first, 0x5A, 1);
            if (r == CUDA_SUCCESS) r = cuMemsetD8(last, 0xA5, 1);
            if (r == CUDA_SUCCESS) r = cuMemcpyDtoH(&a, first, 1);
            if (r == CUDA_SUCCESS) r = cuMemcpyDtoH(&b, last, 1);
            kv("op%d.rc=%d", i, (int)r);
            /* one byte: the second memset overwrote the first */
            kv("op%d.ok=%d", i, r == CUDA_SUCCESS && a == (slots[k].bytes == 1 ? 0xA5 : 0x5A) && b == 0xA5);
        } else if (!strcmp(arg, "info")) {
            size_t f = 0, t = 0;
            kv("op%d.rc=%d", i, (int)cuMemGetInfo(&f, &t));
            kv("op%d.free=%zu", i, f);
            kv("op%d.total=%zu", i, t);
        } else if (starts_with(arg, "usage=")) {
            typedef int (*usage_fn)(int, uint64_t *, uint64_t *, uint64_t *);
            typedef const char *(*version_fn)(void);
            usage_fn usage = (usage_fn)dlsym(RTLD_DEFAULT, "gpushim_memory_usage");
            version_fn version = (version_fn)dlsym(RTLD_DEFAULT, "gpushim_version");
            kv("op%d.api=%d", i, usage != NULL && version != NULL);
            if (usage && version) {
                uint64_t used = 0, peak = 0, limit = 0;
                kv("op%d.rc=%d", i, usage(atoi(arg + 6), &used, &peak, &limit));
                kv("op%d.in_use=%llu", i, (unsigned long long)used);
                kv("op%d.peak=%llu", i, (unsigned long long)peak);
                kv("op%d.limit=%llu", i, (unsigned long long)limit);
                kv("op%d.rc_null=%d", i, usage(atoi(arg + 6), NULL, NULL, NULL));
                kv("op%d.version=%s", i, version());
            }
        } else if (starts_with(arg, "sim=")) {
            char prefix[32];
            snprintf(prefix, sizeof prefix, "op%d.", i);
            sim_op(prefix, atoi(arg + 4));
        } else if (starts_with(arg, "galloc=") || starts_with(arg, "gcapture=")) {
            size_t n = (size_t)strtoull(strchr(arg, '=') + 1, NULL, 10);
            CUgraph g = NULL;
            CUresult r;
            if (arg[1] == 'a') {
                CUDA_MEM_ALLOC_NODE_PARAMS params;
                CUgraphNode alloc_node = NULL, free_node = NULL;
                memset(&params, 0, sizeof params);
                params.poolProps.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
                params.poolProps.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
                params.poolProps.location.id = device;
                params.bytesize = n;
                r = cuGraphCreate(&g, 0);
                if (r == CUDA_SUCCESS) r = cuGraphAddMemAllocNode(&alloc_node, g, NULL, 0, &params);
                if (r == CUDA_SUCCESS) r = cuGraphAddMemFreeNode(&free_node, g, &alloc_node, 1, params.dptr);
            } else {
                CUstream s = NULL;
                CUdeviceptr p = 0;
                r = cuStreamCreate(&s, 0);
                if (r == CUDA_SUCCESS) r = cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL);
                if (r == CUDA_SUCCESS) r = cuMemAllocAsync(&p, n, s);
                if (r == CUDA_SUCCESS) r = cuMemFreeAsync(p, s);
                if (r == CUDA_SUCCESS) r = cuStreamEndCapture(s, &g);
            }
            if (r == CUDA_SUCCESS) r = cuGraphInstantiate(&graph_execs[i], g, 0);
            kv("op%d.rc=%d", i, (int)r);
        } else if (starts_with(arg, "glaunch=") || starts_with(arg, "gupload=")) {
            int k = atoi(arg + 8);
            CUgraphExec e = (k >= 0 && k < SLOTS) ? graph_execs[k] : NULL;
            kv("op%d.rc=%d", i, (int)(arg[1] == 'l' ? cuGraphLaunch(e, (CUstream)0) : cuGraphUpload(e, (CUstream)0)));
        } else if (starts_with(arg, "gdestroy=")) {
            int k = atoi(arg + 9);
            kv("op%d.rc=%d", i, (int)cuGraphExecDestroy((k >= 0 && k < SLOTS) ? graph_execs[k] : NULL));
        } else if (!strcmp(arg, "gtrim")) {
            kv("op%d.rc=%d", i, (int)cuDeviceGraphMemTrim(device));
        } else if (!strcmp(arg, "gmem")) {
            cuuint64_t used = 0, reserved = 0;
            CUresult r = cuDeviceGetGraphMemAttribute(device, CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT, &used);
            if (r == CUDA_SUCCESS) r = cuDeviceGetGraphMemAttribute(device, CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT, &reserved);
            kv("op%d.rc=%d", i, (int)r);
            kv("op%d.used=%llu", i, (unsigned long long)used);
            kv("op%d.reserved=%llu", i, (unsigned long long)reserved);
        } else if (!strcmp(arg, "sync")) {
            kv("op%d.rc=%d", i, (int)cuCtxSynchronize());
        } else if (!strcmp(arg, "poolkeep") || !strcmp(arg, "pool")) {
            CUmemoryPool pool = NULL;
            CUresult r = cuDeviceGetMemPool(&pool, device);
            cuuint64_t reserved = 0, used = 0, keep = ~(cuuint64_t)0;
            if (r == CUDA_SUCCESS && arg[4] == 'k') r = cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep);
            if (r == CUDA_SUCCESS && arg[4] == 0) {
                r = cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &reserved);
                if (r == CUDA_SUCCESS) r = cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &used);
                kv("op%d.reserved=%llu", i, (unsigned long long)reserved);
                kv("op%d.used=%llu", i, (unsigned long long)used);
            }
            kv("op%d.rc=%d", i, (int)r);
        } else if (starts_with(arg, "neighbours=")) {
            do_neighbours(i, arg + 11);
        } else if (starts_with(arg, "random=")) {
            do_random(arg + 7);
        } else {
            usage_error(arg);
        }
    }

    int failures = 0;
    for (int k = 0; k < SLOTS; k++)
        if (slots[k].live && release(k) != CUDA_SUCCESS) failures++;
    kv("cleanup.failures=%d", failures);
    kv("done=1");
    return 0;
}
