/* gpu-validate: a driver-API program linked with -lcuda (cuMemAlloc_v2, cuMemGetInfo_v2,
 * cuDeviceTotalMem_v2 through cuda.h's macros), as users build it.
 *
 * Operations, in order (one `key=value` line per fact on stdout):
 *   ids               cuInit -> init.rc; cuDeviceGetCount -> count; per device D:
 *                     devD.{name,uuid,pci,total,info.rc,info.free,info.total}
 *   touch             per device: cuMemAlloc 1 MiB, cuMemsetD8, cuMemcpyDtoH, compare
 *                     -> devD.touch (a CUresult)
 *   ctx=D             make device D's primary context current -> ctx.rc
 *   fill=D:CHUNK:CAP  cuMemAlloc_v2(CHUNK) on device D until an error or CAP bytes
 *                     -> fill.count, fill.bytes, fill.rc; the memory is kept until `free`
 *   free              free what `fill` kept
 *   exact=D:BYTES     one cuMemAlloc_v2(BYTES) -> exact.BYTES.rc, then cuMemFree_v2
 *   info=D            cuMemGetInfo_v2 on device D -> info.D.{rc,free,total} (repeatable)
 *   mark=NAME         mark.NAME=<CLOCK_REALTIME seconds> (to line up with an NVML monitor)
 *   sleep=MS          sleep
 * The program exits 0 after `done=1`, unless an operation is malformed (64).
 */
#include <cuda.h>

#include "probe.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_PTRS 8192

static int initialised = 0;
static CUresult init_rc = CUDA_SUCCESS;

static CUresult ensure_init(void) {
    if (!initialised) {
        init_rc = cuInit(0);
        initialised = 1;
        kv("init.rc=%d", (int)init_rc);
    }
    return init_rc;
}

static int device_count(void) {
    int n = 0;
    if (ensure_init() != CUDA_SUCCESS) return 0;
    if (cuDeviceGetCount(&n) != CUDA_SUCCESS) return 0;
    return n;
}

static CUresult make_current(int ordinal) {
    CUdevice dev;
    CUcontext ctx = NULL;
    CUresult rc = ensure_init();
    if (rc == CUDA_SUCCESS) rc = cuDeviceGet(&dev, ordinal);
    if (rc == CUDA_SUCCESS) rc = cuDevicePrimaryCtxRetain(&ctx, dev);
    if (rc == CUDA_SUCCESS) rc = cuCtxSetCurrent(ctx);
    return rc;
}

static void ids(void) {
    CUresult rc = ensure_init();
    int count = 0;
    if (rc == CUDA_SUCCESS) rc = cuDeviceGetCount(&count);
    kv("count.rc=%d", (int)rc);
    kv("count=%d", rc == CUDA_SUCCESS ? count : 0);
    if (rc != CUDA_SUCCESS) return;
    for (int d = 0; d < count; d++) {
        CUdevice dev;
        char name[256] = "", pci[64] = "";
        CUuuid uuid;
        size_t total = 0, free_b = 0, total_b = 0;
        memset(&uuid, 0, sizeof uuid);
        rc = cuDeviceGet(&dev, d);
        kv("dev%d.get.rc=%d", d, (int)rc);
        if (rc != CUDA_SUCCESS) continue;
        cuDeviceGetName(name, sizeof name, dev);
        cuDeviceGetUuid(&uuid, dev);
        cuDeviceGetPCIBusId(pci, sizeof pci, dev);
        rc = cuDeviceTotalMem(&total, dev); /* cuDeviceTotalMem_v2 */
        const unsigned char *u = (const unsigned char *)uuid.bytes;
        kv("dev%d.name=%s", d, name);
        kv("dev%d.uuid=GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", d, u[0], u[1],
           u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13], u[14], u[15]);
        kv("dev%d.pci=%s", d, pci);
        kv("dev%d.total.rc=%d", d, (int)rc);
        kv("dev%d.total=%zu", d, total);
        rc = make_current(d);
        if (rc == CUDA_SUCCESS) rc = cuMemGetInfo(&free_b, &total_b); /* cuMemGetInfo_v2 */
        kv("dev%d.info.rc=%d", d, (int)rc);
        kv("dev%d.info.free=%zu", d, free_b);
        kv("dev%d.info.total=%zu", d, total_b);
    }
}

