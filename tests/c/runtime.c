/* The CUDA runtime (libcudart.so.12 or .13 from the PyPI wheels) on top of whatever
 * libcuda.so.1 the loader finds. Build with the headers of the runtime it links.
 * With -DCUDA_API_PER_THREAD_DEFAULT_STREAM the stream-ordered calls bind to their
 * _ptsz variants (cudart then asks the driver with cuGetProcAddress flags 2).
 *
 * Operations (see scenario.h), after the automatic init (cudaGetDeviceCount, device 0):
 *   dev=N  alloc=API:BYTES  free=K  info  props
 *   ids           identity of every device: ids.count, devD.{rc,name,uuid,pci,pcibus,total}
 *   bypci=BUSID   cudaDeviceGetByPCIBusId -> opI.rc, opI.dev
 *   spawn=CMD     run `/bin/sh -c CMD` (popen, inheriting the environment as it is now);
 *                 each `key=value` line of its stdout is printed as `opI.key=value`, then opI.status
 *   nvml          dlopen libnvidia-ml.so.1 and list what it shows (nvml_ops.h), keys opI.*
 * APIs: malloc pitch managed async pool array host
 * BYTES must be a multiple of 16 KiB for array and of 1 KiB for pitch.
 */
#include <cuda_runtime_api.h>

#include "scenario.h"
#include "nvml_ops.h"

#include <sys/wait.h>

enum kind { K_NONE, K_DEV, K_ASYNC, K_ARRAY, K_HOST };

struct slot {
    enum kind kind;
    int device;
    void *ptr;
    cudaArray_t array;
};
static struct slot slots[MAX_OPS];
static int device_count;
static int current_device;
static cudaMemPool_t pools[16];

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

static cudaError_t release_slot(int k) {
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

static void do_info(int i) {
    size_t free_b = 0, total_b = 0;
    cudaError_t rc = cudaMemGetInfo(&free_b, &total_b);
    kv("op%d.rc=%d", i, (int)rc);
    kv("op%d.free=%zu", i, free_b);
    kv("op%d.total=%zu", i, total_b);
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

static void uuid_string(char *out, size_t len, const unsigned char *u) {
    snprintf(out, len,
             "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
             u[0], u[1], u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13],
             u[14], u[15]);
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

static void do_bypci(int i, const char *bus_id) {
    int dev = -1;
    cudaError_t rc = cudaDeviceGetByPCIBusId(&dev, bus_id);
    kv("op%d.rc=%d", i, (int)rc);
    kv("op%d.dev=%d", i, dev);
    if (rc != cudaSuccess) cudaGetLastError();
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
        if (starts_with(arg, "dev=")) {
            current_device = atoi(arg + 4);
            kv("op%d.rc=%d", i, (int)cudaSetDevice(current_device));
        } else if (starts_with(arg, "alloc=")) {
            char name[32];
            unsigned long long bytes;
            if (parse_alloc(arg + 6, name, sizeof name, &bytes)) usage_error(arg);
            do_alloc(i, name, bytes);
        } else if (starts_with(arg, "free=")) {
            kv("op%d.rc=%d", i, (int)release_slot(atoi(arg + 5)));
        } else if (!strcmp(arg, "info")) {
            do_info(i);
        } else if (!strcmp(arg, "props")) {
            do_props(i);
        } else if (!strcmp(arg, "ids")) {
            do_ids();
        } else if (starts_with(arg, "bypci=")) {
            do_bypci(i, arg + 6);
        } else if (starts_with(arg, "spawn=")) {
            do_spawn(i, arg + 6);
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
