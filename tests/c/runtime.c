/* The CUDA runtime (libcudart.so.12 or .13 from the PyPI wheels) on top of whatever
 * libcuda.so.1 the loader finds. Build with the headers of the runtime it links.
 * With -DCUDA_API_PER_THREAD_DEFAULT_STREAM the stream-ordered calls bind to their
 * _ptsz variants (cudart then asks the driver with cuGetProcAddress flags 2).
 *
 * Operations (see scenario.h; the ones both programs carry are in device_ops.h), after the automatic init (cudaGetDeviceCount, device 0):
 *   dev=N  alloc=API:BYTES  free=K  info  props
 *   ids           identity of every device: ids.count, devD.{rc,name,uuid,pci,pcibus,total}
 *   bypci=BUSID   cudaDeviceGetByPCIBusId -> opI.rc, opI.dev
 *   spawn=CMD     run `/bin/sh -c CMD` (popen, inheriting the environment as it is now);
 *                 each `key=value` line of its stdout is printed as `opI.key=value`, then opI.status
 *   nvml          dlopen libnvidia-ml.so.1 and list what it shows (nvml_ops.h), keys opI.*
 * Virtual devices (GPUSHIM_VIRTUAL_DEVICES):
 *   attrs         selected cudaDeviceGetAttribute values of every device: devD.attrA
 *   getdev        cudaGetDevice -> opI.rc, opI.dev
 *   ptrdev=K      cudaPointerGetAttributes(slot K).device -> opI.rc, opI.dev, opI.type
 *   peer=A,B      cudaDeviceCanAccessPeer(A, B) -> opI.rc, opI.can
 *   copy=K,L      fill slot K (cudaMemcpy, at most 4 MiB, its device current), cudaMemcpyPeer to
 *                 slot L, read L back -> opI.fill, opI.rc, opI.back, opI.equal
 *   copyasync=K,L the same with cudaMemcpyPeerAsync on stream 0 and cudaStreamSynchronize
 *   hammer=SEED:ITERS:D,D..  one thread per device D (cudaSetDevice in the thread; cudaMalloc,
 *                 cudaFree, cudaMemGetInfo): hammerD.* as described in device_ops.h
 */
#include <cuda_runtime_api.h>

#include "scenario.h"
#include "nvml_ops.h"

#include <stdint.h>
#include <sys/wait.h>

enum kind { K_NONE, K_DEV, K_ASYNC, K_ARRAY, K_HOST };

struct slot {
    enum kind kind;
    int device;
    size_t bytes;
    void *ptr;
    cudaArray_t array;
};
static struct slot slots[MAX_OPS];
static int device_count;
static int current_device;
static cudaMemPool_t pools[16];

#include "device_ops.h"

static int set_device(int dev) {
    current_device = dev;
    return (int)cudaSetDevice(dev);
}

static cudaError_t device_pool(cudaMemPool_t *out) {
    if (current_device < 0 || current_device >= 16) return cudaErrorInvalidDevice;
    if (!pools[current_device]) {
        struct cudaMemPoolProps props;
        memset(&props, 0, sizeof props);
        props.allocType = cudaMemAllocationTypePinned;
        props.handleTypes = cudaMemHandleTypeNone;
        props.location.type = cudaMemLocationTypeDevice;
        props.location.id = current_device;
        cudaError_t rc = cudaMemPoolCreate(&pools[current_device], &props);
        if (rc != cudaSuccess) return rc;
    }
    *out = pools[current_device];
    return cudaSuccess;
}

static void do_alloc(int i, const char *name, unsigned long long bytes) {
    struct slot *s = &slots[i];
    cudaError_t rc;
    s->device = current_device;
    s->bytes = bytes;
    if (!strcmp(name, "malloc")) {
        s->kind = K_DEV;
        rc = cudaMalloc(&s->ptr, bytes);
    } else if (!strcmp(name, "pitch")) {
        size_t pitch = 0, height = bytes / 1024;
        s->kind = K_DEV;
        rc = cudaMallocPitch(&s->ptr, &pitch, 1000, height);
        kv("op%d.pitch=%zu", i, pitch);
    } else if (!strcmp(name, "managed")) {
        s->kind = K_DEV;
        rc = cudaMallocManaged(&s->ptr, bytes, cudaMemAttachGlobal);
    } else if (!strcmp(name, "async")) {
        s->kind = K_ASYNC;
        rc = cudaMallocAsync(&s->ptr, bytes, 0);
        if (rc == cudaSuccess) kv("op%d.sync=%d", i, (int)cudaStreamSynchronize(0));
    } else if (!strcmp(name, "pool")) {
        cudaMemPool_t pool = NULL;
        s->kind = K_ASYNC;
        rc = device_pool(&pool);
        if (rc == cudaSuccess) {
            rc = cudaMallocFromPoolAsync(&s->ptr, bytes, pool, 0);
            if (rc == cudaSuccess) kv("op%d.sync=%d", i, (int)cudaStreamSynchronize(0));
        } else {
            kv("op%d.poolrc=%d", i, (int)rc);
        }
    } else if (!strcmp(name, "array")) {
        struct cudaChannelFormatDesc desc = cudaCreateChannelDesc(32, 32, 32, 32, cudaChannelFormatKindFloat);
        s->kind = K_ARRAY;
        rc = cudaMallocArray(&s->array, &desc, 1024, bytes / (1024 * 16), 0);
    } else if (!strcmp(name, "host")) {
        s->kind = K_HOST;
        rc = cudaMallocHost(&s->ptr, bytes);
    } else {
        kv("error=unknown api '%s'", name);
        exit(64);
    }
    if (rc != cudaSuccess) s->kind = K_NONE;
    kv("op%d.rc=%d", i, (int)rc);
    /* a failed allocation leaves a sticky-free error state behind in some versions: clear it */
    if (rc != cudaSuccess) cudaGetLastError();
}

