/* gpushim benchmark: cost of cuMemAlloc_v2 + cuMemFree_v2 pairs, linked with -lcuda.
 *
 *   alloc_pairs callgrind N      run N pairs inside run_pairs() (for --toggle-collect=run_pairs)
 *   alloc_pairs threads T N      T threads x N pairs each, prints pairs per second
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <time.h>
#include <cuda.h>

static CUcontext ctx;

__attribute__((noinline)) int run_pairs(long n) {
    for (long i = 0; i < n; i++) {
        CUdeviceptr p;
        if (cuMemAlloc(&p, 4096) != CUDA_SUCCESS) return 1;
        if (cuMemFree(p) != CUDA_SUCCESS) return 1;
    }
    return 0;
}

static void *worker(void *arg) {
    cuCtxSetCurrent(ctx);
    long n = *(long *)arg;
    if (run_pairs(n)) fprintf(stderr, "allocation failed\n");
    return NULL;
}

int main(int argc, char **argv) {
    if (argc < 3) { fprintf(stderr, "usage: %s callgrind N | threads T N\n", argv[0]); return 2; }
    CUdevice dev;
    if (cuInit(0) || cuDeviceGet(&dev, 0) || cuDevicePrimaryCtxRetain(&ctx, dev) || cuCtxSetCurrent(ctx)) {
        fprintf(stderr, "CUDA initialisation failed\n");
        return 1;
    }
    if (!strcmp(argv[1], "callgrind")) {
        run_pairs(100); /* warm up: first calls resolve the shim's state */
        return run_pairs(atol(argv[2]));
    }
    int t = atoi(argv[2]);
    long n = atol(argv[3]);
    pthread_t th[64];
    if (t < 1 || t > 64) return 2;
    run_pairs(100);
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    for (int i = 0; i < t; i++) pthread_create(&th[i], NULL, worker, &n);
    for (int i = 0; i < t; i++) pthread_join(th[i], NULL);
    clock_gettime(CLOCK_MONOTONIC, &b);
    double s = (b.tv_sec - a.tv_sec) + (b.tv_nsec - a.tv_nsec) / 1e9;
    printf("%.0f\n", t * n / s);
    return 0;
}
