/* Kernels and allocations on every device, for the placement log. Linked with -lcuda.
 *
 *   placement [NEED]
 *
 * With NEED, a program written for NEED devices: it stops (enough=0) if it sees fewer.
 *
 * On each device d the program sees (its primary context current):
 *   - loads a module from PTX text with kernels "vecAdd" and "_Z4fillPfi";
 *   - cuMemAlloc of (d+1) MiB twice, cuMemAllocManaged of 1 MiB once;
 *   - launches vecAdd (d+2) times on the default stream (cuLaunchKernel), _Z4fillPfi once on a
 *     stream it creates (cuLaunchKernelEx) and once cooperatively (cuLaunchCooperativeKernel);
 *   - loads a library from the same PTX and launches its kernel "vecAdd" once through its
 *     CUkernel handle (cuLibraryGetKernel, cuLaunchKernel);
 *   - instantiates an empty graph and launches it twice (cuGraphLaunch);
 *   - captures a launch of vecAdd on its stream into a graph and launches that graph once;
 *   - unloads everything, loads the module again and launches vecAdd once more.
 * Prints devices=N, per device dD.rc (the first failing call's result, 0 if none), done=1.
 */
#include <cuda.h>

#include "scenario.h"

static const char ptx[] =
    ".version 8.0\n"
    ".target sm_80\n"
    ".address_size 64\n"
    "\n"
    ".visible .entry vecAdd(\n"
    "    .param .u64 a\n"
    ")\n"
    "{\n"
    "    ret;\n"
    "}\n"
    "\n"
    ".visible .entry _Z4fillPfi(\n"
    "    .param .u64 p,\n"
    "    .param .u32 n\n"
    ")\n"
    "{\n"
    "    ret;\n"
    "}\n";

#define CHECK(call)                          \
    do {                                     \
        CUresult r_ = (call);                \
        if (r_ != CUDA_SUCCESS) return r_;   \
    } while (0)

static CUresult on_device(int d) {
    CUdevice dev;
    CUcontext ctx;
    CHECK(cuDeviceGet(&dev, d));
    CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CHECK(cuCtxSetCurrent(ctx));

    CUmodule module;
    CUfunction vec_add, fill;
    CHECK(cuModuleLoadData(&module, ptx));
    CHECK(cuModuleGetFunction(&vec_add, module, "vecAdd"));
    CHECK(cuModuleGetFunction(&fill, module, "_Z4fillPfi"));

    CUdeviceptr a, b, m;
    CHECK(cuMemAlloc(&a, (size_t)(d + 1) << 20));
    CHECK(cuMemAlloc(&b, (size_t)(d + 1) << 20));
    CHECK(cuMemAllocManaged(&m, 1 << 20, CU_MEM_ATTACH_GLOBAL));

    void *args[] = {&a};
    for (int i = 0; i < d + 2; i++) CHECK(cuLaunchKernel(vec_add, 1, 1, 1, 32, 1, 1, 0, NULL, args, NULL));

    CUstream stream;
    CHECK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
    int n = 8;
    void *fill_args[] = {&b, &n};
    CUlaunchConfig config;
    memset(&config, 0, sizeof config);
    config.gridDimX = config.gridDimY = config.gridDimZ = 1;
    config.blockDimX = 32;
    config.blockDimY = config.blockDimZ = 1;
    config.hStream = stream;
    CHECK(cuLaunchKernelEx(&config, fill, fill_args, NULL));
    CHECK(cuLaunchCooperativeKernel(fill, 1, 1, 1, 32, 1, 1, 0, stream, fill_args));
    CHECK(cuStreamSynchronize(stream));

    CUlibrary library;
    CUkernel kernel;
    CHECK(cuLibraryLoadData(&library, ptx, NULL, NULL, 0, NULL, NULL, 0));
    CHECK(cuLibraryGetKernel(&kernel, library, "vecAdd"));
    CHECK(cuLaunchKernel((CUfunction)kernel, 1, 1, 1, 32, 1, 1, 0, NULL, args, NULL));

    CUgraph graph;
    CUgraphExec exec;
    CHECK(cuGraphCreate(&graph, 0));
    CHECK(cuGraphInstantiateWithFlags(&exec, graph, 0));
    CHECK(cuGraphLaunch(exec, NULL));
    CHECK(cuGraphLaunch(exec, NULL));
    CHECK(cuCtxSynchronize());
    CHECK(cuGraphExecDestroy(exec));
    CHECK(cuGraphDestroy(graph));

    /* a launch into a stream being captured is a node of the graph, not a launch */
    CUgraph captured;
    CUgraphExec captured_exec;
    CHECK(cuStreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_GLOBAL));
    CHECK(cuLaunchKernel(vec_add, 1, 1, 1, 32, 1, 1, 0, stream, args, NULL));
    CHECK(cuStreamEndCapture(stream, &captured));
    CHECK(cuGraphInstantiateWithFlags(&captured_exec, captured, 0));
    CHECK(cuGraphLaunch(captured_exec, stream));
    CHECK(cuStreamSynchronize(stream));
    CHECK(cuGraphExecDestroy(captured_exec));
    CHECK(cuGraphDestroy(captured));

    CHECK(cuMemFree(a));
    CHECK(cuMemFree(b));
    CHECK(cuMemFree(m));
    CHECK(cuStreamDestroy(stream));
    CHECK(cuLibraryUnload(library));
    CHECK(cuModuleUnload(module));

    /* the same code loaded again: new handles, the same kernel name */
    CUmodule again;
    CUfunction vec_add_again;
    CHECK(cuModuleLoadData(&again, ptx));
    CHECK(cuModuleGetFunction(&vec_add_again, again, "vecAdd"));
    CHECK(cuLaunchKernel(vec_add_again, 1, 1, 1, 32, 1, 1, 0, NULL, args, NULL));
    CHECK(cuCtxSynchronize());
    CHECK(cuModuleUnload(again));
    return CUDA_SUCCESS;
}

int main(int argc, char **argv) {
    int count = 0, need = argc > 1 ? atoi(argv[1]) : 0;
    CUresult rc = cuInit(0);
    if (rc == CUDA_SUCCESS) rc = cuDeviceGetCount(&count);
    kv("init.rc=%d", (int)rc);
    kv("devices=%d", count);
    kv("enough=%d", count >= need);
    if (count < need) {
        kv("done=1");
        return 0;
    }
    for (int d = 0; d < count; d++) kv("d%d.rc=%d", d, (int)on_device(d));
    kv("done=1");
    return 0;
}
