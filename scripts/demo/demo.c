/* gpushim demo program: an ordinary CUDA runtime program, nothing gpushim-specific.
 * Prints what it sees of each device, then fills device 0 with 1 GiB blocks until
 * cudaMalloc refuses. */
#include <stdio.h>
#include <cuda_runtime_api.h>

int main(void) {
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
    while (blocks < 256 && (e = cudaMalloc(&ptr[blocks], 1ull << 30)) == cudaSuccess) blocks++;
    printf("device 0: allocated %d x 1 GiB, then cudaMalloc said: %s\n", blocks, cudaGetErrorString(e));
    for (int i = 0; i < blocks; i++) cudaFree(ptr[i]);
    return 0;
}
