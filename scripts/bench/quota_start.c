/* Start-up cost of one CUDA process under gpushim, for scripts/bench-quota.sh: waits until the
 * CLOCK_REALTIME second START (so that many processes begin together), then times cuInit +
 * the primary context + the first cuMemAlloc_v2/cuMemFree_v2 of 1 MiB (the shim initialises, and
 * joins a shared quota, on the first of these calls) and prints "us=N rc=R".
 *
 *   quota_start START_EPOCH_SECONDS
 */
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

int main(int argc, char **argv) {
    double start = argc > 1 ? atof(argv[1]) : 0;
    while (now() < start) {
        struct timespec nap = {0, 200000};
        nanosleep(&nap, NULL);
    }
    double t0 = now();
    CUdevice dev;
    CUcontext ctx;
    CUdeviceptr p;
    int rc = cuInit(0);
    if (!rc) rc = cuDeviceGet(&dev, 0);
    if (!rc) rc = cuDevicePrimaryCtxRetain(&ctx, dev);
    if (!rc) rc = cuCtxSetCurrent(ctx);
    if (!rc) rc = cuMemAlloc(&p, 1 << 20);
    if (!rc) rc = cuMemFree(p);
    double t1 = now();
    printf("us=%.0f rc=%d\n", (t1 - t0) * 1e6, rc);
    return rc != 0;
}
