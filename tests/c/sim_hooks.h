/* The simulated driver's test hooks (sim/cuda README, "Test hooks"), reached in the loaded
 * libcuda.so.1 whatever way the program itself reaches the driver (linked, dlopen, or through
 * the CUDA runtime): `sim=P` prints what the simulator knows at that moment, so a test can check
 * the driver's state in the middle of a run (the exit report only gives the end).
 *
 *   sim_op(prefix, p)  prints PREFIXused, PREFIXpeak (bytes in use on physical device p, its
 *                      peak) and PREFIXcalls.NAME for every entry point of SIM_CALLS;
 *                      PREFIXsim=0 where no simulator is loaded.
 */
#ifndef GPUSHIM_TEST_SIM_HOOKS_H
#define GPUSHIM_TEST_SIM_HOOKS_H

#include <dlfcn.h>
#include <stdint.h>

#include "scenario.h"

/* The entry points whose call counts `sim=P` prints. */
static const char *const SIM_CALLS[] = {
    "cuMemAlloc_v2",      "cuMemAlloc",      "cuMemAllocPitch_v2", "cuMemAllocPitch",
    "cuMemFree_v2",       "cuMemFree",       "cuMemAllocManaged",  "cuMemAllocAsync",
    "cuMemFreeAsync",     "cuMemCreate",     "cuArrayCreate_v2",   "cuIpcGetMemHandle",
    "cuCtxSynchronize",   "cuMemGetInfo_v2", "cuCtxCreate_v2",     "cuCtxCreate_v4",
};

typedef int (*gpusim_stats_t)(int, uint64_t *, uint64_t *, uint64_t *);
typedef uint64_t (*gpusim_call_count_t)(const char *);

static struct {
    int looked;
    gpusim_stats_t stats;
    gpusim_call_count_t calls;
} sim_hooks;

/* Finds the hooks in the libcuda.so.1 already loaded (NULL if none is, or it is no simulator). */
static int sim_hooks_find(void) {
    if (!sim_hooks.looked) {
        void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
        if (h) {
            sim_hooks.stats = (gpusim_stats_t)dlsym(h, "gpusim_stats");
            sim_hooks.calls = (gpusim_call_count_t)dlsym(h, "gpusim_call_count");
        }
        /* look again next time if the driver was not loaded yet */
        sim_hooks.looked = h != NULL;
    }
    return sim_hooks.stats && sim_hooks.calls;
}

/* Calls of one driver entry point so far (0 without the simulator). */
__attribute__((unused)) static unsigned long long sim_calls(const char *name) {
    return sim_hooks_find() ? (unsigned long long)sim_hooks.calls(name) : 0;
}

/* Bytes in use on physical device p now (0 without the simulator). */
__attribute__((unused)) static unsigned long long sim_used(int p) {
    uint64_t used = 0;
    if (sim_hooks_find()) sim_hooks.stats(p, &used, NULL, NULL);
    return (unsigned long long)used;
}

__attribute__((unused)) static void sim_op(const char *prefix, int p) {
    if (!sim_hooks_find()) {
        kv("%ssim=0", prefix);
        return;
    }
    uint64_t used = 0, peak = 0, total = 0;
    kv("%ssim=1", prefix);
    kv("%sstats.rc=%d", prefix, sim_hooks.stats(p, &used, &peak, &total));
    kv("%sused=%llu", prefix, (unsigned long long)used);
    kv("%speak=%llu", prefix, (unsigned long long)peak);
    for (size_t k = 0; k < sizeof SIM_CALLS / sizeof SIM_CALLS[0]; k++)
        kv("%scalls.%s=%llu", prefix, SIM_CALLS[k], (unsigned long long)sim_hooks.calls(SIM_CALLS[k]));
}

#endif
