/* gpu-validate: a plain CUDA runtime program (no kernels), as users build it.
 *
 * Built by scripts/gpu/validate.py either with `nvcc -cudart static` (the static runtime,
 * as every nvcc binary by default) or, without nvcc, with gcc against a libcudart.so
 * (the PyPI runtime wheel, or .deps/cuda12 for --simulated).
 *
 * Operations, in order (one `key=value` line per fact on stdout):
 *   ids               cudaGetDeviceCount -> count.rc, count; per device D:
 *                     devD.{name,uuid,pci,total,info.rc,info.free,info.total}
 *   touch             per device: cudaMalloc 1 MiB, cudaMemset, cudaMemcpy to the host,
 *                     compare -> devD.touch (0 = ok, else the cudaError_t), devD.touch_err
 *   fill=D:CHUNK:CAP  on device D: cudaMalloc(CHUNK) until an error or CAP bytes, then
 *                     free all -> fill.count, fill.bytes, fill.rc (0: CAP reached), fill.err
 *   exact=D:BYTES     one cudaMalloc(BYTES) -> exact.BYTES.rc, then free it
 *   entry=D:CHUNK:CAP like fill, through cuMemAlloc/cuMemFree from cudaGetDriverEntryPoint
 *                     -> entry.found, entry.count, entry.bytes, entry.rc (a CUresult)
 * The program always exits 0 after `done=1`, unless an operation is malformed (64).
 */
#include <cuda_runtime_api.h>

#include "probe.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_PTRS 8192

static void *ptrs[MAX_PTRS];

static void ids(void) {
    int count = 0;
    cudaError_t rc = cudaGetDeviceCount(&count);
    kv("count.rc=%d", (int)rc);
    kv("count.err=%s", cudaGetErrorName(rc));
    if (rc != cudaSuccess) count = 0;
    kv("count=%d", count);
    for (int d = 0; d < count; d++) {
        struct cudaDeviceProp p;
        memset(&p, 0, sizeof p);
        rc = cudaGetDeviceProperties(&p, d);
        kv("dev%d.props.rc=%d", d, (int)rc);
        if (rc != cudaSuccess) continue;
        const unsigned char *u = (const unsigned char *)p.uuid.bytes;
        kv("dev%d.name=%s", d, p.name);
        kv("dev%d.uuid=GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", d, u[0], u[1],
           u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13], u[14], u[15]);
        kv("dev%d.pci=%04x:%02x:%02x.0", d, p.pciDomainID, p.pciBusID, p.pciDeviceID);
        kv("dev%d.total=%zu", d, p.totalGlobalMem);
        size_t free_b = 0, total_b = 0;
        rc = cudaSetDevice(d);
        if (rc == cudaSuccess) rc = cudaMemGetInfo(&free_b, &total_b);
        kv("dev%d.info.rc=%d", d, (int)rc);
        kv("dev%d.info.free=%zu", d, free_b);
        kv("dev%d.info.total=%zu", d, total_b);
    }
}

static void touch(void) {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess) count = 0;
    for (int d = 0; d < count; d++) {
        void *p = NULL;
        unsigned char host[64];
        cudaError_t rc = cudaSetDevice(d);
        if (rc == cudaSuccess) rc = cudaMalloc(&p, 1 << 20);
        if (rc == cudaSuccess) rc = cudaMemset(p, 0x5a, 1 << 20);
        if (rc == cudaSuccess) rc = cudaMemcpy(host, p, sizeof host, cudaMemcpyDeviceToHost);
        if (rc == cudaSuccess) {
            for (size_t i = 0; i < sizeof host; i++)
                if (host[i] != 0x5a) rc = cudaErrorUnknown;
        }
        if (p) cudaFree(p);
        kv("dev%d.touch=%d", d, (int)rc);
        kv("dev%d.touch_err=%s", d, cudaGetErrorName(rc));
    }
}

