/* gpushim benchmark: cost of a kernel launch (cuLaunchKernel of a PTX kernel on the default
 * stream; the simulated driver records it and does nothing), linked with -lcuda.
 *
 *   launches N     100 warm-up launches (in warm_up(): the placement log's first line and its
 *                  name look-up happen there), then N launches inside run_launches() (for
 *                  callgrind --toggle-collect=run_launches)
 *
 * Exit status 1 if anything fails (one line on stderr says what).
 */
#include <stdio.h>
#include <stdlib.h>
#include <cuda.h>

static const char ptx[] = ".version 8.0\n.target sm_80\n.address_size 64\n"
                          ".visible .entry bench(\n.param .u64 a\n)\n{\nret;\n}\n";
static CUfunction f;
static CUdeviceptr arg;

static int launch(void) {
    void *args[] = {&arg};
    CUresult rc = cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, NULL, args, NULL);
    if (rc != CUDA_SUCCESS) {
        fprintf(stderr, "cuLaunchKernel failed: %d\n", (int)rc);
        return 1;
    }
    return 0;
}

__attribute__((noinline, noipa)) int run_launches(long n) {
    for (long i = 0; i < n; i++)
        if (launch()) return 1;
    return 0;
}

__attribute__((noinline, noipa)) int warm_up(long n) {
    for (long i = 0; i < n; i++)
        if (launch()) return 1;
    return 0;
}

int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 10000;
    CUdevice dev;
    CUcontext ctx;
    CUmodule module;
    if (cuInit(0) || cuDeviceGet(&dev, 0) || cuDevicePrimaryCtxRetain(&ctx, dev) || cuCtxSetCurrent(ctx) ||
        cuModuleLoadData(&module, ptx) || cuModuleGetFunction(&f, module, "bench")) {
        fprintf(stderr, "set-up failed\n");
        return 1;
    }
    if (warm_up(100) || run_launches(n)) return 1;
    return 0;
}