static void touch(void) {
    int count = device_count();
    for (int d = 0; d < count; d++) {
        CUdeviceptr p = 0;
        unsigned char host[64];
        CUresult rc = make_current(d);
        if (rc == CUDA_SUCCESS) rc = cuMemAlloc(&p, 1 << 20);
        if (rc == CUDA_SUCCESS) rc = cuMemsetD8(p, 0x5a, 1 << 20);
        if (rc == CUDA_SUCCESS) rc = cuMemcpyDtoH(host, p, sizeof host);
        if (rc == CUDA_SUCCESS) {
            for (size_t i = 0; i < sizeof host; i++)
                if (host[i] != 0x5a) rc = CUDA_ERROR_UNKNOWN;
        }
        if (p) cuMemFree(p);
        kv("dev%d.touch=%d", d, (int)rc);
    }
}

static CUdeviceptr kept[MAX_PTRS];
static int kept_n = 0;

static void fill(int dev, unsigned long long chunk, unsigned long long cap) {
    unsigned long long bytes = 0;
    int n = 0;
    CUresult rc = make_current(dev);
    while (rc == CUDA_SUCCESS && bytes < cap && kept_n < MAX_PTRS) {
        rc = cuMemAlloc(&kept[kept_n], chunk); /* cuMemAlloc_v2 */
        if (rc == CUDA_SUCCESS) {
            kept_n++;
            n++;
            bytes += chunk;
        }
    }
    kv("fill.count=%d", n);
    kv("fill.bytes=%llu", bytes);
    kv("fill.rc=%d", (int)rc);
}

static void free_kept(void) {
    CUresult worst = CUDA_SUCCESS;
    for (int i = 0; i < kept_n; i++) {
        CUresult rc = cuMemFree(kept[i]);
        if (rc != CUDA_SUCCESS) worst = rc;
    }
    kept_n = 0;
    kv("free.rc=%d", (int)worst);
}

static void exact(int dev, unsigned long long bytes) {
    CUdeviceptr p = 0;
    CUresult rc = make_current(dev);
    if (rc == CUDA_SUCCESS) rc = cuMemAlloc(&p, bytes);
    kv("exact.%llu.rc=%d", bytes, (int)rc);
    if (rc == CUDA_SUCCESS) cuMemFree(p);
}

static void info(int dev) {
    size_t free_b = 0, total_b = 0;
    CUresult rc = make_current(dev);
    if (rc == CUDA_SUCCESS) rc = cuMemGetInfo(&free_b, &total_b);
    kv("info.%d.rc=%d", dev, (int)rc);
    kv("info.%d.free=%zu", dev, free_b);
    kv("info.%d.total=%zu", dev, total_b);
}

int main(int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        const char *op = argv[i];
        unsigned long long v[3] = {0, 0, 0};
        if (!strcmp(op, "ids")) {
            ids();
        } else if (!strcmp(op, "touch")) {
            touch();
        } else if (!strcmp(op, "free")) {
            free_kept();
        } else if (!strncmp(op, "ctx=", 4) && parse3(op + 4, v) == 1) {
            kv("ctx.rc=%d", (int)make_current((int)v[0]));
        } else if (!strncmp(op, "fill=", 5) && parse3(op + 5, v) == 3) {
            fill((int)v[0], v[1], v[2]);
        } else if (!strncmp(op, "exact=", 6) && parse3(op + 6, v) == 2) {
            exact((int)v[0], v[1]);
        } else if (!strncmp(op, "info=", 5) && parse3(op + 5, v) == 1) {
            info((int)v[0]);
        } else if (!strncmp(op, "mark=", 5) && op[5]) {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            kv("mark.%s=%.6f", op + 5, (double)ts.tv_sec + ts.tv_nsec / 1e9);
        } else if (!strncmp(op, "sleep=", 6) && parse3(op + 6, v) == 1) {
            struct timespec ts = {(time_t)(v[0] / 1000), (long)(v[0] % 1000) * 1000000L};
            nanosleep(&ts, NULL);
        } else {
            kv("error=bad operation '%s'", op);
            return 64;
        }
    }
    if (kept_n) free_kept();
    kv("done=1");
    return 0;
}
