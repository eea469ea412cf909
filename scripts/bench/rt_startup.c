/* Start-up of a CUDA runtime program (scripts/bench.sh --only startup): the first runtime call
 * initialises the runtime and the driver, creates the primary context and allocates; then one
 * free. Everything the shim does at a program's first CUDA use happens inside. */
#include <cuda_runtime_api.h>

int main(void) {
    void *p;
    if (cudaMalloc(&p, 1 << 20) != cudaSuccess) return 1;
    if (cudaFree(p) != cudaSuccess) return 2;
    return 0;
}
