/* gpu-bench: cudaMalloc+cudaFree latency and kernel launch rate.
 *
 * Built with nvcc (`nvcc -O2 -cudart static -o bench bench.cu`: alloc and launch), or without
 * nvcc as C (`gcc -x c bench.cu ... libcudart.so`: alloc only; the kernel needs nvcc).
 *
 *   bench alloc SIZE PAIRS REPS   REPS timed rounds of PAIRS cudaMalloc(SIZE)+cudaFree pairs
 *                                 -> `alloc SIZE us_per_pair...` (one value per round)
 *   bench launch N REPS           REPS rounds of N launches of an empty kernel + one sync
 *                                 -> `launch N launches_per_s...`
 * Each mode warms up first (context creation, the first allocation, module loading).
 * Exit status 0, or 1 with `error ...` when a CUDA call fails.
 */
#include <cuda_runtime_api.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifdef __CUDACC__
__global__ void empty_kernel(void) {}
#endif

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static int check(cudaError_t rc, const char *what) {
    if (rc == cudaSuccess) return 0;
    printf("error %s: %s (%d)\n", what, cudaGetErrorName(rc), (int)rc);
    fflush(stdout);
    return 1;
}

/* Creates the primary context of device 0 (cudaFree(NULL) does; its rc is not relied on,
 * the synchronisation says whether the context works). */
static int start_context(void) {
    if (check(cudaSetDevice(0), "cudaSetDevice")) return 1;
    (void)cudaFree(NULL);
    (void)cudaGetLastError();
    return check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
}

static int bench_alloc(size_t size, int pairs, int reps) {
    void *p = NULL;
    if (start_context()) return 1;
    for (int i = 0; i < 5; i++) { /* warm-up */
        if (check(cudaMalloc(&p, size), "cudaMalloc")) return 1;
        if (check(cudaFree(p), "cudaFree")) return 1;
    }
    printf("alloc %zu", size);
    for (int r = 0; r < reps; r++) {
        double t0 = now();
        for (int i = 0; i < pairs; i++) {
            if (check(cudaMalloc(&p, size), "cudaMalloc")) return 1;
            if (check(cudaFree(p), "cudaFree")) return 1;
        }
        printf(" %.4f", (now() - t0) * 1e6 / pairs);
    }
    printf("\n");
    return 0;
}

static int bench_launch(int n, int reps) {
#ifdef __CUDACC__
    if (start_context()) return 1;
    for (int i = 0; i < 1000; i++) empty_kernel<<<1, 1>>>();
    if (check(cudaDeviceSynchronize(), "warm-up")) return 1;
    printf("launch %d", n);
    for (int r = 0; r < reps; r++) {
        double t0 = now();
        for (int i = 0; i < n; i++) empty_kernel<<<1, 1>>>();
        if (check(cudaGetLastError(), "launch") || check(cudaDeviceSynchronize(), "sync")) return 1;
        printf(" %.1f", n / (now() - t0));
    }
    printf("\n");
    return 0;
#else
    (void)n;
    (void)reps;
    printf("error launch: built without nvcc, no kernel\n");
    return 1;
#endif
}

int main(int argc, char **argv) {
    int rc = 2;
    if (argc == 5 && !strcmp(argv[1], "alloc"))
        rc = bench_alloc((size_t)strtoull(argv[2], NULL, 10), atoi(argv[3]), atoi(argv[4]));
    else if (argc == 4 && !strcmp(argv[1], "launch"))
        rc = bench_launch(atoi(argv[2]), atoi(argv[3]));
    else
        fprintf(stderr, "usage: bench alloc SIZE PAIRS REPS | bench launch N REPS\n");
    fflush(stdout);
    return rc;
}
