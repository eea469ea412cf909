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
 * Virtual devices (GPUSHIM_VIRTUAL_DEVICES):
 *   attrs         selected cudaDeviceGetAttribute values of every device: devD.attrA
 *   getdev        cudaGetDevice -> opI.rc, opI.dev
 *   ptrdev=K      cudaPointerGetAttributes(slot K).device -> opI.rc, opI.dev, opI.type
 *   peer=A,B      cudaDeviceCanAccessPeer(A, B) -> opI.rc, opI.can
 *   copy=K,L      fill slot K (cudaMemcpy, at most 4 MiB, its device current), cudaMemcpyPeer to
 *                 slot L, read L back -> opI.fill, opI.rc, opI.back, opI.equal
 *   copyasync=K,L the same with cudaMemcpyPeerAsync on stream 0 and cudaStreamSynchronize
 *   hammer=SEED:ITERS:D,D..  one thread per device D (cudaSetDevice in the thread; all threads
 *                 meet at a barrier every 50 steps) allocating random sizes (cudaMalloc, up to
 *                 1.25 GiB, now and then 4.5 GiB) and freeing at random, cudaMemGetInfo after
 *                 every step: hammerD.* as in drvapi.c
 */
#include <cuda_runtime_api.h>

#include "scenario.h"
#include "nvml_ops.h"

#include <pthread.h>
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

static int dev_slot(int k) {
    return k > 0 && k < MAX_OPS && (slots[k].kind == K_DEV || slots[k].kind == K_ASYNC);
}

static void do_ptrdev(int i, int k) {
    if (!dev_slot(k)) {
        kv("op%d.error=slot %d holds no device pointer", i, k);
        return;
    }
    struct cudaPointerAttributes a;
    memset(&a, 0, sizeof a);
    a.device = -7;
    cudaError_t rc = cudaPointerGetAttributes(&a, slots[k].ptr);
    kv("op%d.rc=%d", i, (int)rc);
    kv("op%d.dev=%d", i, a.device);
    kv("op%d.type=%d", i, (int)a.type);
    if (rc != cudaSuccess) cudaGetLastError();
}

static void do_peer(int i, const char *arg) {
    int a = -1, b = -1, can = -1;
    if (sscanf(arg, "%d,%d", &a, &b) != 2) usage_error(arg);
    cudaError_t rc = cudaDeviceCanAccessPeer(&can, a, b);
    kv("op%d.rc=%d", i, (int)rc);
    kv("op%d.can=%d", i, can);
    if (rc != cudaSuccess) cudaGetLastError();
}

static void do_copy(int i, const char *arg, int async) {
    int k = -1, l = -1;
    if (sscanf(arg, "%d,%d", &k, &l) != 2 || !dev_slot(k) || !dev_slot(l)) {
        kv("op%d.error=copy needs two device-pointer slots: '%s'", i, arg);
        return;
    }
    size_t n = slots[k].bytes < slots[l].bytes ? slots[k].bytes : slots[l].bytes;
    if (n > (4u << 20)) n = 4u << 20;
    unsigned char *src = malloc(n), *back = malloc(n);
    for (size_t j = 0; j < n; j++) src[j] = (unsigned char)(j * 7 + 13 * i + 1);
    memset(back, 0, n);
    cudaSetDevice(slots[k].device);
    kv("op%d.fill=%d", i, (int)cudaMemcpy(slots[k].ptr, src, n, cudaMemcpyHostToDevice));
    cudaError_t rc;
    if (async) {
        rc = cudaMemcpyPeerAsync(slots[l].ptr, slots[l].device, slots[k].ptr, slots[k].device, n, 0);
        if (rc == cudaSuccess) rc = cudaStreamSynchronize(0);
    } else {
        rc = cudaMemcpyPeer(slots[l].ptr, slots[l].device, slots[k].ptr, slots[k].device, n);
    }
    kv("op%d.rc=%d", i, (int)rc);
    if (rc != cudaSuccess) cudaGetLastError();
    cudaSetDevice(slots[l].device);
    kv("op%d.back=%d", i, (int)cudaMemcpy(back, slots[l].ptr, n, cudaMemcpyDeviceToHost));
    kv("op%d.bytes=%zu", i, n);
    kv("op%d.equal=%d", i, memcmp(src, back, n) == 0);
    cudaSetDevice(current_device);
    cudaGetLastError();
    free(src);
    free(back);
}

#define HAMMER_MAX_LIVE 256
#define HAMMER_MAX_THREADS 16
struct hammer {
    int dev;
    unsigned seed;
    int iters;
    pthread_barrier_t *start;
    cudaError_t ctxrc;
    long ok, refused, other, spurious, infobad, left;
    unsigned long long maxheld, total, base;
};

