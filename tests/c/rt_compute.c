/* A compute workload through the CUDA runtime's own launch path (cudaLaunchKernel, what
 * `<<<…>>>` compiles to): a PTX fat binary registered as nvcc's generated code does (see
 * rt_fatbin.h), its kernel "gpusim_busy" launched in a loop.
 *
 *   rt_compute SECONDS KERNEL_NS [sync]
 *
 * On device 0 (cudaSetDevice(0)): gpusim_busy(KERNEL_NS) launched through cudaLaunchKernel on
 * the default stream, back to back (with `sync`: cudaStreamSynchronize after each) for SECONDS
 * of wall time from the first launch, then cudaDeviceSynchronize. On the simulator each kernel
 * takes KERNEL_NS ns of simulated GPU time (its first parameter).
 * Prints `device=0 launches=N`, `wall_ns=W start_ns=S` (as compute_load.c) and `done=1`; a
 * failing call prints `error: <call> = <cudaError_t>` and the program exits 1.
 */
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "rt_fatbin.h"

static const char ptx[] =
    ".version 8.0\n"
    ".target sm_52\n"
    ".address_size 64\n"
    "\n"
    ".visible .entry gpusim_busy(\n"
    "    .param .u64 ns\n"
    ")\n"
    "{\n"
    "    ret;\n"
    "}\n";

/* The host-side stub: its address is the kernel's key in the runtime. */
static void gpusim_busy(uint64_t ns) { (void)ns; }

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

#define CHECK(call)                                                                          \
    do {                                                                                     \
        cudaError_t e_ = (call);                                                             \
        if (e_ != cudaSuccess) {                                                             \
            printf("error: %.*s = %d\n", (int)strcspn(#call, "("), #call, (int)e_);          \
            return 1;                                                                        \
        }                                                                                    \
    } while (0)

int main(int argc, char **argv) {
    char *end = NULL;
    double seconds = argc >= 3 ? strtod(argv[1], &end) : -1;
    if (argc < 3 || argc > 4 || !end || *end || !(seconds >= 0 && seconds < 1e6) ||
        (argc == 4 && strcmp(argv[3], "sync") != 0)) {
        fprintf(stderr, "usage: rt_compute SECONDS KERNEL_NS [sync]\n");
        return 64;
    }
    uint64_t ns = strtoull(argv[2], &end, 10);
    if (!end || *end || argv[2][0] == '-') {
        fprintf(stderr, "usage: rt_compute SECONDS KERNEL_NS [sync]\n");
        return 64;
    }
    int sync = argc == 4;

    void **handle = register_ptx_kernel(ptx, (const void *)gpusim_busy, "gpusim_busy");
    if (!handle) return 70;

    CHECK(cudaSetDevice(0));
    void *args[] = {&ns};
    dim3 grid = {1, 1, 1}, block = {32, 1, 1};
    CHECK(cudaFree(NULL)); /* the context made before the clock starts */
    unsigned long long launches = 0;
    uint64_t start = now_ns(), deadline = start + (uint64_t)(seconds * 1e9);
    while (now_ns() < deadline) {
        CHECK(cudaLaunchKernel((const void *)gpusim_busy, grid, block, args, 0, NULL));
        launches++;
        if (sync) CHECK(cudaStreamSynchronize(NULL));
    }
    CHECK(cudaDeviceSynchronize());
    uint64_t done = now_ns();
    printf("device=0 launches=%llu\n", launches);
    printf("wall_ns=%llu start_ns=%llu\n", (unsigned long long)(done - start), (unsigned long long)start);
    __cudaUnregisterFatBinary(handle);
    printf("done=1\n");
    return 0;
}
