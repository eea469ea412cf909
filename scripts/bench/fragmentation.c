/* gpushim benchmark: how much of a limit a randomized allocation workload can use (driver API,
 * linked with -lcuda). Run once per GPUSHIM_MEMORY_MODE by scripts/bench.sh.
 *
 *   fragmentation LIMIT [SEED [STEPS [TARGET [SMALL [PITCH]]]]]
 *
 * LIMIT   bytes the workload is sized for (the GPUSHIM_MEMORY_LIMIT it runs under)
 * SEED    of the random sequence (default 1)
 * STEPS   alloc-or-free steps (default 20000)
 * TARGET  live-set target, a fraction of LIMIT (default 0.9)
 * SMALL   share of requests drawn from the small range (default 0.3)
 * PITCH   share of allocations made with cuMemAllocPitch (default 0.05)
 *
 * Request sizes: with probability SMALL log-uniform in [512 B, 64 KiB], otherwise log-uniform in
 * [512 B, 64 MiB]; any byte count (not rounded). A pitched request of S bytes is HEIGHT rows of
 * S/HEIGHT bytes (at least 512 bytes a row, element size 4).
 *
 * The trace does not depend on what succeeds, so every mode sees the same requests in the same
 * order: the trace keeps an *ideal* live set (every request as if it had succeeded); at each step
 * it draws a size, and allocates with probability 0.6 if the ideal live set plus that size stays
 * within TARGET x LIMIT, else frees a random member of the ideal live set (a member whose
 * allocation failed is dropped without a call). Since the ideal live set never exceeds
 * TARGET x LIMIT <= LIMIT, exact accounting (passthrough, or a driver of LIMIT bytes) admits
 * every request; what a mode loses is what its reserve wastes (chunking, rounding, fragments).
 *
 * Output: `key=value` lines (requests, ok, ok_fraction, bytes_fraction, peak_live_fraction,
 * first_failure_step, live_at_first_failure_fraction, small/medium/large.{requests,ok}, …).
 * Exit status 1 if CUDA initialisation or a free fails (stderr says which), 2 on bad arguments.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <cuda.h>

#define KIB 1024.0
#define MIB (1024.0 * 1024.0)

static uint64_t rng_state;

static uint64_t next_u64(void) { /* splitmix64 */
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static double uniform(void) { return (next_u64() >> 11) * (1.0 / 9007199254740992.0); }

static size_t log_uniform(double lo, double hi) {
    return (size_t)exp(log(lo) + uniform() * (log(hi) - log(lo)));
}

struct slot {
    CUdeviceptr ptr; /* 0: the request failed */
    size_t bytes;
};