static void fill(int dev, unsigned long long chunk, unsigned long long cap) {
    int n = 0;
    unsigned long long bytes = 0;
    cudaError_t rc = cudaSetDevice(dev);
    while (rc == cudaSuccess && bytes < cap && n < MAX_PTRS) {
        rc = cudaMalloc(&ptrs[n], chunk);
        if (rc == cudaSuccess) {
            n++;
            bytes += chunk;
        }
    }
    (void)cudaGetLastError(); /* clear the sticky-free error state of the failed call */
    kv("fill.count=%d", n);
    kv("fill.bytes=%llu", bytes);
    kv("fill.rc=%d", (int)rc);
    kv("fill.err=%s", cudaGetErrorName(rc));
    for (int i = 0; i < n; i++) cudaFree(ptrs[i]);
}

static void exact(int dev, unsigned long long bytes) {
    void *p = NULL;
    cudaError_t rc = cudaSetDevice(dev);
    if (rc == cudaSuccess) rc = cudaMalloc(&p, bytes);
    (void)cudaGetLastError();
    kv("exact.%llu.rc=%d", bytes, (int)rc);
    if (rc == cudaSuccess) cudaFree(p);
}

typedef int (*mem_alloc_fn)(unsigned long long *dptr, size_t bytes); /* CUresult cuMemAlloc_v2 */
typedef int (*mem_free_fn)(unsigned long long dptr);

static cudaError_t entry_point(const char *name, void **fn) {
    enum cudaDriverEntryPointQueryResult status = cudaDriverEntryPointSymbolNotFound;
#if CUDART_VERSION >= 12050
    cudaError_t rc = cudaGetDriverEntryPointByVersion(name, fn, 12000, cudaEnableDefault, &status);
#elif CUDART_VERSION >= 12000
    cudaError_t rc = cudaGetDriverEntryPoint(name, fn, cudaEnableDefault, &status);
#else
    cudaError_t rc = cudaGetDriverEntryPoint(name, fn, cudaEnableDefault);
    status = cudaDriverEntryPointSuccess;
#endif
    if (rc == cudaSuccess && (status != cudaDriverEntryPointSuccess || !*fn)) rc = cudaErrorSymbolNotFound;
    return rc;
}

static void entry(int dev, unsigned long long chunk, unsigned long long cap) {
    void *a = NULL, *f = NULL;
    cudaError_t rc = cudaSetDevice(dev);
    if (rc == cudaSuccess) {
        /* make the primary context current (cudaFree(NULL)); its rc is not relied on, the
         * synchronisation below says whether the context works */
        (void)cudaFree(NULL);
        (void)cudaGetLastError();
        rc = cudaDeviceSynchronize();
    }
    if (rc == cudaSuccess) rc = entry_point("cuMemAlloc", &a);
    if (rc == cudaSuccess) rc = entry_point("cuMemFree", &f);
    kv("entry.found=%d", rc == cudaSuccess);
    kv("entry.lookup_rc=%d", (int)rc);
    if (rc != cudaSuccess) return;
    mem_alloc_fn alloc = (mem_alloc_fn)a;
    mem_free_fn release = (mem_free_fn)f;
    static unsigned long long dptrs[MAX_PTRS];
    int n = 0, res = 0;
    unsigned long long bytes = 0;
    while (res == 0 && bytes < cap && n < MAX_PTRS) {
        res = alloc(&dptrs[n], chunk);
        if (res == 0) {
            n++;
            bytes += chunk;
        }
    }
    kv("entry.count=%d", n);
    kv("entry.bytes=%llu", bytes);
    kv("entry.rc=%d", res);
    for (int i = 0; i < n; i++) release(dptrs[i]);
}

int main(int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        const char *op = argv[i];
        unsigned long long v[3] = {0, 0, 0};
        if (!strcmp(op, "ids")) {
            ids();
        } else if (!strcmp(op, "touch")) {
            touch();
        } else if (!strncmp(op, "fill=", 5) && parse3(op + 5, v) == 3) {
            fill((int)v[0], v[1], v[2]);
        } else if (!strncmp(op, "exact=", 6) && parse3(op + 6, v) == 2) {
            exact((int)v[0], v[1]);
        } else if (!strncmp(op, "entry=", 6) && parse3(op + 6, v) == 3) {
            entry((int)v[0], v[1], v[2]);
        } else {
            kv("error=bad operation '%s'", op);
            return 64;
        }
    }
    kv("done=1");
    return 0;
}