static int release_slot(int k) {
    struct slot *s = &slots[k];
    cudaError_t rc = cudaSuccess;
    int back = current_device;
    if (s->kind == K_NONE) return cudaErrorInvalidValue;
    if (s->device != current_device) cudaSetDevice(s->device);
    switch (s->kind) {
    case K_DEV: rc = cudaFree(s->ptr); break;
    case K_ASYNC:
        rc = cudaFreeAsync(s->ptr, 0);
        if (rc == cudaSuccess) rc = cudaStreamSynchronize(0);
        break;
    case K_ARRAY: rc = cudaFreeArray(s->array); break;
    case K_HOST: rc = cudaFreeHost(s->ptr); break;
    case K_NONE: break;
    }
    s->kind = K_NONE;
    if (back != s->device) cudaSetDevice(back);
    return rc;
}

static int mem_info(size_t *free_b, size_t *total_b) {
    return (int)cudaMemGetInfo(free_b, total_b);
}

static void do_props(int i) {
    for (int d = 0; d < device_count; d++) {
        struct cudaDeviceProp prop;
        memset(&prop, 0, sizeof prop);
        cudaError_t rc = cudaGetDeviceProperties(&prop, d);
        kv("op%d.rc%d=%d", i, d, (int)rc);
        kv("op%d.total%d=%zu", i, d, prop.totalGlobalMem);
        kv("op%d.name%d=%s", i, d, prop.name);
    }
}

static void do_ids(void) {
    int n = -1;
    kv("ids.count.rc=%d", (int)cudaGetDeviceCount(&n));
    kv("ids.count=%d", n);
    for (int d = 0; d < n && d < 64; d++) {
        struct cudaDeviceProp prop;
        char uuid[64], pci[64] = "";
        memset(&prop, 0, sizeof prop);
        cudaError_t rc = cudaGetDeviceProperties(&prop, d);
        kv("dev%d.rc=%d", d, (int)rc);
        kv("dev%d.name=%s", d, prop.name);
        uuid_string(uuid, sizeof uuid, (const unsigned char *)prop.uuid.bytes);
        kv("dev%d.uuid=%s", d, uuid);
        kv("dev%d.pcibus=%d", d, prop.pciBusID);
        kv("dev%d.total=%zu", d, prop.totalGlobalMem);
        kv("dev%d.pci.rc=%d", d, (int)cudaDeviceGetPCIBusId(pci, sizeof pci, d));
        kv("dev%d.pci=%s", d, pci);
    }
}

static int device_by_pci(int *dev, const char *bus_id) {
    cudaError_t rc = cudaDeviceGetByPCIBusId(dev, bus_id);
    if (rc != cudaSuccess) cudaGetLastError();
    return (int)rc;
}

static void do_spawn(int i, const char *cmd) {
    fflush(stdout);
    FILE *f = popen(cmd, "r");
    if (!f) {
        kv("op%d.status=-1", i);
        return;
    }
    char line[4096];
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = 0;
        if (strchr(line, '=')) kv("op%d.%s", i, line);
    }
    int status = pclose(f);
    kv("op%d.status=%d", i, WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
}

/* ---- virtual devices ---- */

static void do_attrs(void) {
    static const int attrs[] = {1, 10, 16, 33, 34, 50, 75, 76, 83, 89, 115};
    for (int d = 0; d < device_count; d++) {
        for (size_t k = 0; k < sizeof attrs / sizeof attrs[0]; k++) {
            int v = -1;
            cudaError_t rc = cudaDeviceGetAttribute(&v, (enum cudaDeviceAttr)attrs[k], d);
            if (rc != cudaSuccess) {
                kv("dev%d.attr%d.rc=%d", d, attrs[k], (int)rc);
                cudaGetLastError();
            }
            kv("dev%d.attr%d=%d", d, attrs[k], v);
        }
    }
}

