/* Every allocation API from several threads at once, with contexts destroyed under live
 * allocations, a fork, and a primary-context reset: what the shim counts must never let the
 * driver hold more than the limit, and nothing may stay counted once everything is freed.
 * Linked with -lcuda.
 *
 *   stress THREADS ROUNDS MAX_BYTES SEED FILL_CAP
 *
 * 1. First use, concurrently: THREADS threads wait at a barrier, then each retains the primary
 *    context of device 0 and allocates 4 KiB at once (the first context, the first
 *    preallocation); they meet at the barrier again before going on.
 * 2. Each thread then runs ROUNDS random steps (xorshift from SEED and its index): allocate
 *    (cuMemAlloc_v2, cuMemAllocPitch_v2, cuMemAllocManaged, cuMemAllocAsync on the NULL stream
 *    then cuStreamSynchronize, cuArrayCreate_v2; 1..MAX_BYTES; or VMM: cuMemCreate of 2-8 MiB,
 *    mapped and released at once, freed by cuMemUnmap), free one (its API's own free),
 *    read cuMemGetInfo (free ≤ total), and now and then (thread 0, every 16th step) create its
 *    own context, allocate twice in it and destroy it without freeing.
 * 3. Main: fork a child that exits at once (exit handlers run in it), wait for it.
 * 4. Main: retain the primary context, allocate three things, cuDevicePrimaryCtxReset (the
 *    driver frees them), release what the threads retained.
 * 5. Main: fill: cuMemAlloc_v2 of 1 MiB (a size every mode tiles the limit with) until refused
 *    or FILL_CAP bytes are held ->
 *    fill.bytes, fill.refused (1 if it stopped at a refusal); then free them.
 * 6. Main: cuMemGetInfo -> info.free, info.total.
 * Prints first.ok (threads whose first allocation succeeded), ok, oom, errors (anything else),
 * free_errors, info_bad (free > total), child.status, reset.rc, info.rc, done=1.
 */
#include <cuda.h>
#include <pthread.h>
#include <stdint.h>
#include <sys/wait.h>
#include <unistd.h>

#include "scenario.h"

/* CUDA 13's header names only cuCtxCreate_v4; the driver still exports the CUDA 12 entry point. */
CUresult CUDAAPI cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev);

#define HELD 8
#define FILL_BLOCK (1u << 20)

enum kind { NONE, DEV, MANAGED, ASYNC, ARRAY, VMM };

struct held {
    enum kind kind;
    CUdeviceptr ptr;
    CUarray array;
    size_t vmm_size;
};

struct worker {
    pthread_t thread;
    int index;
    uint64_t seed;
    long first_ok, ok, oom, errors, free_errors, info_bad;
};

static int rounds = 2000;
static unsigned long long max_bytes = 4ull << 20;
static CUdevice device;
static pthread_barrier_t start;

static void tally(struct worker *w, CUresult rc) {
    if (rc == CUDA_SUCCESS) w->ok++;
    else if (rc == CUDA_ERROR_OUT_OF_MEMORY) w->oom++;
    else w->errors++;
}

static CUresult allocate(struct worker *w, struct held *h) {
    size_t bytes = 1 + (size_t)(next_random(&w->seed) % max_bytes);
    CUresult rc;
    switch (next_random(&w->seed) % 6) {
    case 5: {
        /* as NVIDIA's samples do: create, map, release at once; the memory stays until unmapped */
        CUmemAllocationProp prop;
        CUmemGenericAllocationHandle handle = 0;
        memset(&prop, 0, sizeof prop);
        prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
        prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        prop.location.id = device;
        size_t size = (size_t)(2u << 20) * (1 + bytes % 4);
        h->kind = VMM;
        h->vmm_size = size;
        rc = cuMemCreate(&handle, size, &prop, 0);
        if (rc != CUDA_SUCCESS) break;
        rc = cuMemAddressReserve(&h->ptr, size, 0, 0, 0);
        if (rc == CUDA_SUCCESS) {
            rc = cuMemMap(h->ptr, size, 0, handle, 0);
            if (rc != CUDA_SUCCESS) cuMemAddressFree(h->ptr, size);
        }
        if (cuMemRelease(handle) != CUDA_SUCCESS) w->errors++;
        break;
    }
    case 0:
        h->kind = DEV;
        rc = cuMemAlloc(&h->ptr, bytes);
        break;
    case 1: {
        size_t pitch = 0, width = 1 + bytes % 4096, height = 1 + bytes / 4096;
        h->kind = DEV;
        rc = cuMemAllocPitch(&h->ptr, &pitch, width, height, 4);
        break;
    }
    case 2:
        h->kind = MANAGED;
        rc = cuMemAllocManaged(&h->ptr, bytes, CU_MEM_ATTACH_GLOBAL);
        break;
    case 3:
        h->kind = ASYNC;
        rc = cuMemAllocAsync(&h->ptr, bytes, (CUstream)0);
        if (rc == CUDA_SUCCESS) rc = cuStreamSynchronize((CUstream)0);
        break;
    default: {
        CUDA_ARRAY_DESCRIPTOR d;
        memset(&d, 0, sizeof d);
        d.Width = 1024;
        d.Height = 1 + bytes / (1024 * 4);
        d.Format = CU_AD_FORMAT_FLOAT;
        d.NumChannels = 1;
        h->kind = ARRAY;
        rc = cuArrayCreate(&h->array, &d);
        break;
    }
    }
    if (rc != CUDA_SUCCESS) h->kind = NONE;
    return rc;
}