/* size classes of the grow mode's chunk policy: <= 1 MiB, <= 10 MiB, larger */
static int size_class(size_t s) { return s <= (size_t)MIB ? 0 : s <= (size_t)(10 * MIB) ? 1 : 2; }
static const char *class_name[] = {"small", "medium", "large"};

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s LIMIT [SEED [STEPS [TARGET [SMALL [PITCH]]]]]\n", argv[0]);
        return 2;
    }
    double limit = strtod(argv[1], NULL);
    uint64_t seed = argc > 2 ? strtoull(argv[2], NULL, 10) : 1;
    long steps = argc > 3 ? atol(argv[3]) : 20000;
    double target = argc > 4 ? strtod(argv[4], NULL) : 0.9;
    double small = argc > 5 ? strtod(argv[5], NULL) : 0.3;
    double pitch_share = argc > 6 ? strtod(argv[6], NULL) : 0.05;
    if (!(limit > 0) || steps < 1 || !(target > 0 && target <= 1) || !(small >= 0 && small <= 1) ||
        !(pitch_share >= 0 && pitch_share <= 1)) {
        fprintf(stderr, "fragmentation: bad arguments\n");
        return 2;
    }
    rng_state = seed;

    CUdevice dev;
    CUcontext ctx;
    CUresult rc;
    if ((rc = cuInit(0)) || (rc = cuDeviceGet(&dev, 0)) || (rc = cuDevicePrimaryCtxRetain(&ctx, dev)) ||
        (rc = cuCtxSetCurrent(ctx))) {
        fprintf(stderr, "CUDA initialisation failed: %d\n", (int)rc);
        return 1;
    }

    size_t cap = 1024, n = 0;
    struct slot *live = malloc(cap * sizeof *live);
    double budget = target * limit;
    double ideal = 0, ideal_peak = 0, actual = 0, actual_peak = 0;
    double req_bytes = 0, ok_bytes = 0, live_at_first = -1, largest_failed = 0, smallest_failed = 0;
    long requests = 0, ok = 0, frees = 0, first_failure = -1, pitched = 0;
    long cls_req[3] = {0}, cls_ok[3] = {0};
    double t0;
    {
        struct timespec t;
        clock_gettime(CLOCK_MONOTONIC, &t);
        t0 = t.tv_sec + t.tv_nsec / 1e9;
    }
    for (long step = 0; step < steps; step++) {
        /* the same draws at every step, whatever is decided */
        int is_small = uniform() < small;
        size_t s = log_uniform(512, is_small ? 64 * KIB : 64 * MIB);
        double u_alloc = uniform(), u_pitch = uniform();
        uint64_t r = next_u64();
        if (n == 0 || (ideal + s <= budget && u_alloc < 0.6)) {
            if (n == cap) live = realloc(live, (cap *= 2) * sizeof *live);
            CUdeviceptr p = 0;
            size_t bytes = s;
            int c = size_class(s);
            if (u_pitch < pitch_share) {
                size_t rows_max = s / 512 < 64 ? s / 512 : 64;
                size_t height = 1 + (rows_max > 1 ? r % rows_max : 0);
                size_t width = s / height;
                size_t pitch = 0;
                bytes = width * height;
                rc = cuMemAllocPitch(&p, &pitch, width, height, 4);
                pitched++;
            } else {
                rc = cuMemAlloc(&p, s);
            }
            requests++;
            cls_req[c]++;
            req_bytes += bytes;
            if (rc == CUDA_SUCCESS) {
                ok++;
                cls_ok[c]++;
                ok_bytes += bytes;
                actual += bytes;
                if (actual > actual_peak) actual_peak = actual;
            } else {
                if (rc != CUDA_ERROR_OUT_OF_MEMORY)
                    fprintf(stderr, "fragmentation: step %ld: allocation of %zu bytes: error %d (not out of memory)\n",
                            step, bytes, (int)rc);
                p = 0;
                if (first_failure < 0) {
                    first_failure = step;
                    live_at_first = actual;
                    smallest_failed = bytes;
                }
                if (bytes > largest_failed) largest_failed = bytes;
                if (bytes < smallest_failed) smallest_failed = bytes;
            }
            live[n].ptr = p;
            live[n].bytes = bytes;
            n++;
            ideal += bytes;
            if (ideal > ideal_peak) ideal_peak = ideal;
        } else {
            size_t i = r % n;
            if (live[i].ptr) {
                if ((rc = cuMemFree(live[i].ptr)) != CUDA_SUCCESS) {
                    fprintf(stderr, "fragmentation: step %ld: cuMemFree failed: %d\n", step, (int)rc);
                    return 1;
                }
                actual -= live[i].bytes;
                frees++;
            }
            ideal -= live[i].bytes;
            live[i] = live[--n];
        }
    }
    double t1;
    {
        struct timespec t;
        clock_gettime(CLOCK_MONOTONIC, &t);
        t1 = t.tv_sec + t.tv_nsec / 1e9;
    }
    for (size_t i = 0; i < n; i++)
        if (live[i].ptr && (rc = cuMemFree(live[i].ptr)) != CUDA_SUCCESS) {
            fprintf(stderr, "fragmentation: final cuMemFree failed: %d\n", (int)rc);
            return 1;
        }

    printf("limit=%.0f\nseed=%llu\nsteps=%ld\ntarget=%g\n", limit, (unsigned long long)seed, steps, target);
    printf("requests=%ld\nok=%ld\nfailed=%ld\npitched=%ld\nfrees=%ld\n", requests, ok, requests - ok, pitched, frees);
    printf("ok_fraction=%.4f\n", requests ? (double)ok / requests : 1.0);
    printf("requested_bytes=%.0f\nok_bytes=%.0f\nbytes_fraction=%.4f\n", req_bytes, ok_bytes,
           req_bytes > 0 ? ok_bytes / req_bytes : 1.0);
    printf("peak_live=%.0f\npeak_live_fraction=%.4f\n", actual_peak, actual_peak / limit);
    printf("ideal_peak_fraction=%.4f\n", ideal_peak / limit);
    printf("first_failure_step=%ld\n", first_failure);
    if (first_failure >= 0)
        printf("live_at_first_failure_fraction=%.4f\nsmallest_failed=%.0f\nlargest_failed=%.0f\n",
               live_at_first / limit, smallest_failed, largest_failed);
    for (int c = 0; c < 3; c++)
        printf("%s.requests=%ld\n%s.ok=%ld\n%s.ok_fraction=%.4f\n", class_name[c], cls_req[c], class_name[c],
               cls_ok[c], class_name[c], cls_req[c] ? (double)cls_ok[c] / cls_req[c] : 1.0);
    printf("seconds=%.3f\n", t1 - t0);
    return 0;
}
