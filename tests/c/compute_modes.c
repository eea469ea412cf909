/* The compute modes as a driver-API program sees them (tests/compute_modes.rs); linked with
 * -lcuda. Prints key=value lines:
 *   init=RC, percentage=…, pinned=…   CUDA_MPS_ACTIVE_THREAD_PERCENTAGE and
 *                                     CUDA_MPS_PINNED_DEVICE_MEM_LIMIT after cuInit ("unset")
 * with the argument "green", on device 0:
 *   retain=RC                         cuDevicePrimaryCtxRetain
 *   resource=RC, sms=N                cuCtxGetDevResource(primary context, SM)
 *   alloc=RC                          cuMemAlloc of 1 MiB with the primary context current
 *   same=0|1                          a second retain gives the same context
 *   free=RC, release=RC               cuMemFree, the last cuDevicePrimaryCtxRelease
 *   done=1
 */
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv)
{
    CUresult rc = cuInit(0);
    const char *p = getenv("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE");
    const char *m = getenv("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT");
    printf("init=%d\npercentage=%s\npinned=%s\n", (int)rc, p ? p : "unset", m ? m : "unset");
    if (rc == CUDA_SUCCESS && argc > 1 && strcmp(argv[1], "green") == 0) {
        CUdevice dev = 0;
        CUcontext ctx = NULL;
        cuDeviceGet(&dev, 0);
        rc = cuDevicePrimaryCtxRetain(&ctx, dev);
        printf("retain=%d\n", (int)rc);
        if (rc == CUDA_SUCCESS) {
            CUdevResource res;
            memset(&res, 0, sizeof res);
            printf("resource=%d\n", (int)cuCtxGetDevResource(ctx, &res, CU_DEV_RESOURCE_TYPE_SM));
            printf("sms=%u\n", res.sm.smCount);
            cuCtxSetCurrent(ctx);
            CUdeviceptr d = 0;
            printf("alloc=%d\n", (int)cuMemAlloc(&d, 1 << 20));
            CUcontext again = NULL;
            printf("same=%d\n", cuDevicePrimaryCtxRetain(&again, dev) == CUDA_SUCCESS && again == ctx);
            cuDevicePrimaryCtxRelease(dev);
            printf("free=%d\n", (int)cuMemFree(d));
            cuCtxSetCurrent(NULL);
            printf("release=%d\n", (int)cuDevicePrimaryCtxRelease(dev));
        }
    }
    printf("done=1\n");
    return 0;
}