static CUresult release(struct held *h) {
    CUresult rc = CUDA_SUCCESS;
    switch (h->kind) {
    case DEV:
    case MANAGED: rc = cuMemFree(h->ptr); break;
    case ASYNC:
        rc = cuMemFreeAsync(h->ptr, (CUstream)0);
        if (rc == CUDA_SUCCESS) rc = cuStreamSynchronize((CUstream)0);
        break;
    case ARRAY: rc = cuArrayDestroy(h->array); break;
    case VMM:
        rc = cuMemUnmap(h->ptr, h->vmm_size);
        if (rc == CUDA_SUCCESS) rc = cuMemAddressFree(h->ptr, h->vmm_size);
        break;
    case NONE: break;
    }
    h->kind = NONE;
    return rc;
}

static void *work(void *arg) {
    struct worker *w = arg;
    struct held held[HELD];
    memset(held, 0, sizeof held);
    CUcontext primary = NULL;
    pthread_barrier_wait(&start);
    CUresult rc = cuDevicePrimaryCtxRetain(&primary, device);
    if (rc == CUDA_SUCCESS) rc = cuCtxSetCurrent(primary);
    if (rc != CUDA_SUCCESS) {
        w->errors++;
        return NULL;
    }
    rc = cuMemAlloc(&held[0].ptr, 4096);
    if (rc == CUDA_SUCCESS) {
        held[0].kind = DEV;
        w->first_ok++;
    }
    tally(w, rc);
    /* every first allocation is made before any thread goes on (none can crowd another out) */
    pthread_barrier_wait(&start);
    for (int step = 0; step < rounds; step++) {
        struct held *h = &held[next_random(&w->seed) % HELD];
        uint64_t what = next_random(&w->seed) % 10;
        if (w->index == 0 && step % 16 == 15) {
            CUcontext own = NULL;
            CUdeviceptr a = 0, b = 0;
            if (cuCtxCreate_v2(&own, 0, device) != CUDA_SUCCESS) {
                w->errors++;
                continue;
            }
            tally(w, cuMemAlloc(&a, 1 + (size_t)(next_random(&w->seed) % max_bytes)));
            tally(w, cuMemAllocManaged(&b, 1 + (size_t)(next_random(&w->seed) % max_bytes), CU_MEM_ATTACH_GLOBAL));
            if (cuCtxDestroy(own) != CUDA_SUCCESS) w->errors++;
            if (cuCtxSetCurrent(primary) != CUDA_SUCCESS) w->errors++;
        } else if (what < 5 && h->kind == NONE) {
            tally(w, allocate(w, h));
        } else if (what < 9 && h->kind != NONE) {
            if (release(h) != CUDA_SUCCESS) w->free_errors++;
        } else {
            size_t f = 0, t = 0;
            if (cuMemGetInfo(&f, &t) != CUDA_SUCCESS) w->errors++;
            else if (f > t) w->info_bad++;
        }
    }
    for (int k = 0; k < HELD; k++)
        if (release(&held[k]) != CUDA_SUCCESS) w->free_errors++;
    return NULL;
}