static int slot_is_dptr(int k) {
    return k > 0 && k < MAX_OPS && (slots[k].kind == K_DEV || slots[k].kind == K_ASYNC);
}

static size_t slot_bytes(int k) {
    return slots[k].bytes;
}

static void do_ptrdev(int i, int k) {
    struct cudaPointerAttributes a;
    memset(&a, 0, sizeof a);
    a.device = -7;
    cudaError_t rc = cudaPointerGetAttributes(&a, slots[k].ptr);
    kv("op%d.rc=%d", i, (int)rc);
    kv("op%d.dev=%d", i, a.device);
    kv("op%d.type=%d", i, (int)a.type);
    if (rc != cudaSuccess) cudaGetLastError();
}

static int can_access_peer(int *can, int a, int b) {
    cudaError_t rc = cudaDeviceCanAccessPeer(can, a, b);
    if (rc != cudaSuccess) cudaGetLastError();
    return (int)rc;
}

static int copy_fill(int k, int l, const void *src, size_t n) {
    (void)l;
    cudaSetDevice(slots[k].device);
    return (int)cudaMemcpy(slots[k].ptr, src, n, cudaMemcpyHostToDevice);
}

static int copy_peer(int k, int l, size_t n, int async) {
    cudaError_t rc;
    if (async) {
        rc = cudaMemcpyPeerAsync(slots[l].ptr, slots[l].device, slots[k].ptr, slots[k].device, n, 0);
        if (rc == cudaSuccess) rc = cudaStreamSynchronize(0);
    } else {
        rc = cudaMemcpyPeer(slots[l].ptr, slots[l].device, slots[k].ptr, slots[k].device, n);
    }
    if (rc != cudaSuccess) cudaGetLastError();
    return (int)rc;
}

static int copy_read_back(void *back, int l, size_t n) {
    cudaSetDevice(slots[l].device);
    return (int)cudaMemcpy(back, slots[l].ptr, n, cudaMemcpyDeviceToHost);
}

static void copy_end(int was) {
    cudaSetDevice(was);
    cudaGetLastError();
}

/* hammer: cudaSetDevice in the thread, cudaMalloc / cudaFree */
static int hammer_enter(int dev) {
    cudaError_t rc = cudaSetDevice(dev);
    if (rc == cudaSuccess) rc = cudaFree(NULL); /* make the device's context now */
    return (int)rc;
}

static enum hammer_alloc_result hammer_alloc(unsigned long long *ptr, size_t size) {
    void *p = NULL;
    cudaError_t rc = cudaMalloc(&p, size);
    *ptr = (uintptr_t)p;
    if (rc == cudaSuccess) return HAMMER_OK;
    cudaGetLastError();
    return rc == cudaErrorMemoryAllocation ? HAMMER_REFUSED : HAMMER_OTHER;
}

static int hammer_free(unsigned long long ptr) {
    cudaError_t rc = cudaFree((void *)(uintptr_t)ptr);
    if (rc != cudaSuccess) cudaGetLastError();
    return (int)rc;
}

int main(int argc, char **argv) {
    int version = 0;
    cudaRuntimeGetVersion(&version);
    kv("runtime_version=%d", version);
    cudaError_t rc = cudaGetDeviceCount(&device_count);
    kv("init.rc=%d", (int)rc);
    if (rc != cudaSuccess) {
        kv("done=1");
        return 0;
    }
    kv("count=%d", device_count);
    kv("setdevice.rc=%d", (int)cudaSetDevice(0));

    for (int i = 1; i < argc && i < MAX_OPS; i++) {
        const char *arg = argv[i];
        if (device_op(i, arg)) continue;
        if (!strcmp(arg, "props")) {
            do_props(i);
        } else if (starts_with(arg, "spawn=")) {
            do_spawn(i, arg + 6);
        } else if (!strcmp(arg, "getdev")) {
            int d = -1;
            cudaError_t rc = cudaGetDevice(&d);
            kv_rc_and(i, (int)rc, "dev", d);
        } else if (!strcmp(arg, "nvml")) {
            char prefix[32];
            snprintf(prefix, sizeof prefix, "op%d.", i);
            nvml_list(prefix);
        } else {
            usage_error(arg);
        }
    }

    int failures = 0;
    for (int k = 0; k < MAX_OPS; k++)
        if (slots[k].kind != K_NONE && release_slot(k) != cudaSuccess) failures++;
    for (int d = 0; d < 16; d++)
        if (pools[d] && cudaMemPoolDestroy(pools[d]) != cudaSuccess) failures++;
    kv("cleanup.failures=%d", failures);
    kv("done=1");
    return 0;
}
