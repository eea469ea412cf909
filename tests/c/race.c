/* 8 threads allocating and freeing random sizes with cuMemAlloc_v2/cuMemFree_v2 (linked
 * with -lcuda) on one device, so that a memory limit is contended from many threads at once.
 *
 *   race [THREADS] [ITERATIONS] [MAX_BYTES] [HELD]
 *
 * Each thread keeps up to HELD allocations of 1..MAX_BYTES bytes (xorshift, fixed seeds),
 * randomly allocating into an empty slot or freeing a full one. After joining, everything is
 * freed. A negative ITERATIONS runs until the process is killed; the first successful
 * allocation of such a run prints `racing=1` (the process is then mid-race: it holds memory). Prints successes, refusals (CUDA_ERROR_OUT_OF_MEMORY), other errors and the final
 * cuMemGetInfo.
 */
#include <cuda.h>
#include <pthread.h>
#include <stdint.h>

#include "scenario.h"

static int iterations = 4000;
static unsigned long long max_bytes = 8ull << 20;
static int held = 4;
static CUcontext ctx;
static int announced;

struct worker {
    pthread_t thread;
    uint64_t seed;
    long successes, refusals, errors, frees, free_errors;
};

static void *work(void *arg) {
    struct worker *w = arg;
    CUdeviceptr live[64] = {0};
    if (cuCtxSetCurrent(ctx) != CUDA_SUCCESS) {
        w->errors++;
        return NULL;
    }
    for (int it = 0; iterations < 0 || it < iterations; it++) {
        int k = (int)(next_random(&w->seed) % (uint64_t)held);
        if (live[k]) {
            if (cuMemFree(live[k]) == CUDA_SUCCESS) w->frees++;
            else w->free_errors++;
            live[k] = 0;
        } else {
            size_t bytes = 1 + (size_t)(next_random(&w->seed) % max_bytes);
            CUresult rc = cuMemAlloc(&live[k], bytes);
            if (rc == CUDA_SUCCESS) {
                w->successes++;
                if (iterations < 0 && !__atomic_exchange_n(&announced, 1, __ATOMIC_SEQ_CST)) kv("racing=1");
            }
            else if (rc == CUDA_ERROR_OUT_OF_MEMORY) { w->refusals++; live[k] = 0; }
            else { w->errors++; live[k] = 0; }
        }
    }
    for (int k = 0; k < held; k++)
        if (live[k]) {
            if (cuMemFree(live[k]) == CUDA_SUCCESS) w->frees++;
            else w->free_errors++;
        }
    return NULL;
}

int main(int argc, char **argv) {
    int threads = argc > 1 ? atoi(argv[1]) : 8;
    if (argc > 2) iterations = atoi(argv[2]);
    if (argc > 3) max_bytes = strtoull(argv[3], NULL, 10);
    if (argc > 4) held = atoi(argv[4]);
    if (threads < 1 || threads > 64 || iterations == 0 || held < 1 || held > 64 || max_bytes == 0) usage_error("arguments");

    CUresult rc = cuInit(0);
    kv("init.rc=%d", (int)rc);
    if (rc != CUDA_SUCCESS) return 0;
    CUdevice dev;
    rc = cuDeviceGet(&dev, 0);
    if (rc == CUDA_SUCCESS) rc = cuDevicePrimaryCtxRetain(&ctx, dev);
    kv("ctx.rc=%d", (int)rc);
    if (rc != CUDA_SUCCESS) return 0;

    struct worker workers[64];
    memset(workers, 0, sizeof workers);
    for (int t = 0; t < threads; t++) {
        workers[t].seed = 0x9E3779B97F4A7C15ull * (uint64_t)(t + 1);
        pthread_create(&workers[t].thread, NULL, work, &workers[t]);
    }
    long successes = 0, refusals = 0, errors = 0, frees = 0, free_errors = 0;
    for (int t = 0; t < threads; t++) {
        pthread_join(workers[t].thread, NULL);
        successes += workers[t].successes;
        refusals += workers[t].refusals;
        errors += workers[t].errors;
        frees += workers[t].frees;
        free_errors += workers[t].free_errors;
    }
    kv("successes=%ld", successes);
    kv("refusals=%ld", refusals);
    kv("errors=%ld", errors);
    kv("frees=%ld", frees);
    kv("free_errors=%ld", free_errors);

    size_t free_b = 0, total_b = 0;
    cuCtxSetCurrent(ctx);
    kv("info.rc=%d", (int)cuMemGetInfo(&free_b, &total_b));
    kv("info.free=%zu", free_b);
    kv("info.total=%zu", total_b);
    kv("done=1");
    return 0;
}
