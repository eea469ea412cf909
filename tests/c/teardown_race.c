/* A context torn down in one thread while another thread is handed its addresses again, before
 * the driver has given the old memory back (the simulated driver pauses there with
 * GPUSIM_TEARDOWN_DELAY_MS). Taking the reuse as proof that the old memory is gone would let
 * the second thread allocate it a second time. Linked with -lcuda; all sizes in MiB.
 *
 *   teardown_race API FILLER OWN AGAIN
 *
 *   API: "alloc" (cuMemAlloc_v2: served from a reserve in grow mode) or "managed"
 *   (cuMemAllocManaged: counted as the driver allocates it, in every mode).
 *
 * 1. Main: primary context of device 0, current; allocates FILLER through API.
 * 2. A thread: creates its own context, allocates OWN through API (address -> own.ptr), tells
 *    main, destroys the context without freeing (destroy.rc).
 * 3. Main, 100 ms after being told (the destroy under way): allocates AGAIN through API
 *    (again.rc, again.ptr; reuse=1 when again.ptr lies in what own.ptr was), then 1 MiB blocks
 *    through API until refused or 64 held -> fill.bytes, fill.refused.
 *    fill.during_destroy=1 when all that happened before the destroy returned.
 * 4. Main: joins the thread, then 1 MiB blocks again until refused (after.bytes: what the
 *    destroy gave back is free once it has returned), frees what it holds; done=1.
 */
#include <cuda.h>
#include <pthread.h>
#include <stdint.h>
#include <time.h>
#include <unistd.h>

#include "scenario.h"

/* CUDA 13's header names only cuCtxCreate_v4; the driver still exports the CUDA 12 entry point. */
CUresult CUDAAPI cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev);

#define MIB (1ull << 20)

static int managed;
static size_t own_bytes;
static CUdevice device;
static CUdeviceptr own_ptr;
static CUresult own_rc = CUDA_ERROR_UNKNOWN, destroy_rc = CUDA_ERROR_UNKNOWN;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t told = PTHREAD_COND_INITIALIZER;
static int allocated;
static volatile int destroy_returned;

static CUresult allocate(CUdeviceptr *p, size_t bytes) {
    return managed ? cuMemAllocManaged(p, bytes, CU_MEM_ATTACH_GLOBAL) : cuMemAlloc(p, bytes);
}

static void *tear_down(void *arg) {
    (void)arg;
    CUcontext own = NULL;
    if (cuCtxCreate_v2(&own, 0, device) == CUDA_SUCCESS) own_rc = allocate(&own_ptr, own_bytes);
    pthread_mutex_lock(&lock);
    allocated = 1;
    pthread_cond_signal(&told);
    pthread_mutex_unlock(&lock);
    if (own != NULL) destroy_rc = cuCtxDestroy(own);
    destroy_returned = 1;
    return NULL;
}

int main(int argc, char **argv) {
    if (argc != 5) {
        fprintf(stderr, "usage: teardown_race alloc|managed FILLER OWN AGAIN (MiB)\n");
        return 2;
    }
    managed = strcmp(argv[1], "managed") == 0;
    size_t filler = strtoull(argv[2], NULL, 10) * MIB, again = strtoull(argv[4], NULL, 10) * MIB;
    own_bytes = strtoull(argv[3], NULL, 10) * MIB;
    CUcontext primary = NULL;
    CUresult rc = cuInit(0);
    if (rc == CUDA_SUCCESS) rc = cuDeviceGet(&device, 0);
    if (rc == CUDA_SUCCESS) rc = cuDevicePrimaryCtxRetain(&primary, device);
    if (rc == CUDA_SUCCESS) rc = cuCtxSetCurrent(primary);
    kv("init.rc=%d", (int)rc);
    if (rc != CUDA_SUCCESS) return 0;
    CUdeviceptr filler_ptr = 0, again_ptr = 0, blocks[64];
    kv("filler.rc=%d", (int)allocate(&filler_ptr, filler));

    pthread_t thread;
    pthread_create(&thread, NULL, tear_down, NULL);
    pthread_mutex_lock(&lock);
    while (!allocated) pthread_cond_wait(&told, &lock);
    pthread_mutex_unlock(&lock);
    kv("own.rc=%d", (int)own_rc);
    struct timespec pause = {0, 100 * 1000 * 1000};
    nanosleep(&pause, NULL);

    CUresult again_rc = allocate(&again_ptr, again);
    kv("again.rc=%d", (int)again_rc);
    kv("reuse=%d", again_rc == CUDA_SUCCESS && own_ptr != 0 && again_ptr >= own_ptr && again_ptr < own_ptr + own_bytes);
    int n = 0, refused = 0;
    while (n < 64) {
        CUresult r = allocate(&blocks[n], MIB);
        if (r != CUDA_SUCCESS) {
            refused = r == CUDA_ERROR_OUT_OF_MEMORY;
            if (!refused) kv("fill.error=%d", (int)r);
            break;
        }
        n++;
    }
    kv("fill.bytes=%llu", (unsigned long long)n * MIB);
    kv("fill.refused=%d", refused);
    /* the whole scenario ran while the destroy was still under way */
    kv("fill.during_destroy=%d", !destroy_returned);
    pthread_join(thread, NULL);
    kv("destroy.rc=%d", (int)destroy_rc);
    /* once the destroy has returned, its memory is free again: 1 MiB blocks until refused */
    CUdeviceptr after[64];
    int m = 0;
    while (n + m < 64 && allocate(&after[m], MIB) == CUDA_SUCCESS) m++;
    kv("after.bytes=%llu", (unsigned long long)m * MIB);
    while (m > 0) cuMemFree(after[--m]);
    while (n > 0) cuMemFree(blocks[--n]);
    if (again_rc == CUDA_SUCCESS) cuMemFree(again_ptr);
    cuMemFree(filler_ptr);
    kv("done=1");
    return 0;
}
