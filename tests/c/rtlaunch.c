/* The CUDA runtime's own launch path (cudaLaunchKernel, what `<<<…>>>` compiles to), without
 * nvcc: a fat binary holding PTX is registered the way nvcc's generated code does
 * (__cudaRegisterFatBinary, __cudaRegisterFunction), then launched on every device.
 *
 *   rtlaunch
 *
 * On each device d: cudaSetDevice(d), cudaMalloc of 1 MiB, the kernel "vecAdd" launched (d+1)
 * times through cudaLaunchKernel on the default stream, cudaDeviceSynchronize, cudaFree.
 * Prints devices=N, dD.rc (the first failing call's cudaError_t, 0 if none), done=1.
 */
#include <cuda_runtime.h>
#include <stdint.h>

#include "rt_fatbin.h"
#include "scenario.h"


static const char ptx[] =
    ".version 8.0\n"
    ".target sm_52\n"
    ".address_size 64\n"
    "\n"
    ".visible .entry vecAdd(\n"
    "    .param .u64 a\n"
    ")\n"
    "{\n"
    "    ret;\n"
    "}\n";

/* The host-side stub: its address is the kernel's key in the runtime. */
static void vecAdd(void *a) { (void)a; }

static cudaError_t on_device(int d) {
    cudaError_t e;
    if ((e = cudaSetDevice(d)) != cudaSuccess) return e;
    void *a = NULL;
    if ((e = cudaMalloc(&a, 1 << 20)) != cudaSuccess) return e;
    void *args[] = {&a};
    dim3 grid = {1, 1, 1}, block = {32, 1, 1};
    for (int i = 0; i < d + 1; i++)
        if ((e = cudaLaunchKernel((const void *)vecAdd, grid, block, args, 0, NULL)) != cudaSuccess) return e;
    if ((e = cudaDeviceSynchronize()) != cudaSuccess) return e;
    return cudaFree(a);
}

int main(void) {
    void **handle = register_ptx_kernel(ptx, (const void *)vecAdd, "vecAdd");
    if (!handle) return 70;

    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    kv("count.rc=%d", (int)e);
    kv("devices=%d", count);
    for (int d = 0; d < count; d++) kv("d%d.rc=%d", d, (int)on_device(d));
    __cudaUnregisterFatBinary(handle);
    kv("done=1");
    return 0;
}
