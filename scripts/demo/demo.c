/* gpushim demo program: an ordinary CUDA runtime program, nothing gpushim-specific.
 * Prints what it sees of each device, then fills device 0 with 1 GiB blocks until
 * cudaMalloc refuses.
 *   demo [BLOCKS [SECONDS]]: allocate at most BLOCKS blocks of 1 GiB, and hold them for
 *   SECONDS before freeing them (so that `gpushim ps` or `gpushim metrics` can see them). */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
#include <cuda_runtime_api.h>

int main(int argc, char **argv) {
    int max_blocks = argc > 1 ? atoi(argv[1]) : 256;
    int hold = argc > 2 ? atoi(argv[2]) : 0;
    if (max_blocks < 0 || max_blocks > 256) max_blocks = 256;
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        printf("cudaGetDeviceCount: %s\n", cudaGetErrorString(e));
        return 1;
    }
    printf("devices: %d\n", n);
    for (int d = 0; d < n; d++) {
        struct cudaDeviceProp p;
        size_t free = 0, total = 0;
        cudaSetDevice(d);
        cudaGetDeviceProperties(&p, d);
        cudaMemGetInfo(&free, &total);
        printf("  %d: %s, totalGlobalMem %.2f GiB, cudaMemGetInfo free %.2f GiB of %.2f GiB\n", d, p.name,
               p.totalGlobalMem / 1073741824.0, free / 1073741824.0, total / 1073741824.0);
    }
    if (n == 0) return 0;
    cudaSetDevice(0);
    int blocks = 0;
    void *ptr[256];
    while (blocks < max_blocks && (e = cudaMalloc(&ptr[blocks], 1ull << 30)) == cudaSuccess) blocks++;
    if (blocks < max_blocks)
        printf("device 0: allocated %d x 1 GiB, then cudaMalloc said: %s\n", blocks, cudaGetErrorString(e));
    else
        printf("device 0: allocated %d x 1 GiB\n", blocks);
    fflush(stdout);
    if (hold > 0) sleep((unsigned)hold);
    for (int i = 0; i < blocks; i++) cudaFree(ptr[i]);
    return 0;
}
