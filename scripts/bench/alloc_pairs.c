/* gpushim benchmark: cost of cuMemAlloc_v2 + cuMemFree_v2 pairs (4 KiB), linked with -lcuda.
 *
 *   alloc_pairs callgrind N      100 warm-up pairs (in warm_up()), then N pairs inside
 *                                run_pairs() (for --toggle-collect=run_pairs)
 *   alloc_pairs single N         one thread: N pairs after a warm-up, prints ns per pair
 *   alloc_pairs threads T N      T threads x N pairs each, prints pairs per second
 *
 * Built with -DVIA_DLSYM, it opens libcuda.so.1 and looks its functions up with dlsym (as the
 * CUDA runtime and most frameworks reach the driver), instead of being linked with -lcuda: the
 * way HAMi-core intercepts (it exports only dlsym), for the side-by-side rows of bench.sh.
 *
 * Exit status 1 if CUDA initialisation or any allocation/free fails (one line on stderr says
 * which), so a benchmark script never takes a failed run for a figure.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <time.h>
#include <cuda.h>

#ifdef VIA_DLSYM
#include <dlfcn.h>
static CUresult (*p_cuInit)(unsigned int);
static CUresult (*p_cuDeviceGet)(CUdevice *, int);
static CUresult (*p_cuDevicePrimaryCtxRetain)(CUcontext *, CUdevice);
static CUresult (*p_cuCtxSetCurrent)(CUcontext);
static CUresult (*p_cuMemAlloc)(CUdeviceptr *, size_t);
static CUresult (*p_cuMemFree)(CUdeviceptr);
#define CU(f) p_##f

static int resolve(void) {
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    if (!h) { fprintf(stderr, "dlopen libcuda.so.1: %s\n", dlerror()); return 1; }
    p_cuInit = (CUresult (*)(unsigned int))dlsym(h, "cuInit");
    p_cuDeviceGet = (CUresult (*)(CUdevice *, int))dlsym(h, "cuDeviceGet");
    p_cuDevicePrimaryCtxRetain = (CUresult (*)(CUcontext *, CUdevice))dlsym(h, "cuDevicePrimaryCtxRetain");
    p_cuCtxSetCurrent = (CUresult (*)(CUcontext))dlsym(h, "cuCtxSetCurrent");
    p_cuMemAlloc = (CUresult (*)(CUdeviceptr *, size_t))dlsym(h, "cuMemAlloc_v2");
    p_cuMemFree = (CUresult (*)(CUdeviceptr))dlsym(h, "cuMemFree_v2");
    if (!p_cuInit || !p_cuDeviceGet || !p_cuDevicePrimaryCtxRetain || !p_cuCtxSetCurrent || !p_cuMemAlloc || !p_cuMemFree) {
        fprintf(stderr, "dlsym: a driver function is missing\n");
        return 1;
    }
    return 0;
}
#else
#define CU(f) f
static int resolve(void) { return 0; }
#endif

#define SIZE 4096

static CUcontext ctx;
static volatile int failed;

static int pair(void) {
    CUdeviceptr p;
    CUresult rc = CU(cuMemAlloc)(&p, SIZE);
    if (rc != CUDA_SUCCESS) {
        fprintf(stderr, "cuMemAlloc(%d) failed: %d\n", SIZE, (int)rc);
        return 1;
    }
    rc = CU(cuMemFree)(p);
    if (rc != CUDA_SUCCESS) {
        fprintf(stderr, "cuMemFree failed: %d\n", (int)rc);
        return 1;
    }
    return 0;
}

/* The measured loop. noipa: never merged with warm_up (identical code folding), never inlined. */
__attribute__((noinline, noipa)) int run_pairs(long n) {
    for (long i = 0; i < n; i++)
        if (pair()) return 1;
    return 0;
}

/* First calls resolve the shim's state and, in the grow mode, grow the reserve: outside the
 * measured function. */
__attribute__((noinline, noipa)) int warm_up(long n) {
    for (long i = 0; i < n; i++)
        if (pair()) return 1;
    return 0;
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

static void *worker(void *arg) {
    CU(cuCtxSetCurrent)(ctx);
    if (run_pairs(*(long *)arg)) failed = 1;
    return NULL;
}

int main(int argc, char **argv) {
    if (argc < 3) { fprintf(stderr, "usage: %s callgrind N | single N | threads T N\n", argv[0]); return 2; }
    CUdevice dev;
    CUresult rc;
    if (resolve()) return 1;
    if ((rc = CU(cuInit)(0)) || (rc = CU(cuDeviceGet)(&dev, 0)) || (rc = CU(cuDevicePrimaryCtxRetain)(&ctx, dev)) ||
        (rc = CU(cuCtxSetCurrent)(ctx))) {
        fprintf(stderr, "CUDA initialisation failed: %d\n", (int)rc);
        return 1;
    }
    if (warm_up(100)) return 1;
    if (!strcmp(argv[1], "callgrind")) return run_pairs(atol(argv[2]));
    if (!strcmp(argv[1], "single")) {
        long n = atol(argv[2]);
        double a = now();
        if (run_pairs(n)) return 1;
        printf("%.1f\n", (now() - a) * 1e9 / n);
        return 0;
    }
    if (argc < 4) return 2;
    int t = atoi(argv[2]);
    long n = atol(argv[3]);
    pthread_t th[64];
    if (t < 1 || t > 64) return 2;
    double a = now();
    for (int i = 0; i < t; i++) pthread_create(&th[i], NULL, worker, &n);
    for (int i = 0; i < t; i++) pthread_join(th[i], NULL);
    double s = now() - a;
    if (failed) return 1;
    printf("%.0f\n", t * n / s);
    return 0;
}