int main(int argc, char **argv) {
    int threads = argc > 1 ? atoi(argv[1]) : 8;
    if (argc > 2) rounds = atoi(argv[2]);
    if (argc > 3) max_bytes = strtoull(argv[3], NULL, 10);
    uint64_t seed = argc > 4 ? strtoull(argv[4], NULL, 10) : 1;
    unsigned long long fill_cap = argc > 5 ? strtoull(argv[5], NULL, 10) : (256ull << 20);
    if (threads < 1 || threads > 64 || rounds < 0 || max_bytes < 1) {
        fprintf(stderr, "usage: stress THREADS ROUNDS MAX_BYTES SEED\n");
        return 2;
    }
    CUresult rc = cuInit(0);
    kv("init.rc=%d", (int)rc);
    if (rc != CUDA_SUCCESS || cuDeviceGet(&device, 0) != CUDA_SUCCESS) {
        kv("done=1");
        return 0;
    }

    struct worker w[64];
    memset(w, 0, sizeof w);
    pthread_barrier_init(&start, NULL, (unsigned)threads);
    for (int i = 0; i < threads; i++) {
        w[i].index = i;
        w[i].seed = seed * 0x9E3779B97F4A7C15ull + (uint64_t)i * 104729 + 1;
        pthread_create(&w[i].thread, NULL, work, &w[i]);
    }
    long first_ok = 0, ok = 0, oom = 0, errors = 0, free_errors = 0, info_bad = 0;
    for (int i = 0; i < threads; i++) {
        pthread_join(w[i].thread, NULL);
        first_ok += w[i].first_ok;
        ok += w[i].ok;
        oom += w[i].oom;
        errors += w[i].errors;
        free_errors += w[i].free_errors;
        info_bad += w[i].info_bad;
    }

    fflush(stdout);
    pid_t child = fork();
    if (child == 0) exit(0);
    int status = -1;
    waitpid(child, &status, 0);
    kv("child.status=%d", status);

    CUcontext primary = NULL;
    CUdeviceptr a = 0, b = 0;
    CUarray arr = NULL;
    CUDA_ARRAY_DESCRIPTOR d;
    memset(&d, 0, sizeof d);
    d.Width = 1024;
    d.Height = 256;
    d.Format = CU_AD_FORMAT_FLOAT;
    d.NumChannels = 1;
    if (cuDevicePrimaryCtxRetain(&primary, device) != CUDA_SUCCESS || cuCtxSetCurrent(primary) != CUDA_SUCCESS) errors++;
    /* (refusals are fine here: in preallocate only cuMemAlloc is served from the reserve) */
    CUresult r[3] = {cuMemAlloc(&a, max_bytes), cuMemAllocManaged(&b, max_bytes, CU_MEM_ATTACH_GLOBAL), cuArrayCreate(&arr, &d)};
    for (int k = 0; k < 3; k++)
        if (r[k] != CUDA_SUCCESS && r[k] != CUDA_ERROR_OUT_OF_MEMORY) errors++;
    kv("reset.rc=%d", (int)cuDevicePrimaryCtxReset(device));
    if (cuDevicePrimaryCtxRetain(&primary, device) != CUDA_SUCCESS || cuCtxSetCurrent(primary) != CUDA_SUCCESS) errors++;
    static CUdeviceptr filled[4096];
    int n = 0, refused = 0;
    unsigned long long held_bytes = 0;
    while (n < 4096 && held_bytes < fill_cap) {
        CUresult fr = cuMemAlloc(&filled[n], FILL_BLOCK);
        if (fr == CUDA_ERROR_OUT_OF_MEMORY) {
            refused = 1;
            break;
        }
        if (fr != CUDA_SUCCESS) {
            errors++;
            break;
        }
        held_bytes += FILL_BLOCK;
        n++;
    }
    kv("fill.bytes=%llu", held_bytes);
    kv("fill.refused=%d", refused);
    while (n > 0)
        if (cuMemFree(filled[--n]) != CUDA_SUCCESS) free_errors++;
    size_t f = 0, t = 0;
    kv("info.rc=%d", (int)cuMemGetInfo(&f, &t));
    kv("info.free=%zu", f);
    kv("info.total=%zu", t);
    kv("first.ok=%ld", first_ok);
    kv("ok=%ld", ok);
    kv("oom=%ld", oom);
    kv("errors=%ld", errors);
    kv("free_errors=%ld", free_errors);
    kv("info_bad=%ld", info_bad);
    kv("done=1");
    return 0;
}