static void *hammer_thread(void *arg) {
    struct hammer *h = arg;
    void *live[HAMMER_MAX_LIVE];
    size_t sizes[HAMMER_MAX_LIVE];
    int n = 0;
    unsigned long long held = 0;
    cudaError_t rc = cudaSetDevice(h->dev);
    if (rc == cudaSuccess) rc = cudaFree(NULL); /* make the device's context now */
    h->ctxrc = rc;
    pthread_barrier_wait(h->start);
    if (rc != cudaSuccess) {
        /* keep meeting the others at the barrier, or they wait forever */
        for (int it = 0; it < h->iters; it++)
            if (it % 50 == 49) pthread_barrier_wait(h->start);
        return NULL;
    }
    size_t f = 0, t = 0;
    cudaMemGetInfo(&f, &t);
    h->total = t;
    h->base = t - f; /* in use before the threads started (other slots of the program) */
    for (int it = 0; it < h->iters; it++) {
        /* meet the other threads now and then, so that all of them hold memory at once */
        if (it % 50 == 49) pthread_barrier_wait(h->start);
        unsigned r = (unsigned)rand_r(&h->seed);
        if (n > 0 && (r % 3 == 0 || n == HAMMER_MAX_LIVE)) {
            int j = (int)((unsigned)rand_r(&h->seed) % (unsigned)n);
            if (cudaFree(live[j]) == cudaSuccess) {
                held -= sizes[j];
            } else {
                h->other++;
                cudaGetLastError();
            }
            live[j] = live[n - 1];
            sizes[j] = sizes[n - 1];
            n--;
        } else {
            size_t size = (r % 16 == 1) ? (size_t)9 << 29
                                        : (size_t)(1 + (unsigned)rand_r(&h->seed) % 1280) << 20;
            void *p = NULL;
            rc = cudaMalloc(&p, size);
            if (rc == cudaSuccess) {
                h->ok++;
                live[n] = p;
                sizes[n] = size;
                n++;
                held += size;
                if (held > h->maxheld) h->maxheld = held;
            } else if (rc == cudaErrorMemoryAllocation) {
                h->refused++;
                if (h->base + held + size <= h->total) h->spurious++;
                cudaGetLastError();
            } else {
                h->other++;
                cudaGetLastError();
            }
        }
        f = t = 0;
        rc = cudaMemGetInfo(&f, &t);
        if (rc != cudaSuccess || t != h->total || t - f != h->base + held) h->infobad++;
    }
    while (n > 0) {
        n--;
        if (cudaFree(live[n]) != cudaSuccess) h->left++;
    }
    return NULL;
}

static void do_hammer(const char *arg) {
    unsigned seed = 0;
    int iters = 0, used = 0;
    struct hammer h[HAMMER_MAX_THREADS];
    pthread_t th[HAMMER_MAX_THREADS];
    int nt = 0;
    if (sscanf(arg, "%u:%d:%n", &seed, &iters, &used) < 2 || used == 0) usage_error(arg);
    for (const char *p = arg + used; *p && nt < HAMMER_MAX_THREADS;) {
        memset(&h[nt], 0, sizeof h[nt]);
        h[nt].dev = atoi(p);
        h[nt].seed = seed * 7919u + (unsigned)h[nt].dev;
        h[nt].iters = iters;
        nt++;
        p = strchr(p, ',');
        if (!p) break;
        p++;
    }
    pthread_barrier_t start;
    pthread_barrier_init(&start, NULL, (unsigned)nt);
    for (int k = 0; k < nt; k++) {
        h[k].start = &start;
        pthread_create(&th[k], NULL, hammer_thread, &h[k]);
    }
    for (int k = 0; k < nt; k++) pthread_join(th[k], NULL);
    pthread_barrier_destroy(&start);
    kv("hammer.threads=%d", nt);
    for (int k = 0; k < nt; k++) {
        int d = h[k].dev;
        kv("hammer%d.ctxrc=%d", d, (int)h[k].ctxrc);
        kv("hammer%d.ok=%ld", d, h[k].ok);
        kv("hammer%d.refused=%ld", d, h[k].refused);
        kv("hammer%d.other=%ld", d, h[k].other);
        kv("hammer%d.spurious=%ld", d, h[k].spurious);
        kv("hammer%d.infobad=%ld", d, h[k].infobad);
        kv("hammer%d.left=%ld", d, h[k].left);
        kv("hammer%d.maxheld=%llu", d, h[k].maxheld);
        kv("hammer%d.total=%llu", d, h[k].total);
        kv("hammer%d.base=%llu", d, h[k].base);
    }
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
        } else if (!strcmp(arg, "attrs")) {
            do_attrs();
        } else if (!strcmp(arg, "getdev")) {
            int d = -1;
            kv("op%d.rc=%d", i, (int)cudaGetDevice(&d));
            kv("op%d.dev=%d", i, d);
        } else if (starts_with(arg, "ptrdev=")) {
            do_ptrdev(i, atoi(arg + 7));
        } else if (starts_with(arg, "peer=")) {
            do_peer(i, arg + 5);
        } else if (starts_with(arg, "copy=")) {
            do_copy(i, arg + 5, 0);
        } else if (starts_with(arg, "copyasync=")) {
            do_copy(i, arg + 10, 1);
        } else if (starts_with(arg, "hammer=")) {
            do_hammer(arg + 7);
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
