/* A compute workload for the compute share (GPUSHIM_COMPUTE_LIMIT): launches of a kernel that
 * takes a given simulated time, for a given wall time, through one launch path. Linked with
 * -lcuda.
 *
 *   compute_load MODE SECONDS KERNEL_NS [DEVICES]
 *
 * The kernel is "gpusim_busy" (PTX below, one .u64 parameter): on the simulator it takes
 * KERNEL_NS ns of simulated GPU time (its first parameter); on a real GPU it returns at once.
 *
 * MODE, how each launch is made:
 *   continuous  cuLaunchKernel on a stream created per device, back to back (only the
 *               driver's launch queue holds the thread back)
 *   sync        the same, cuStreamSynchronize after every launch
 *   ex          cuLaunchKernelEx on the created stream
 *   coop        cuLaunchCooperativeKernel on the created stream
 *   graph       cuGraphLaunch on the created stream of a graph of 10 gpusim_busy kernel nodes
 *               of KERNEL_NS each, built once by stream capture (a launch = one graph launch)
 *   ptsz        cuLaunchKernel_ptsz on the per-thread default stream (stream NULL)
 *   null        cuLaunchKernel on the NULL (legacy default) stream
 * SECONDS: wall time (a float) to keep launching, counted from the first launch; then every
 * device is synchronised (cuCtxSynchronize) and the program exits 0.
 * DEVICES: a comma list of ordinals (default 0): one thread per device, each with the device's
 * primary context and its own stream, all starting together.
 *
 * COMPUTE_LOAD_MAX_PENDING=N (optional, N > 0): at most N launches outstanding per device (an
 * event recorded after each launch, the one of N launches ago waited for before the next), so
 * that huge kernels do not queue minutes of work behind the deadline.
 * COMPUTE_LOAD_GRID=G (optional, default 1): blocks per launch (gridDimX; blocks of 32 threads).
 * The simulated time does not depend on it; limiters that count blocks (HAMi-core) do.
 * COMPUTE_LOAD_FORK_AT=F (optional, seconds): F seconds after the first launch, while the
 * devices' threads launch, the main thread forks a child. The child (the simulated driver lets
 * a forked child use CUDA; a real one does not) creates a context of its own on the first
 * device, launches KERNEL_NS kernels back to back on a stream of its own for
 * COMPUTE_LOAD_CHILD_SECONDS (default 2), prints `child.launches=N` and leaves with _exit(0)
 * (no exit handlers: the parent's reports are not written over). The parent prints
 * `child.status=S` (the wait status) after its own run.
 *
 * Prints, per device in the order given, `device=D launches=N`, then
 * `wall_ns=W start_ns=S` (S = CLOCK_MONOTONIC ns at the first launch, W = ns from S until
 * every device was synchronised) and `done=1`. Any CUDA error prints
 * `error: <call> = <code>` and the program exits 1.
 */
#define _GNU_SOURCE
#include <cuda.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* Not declared by cuda.h unless the whole program is compiled for the per-thread stream. */
extern CUresult CUDAAPI cuLaunchKernel_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                                            unsigned by, unsigned bz, unsigned shared, CUstream s,
                                            void **params, void **extra);

static const char ptx[] =
    ".version 8.0\n"
    ".target sm_52\n"
    ".address_size 64\n"
    "\n"
    ".visible .entry gpusim_busy(\n"
    "    .param .u64 ns\n"
    ")\n"
    "{\n"
    "    ret;\n"
    "}\n";

enum mode { CONTINUOUS, SYNC, EX, COOP, GRAPH, PTSZ, NULLSTREAM };
static const char *const mode_names[] = {"continuous", "sync", "ex", "coop", "graph", "ptsz", "null"};

#define GRAPH_NODES 10
#define MAX_DEVICES 64

static enum mode mode;
static uint64_t kernel_ns;
static uint64_t run_ns;
static long max_pending;
static unsigned grid = 1;
static pthread_barrier_t ready;
static uint64_t start_ns = UINT64_MAX; /* the earliest first launch, atomically lowered */
static int failed;                     /* any thread failed: the others stop */

struct worker {
    int device;
    unsigned long long launches;
    pthread_t thread;
    int barrier_passed;
};

static uint64_t now_ns(void);

/* The child of COMPUTE_LOAD_FORK_AT: launches in a context of its own for `seconds`. */
static int child_run(int device, double seconds);

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* A failing call: its name and result printed, the run marked failed. */
#define CHECK(call)                                                       \
    do {                                                                  \
        CUresult r_ = (call);                                             \
        if (r_ != CUDA_SUCCESS) {                                         \
            printf("error: %.*s = %d\n", (int)strcspn(#call, "("), #call, (int)r_);                   \
            fflush(stdout);                                               \
            __atomic_store_n(&failed, 1, __ATOMIC_SEQ_CST);               \
            return -1;                                                    \
        }                                                                 \
    } while (0)

/* In the current context: the module with `gpusim_busy`, the function, and a stream. */
static int load_busy(CUmodule *module, CUfunction *f, CUstream *stream) {
    CHECK(cuModuleLoadData(module, ptx));
    CHECK(cuModuleGetFunction(f, *module, "gpusim_busy"));
    CHECK(cuStreamCreate(stream, CU_STREAM_DEFAULT));
    return 0;
}

static int launch_once(CUfunction f, CUstream stream, CUgraphExec exec, void **args) {
    switch (mode) {
    case CONTINUOUS:
    case SYNC:
        CHECK(cuLaunchKernel(f, grid, 1, 1, 32, 1, 1, 0, stream, args, NULL));
        if (mode == SYNC) CHECK(cuStreamSynchronize(stream));
        break;
    case EX: {
        CUlaunchConfig config;
        memset(&config, 0, sizeof config);
        config.gridDimX = grid;
        config.gridDimY = config.gridDimZ = 1;
        config.blockDimX = 32;
        config.blockDimY = config.blockDimZ = 1;
        config.hStream = stream;
        CHECK(cuLaunchKernelEx(&config, f, args, NULL));
        break;
    }
    case COOP:
        CHECK(cuLaunchCooperativeKernel(f, grid, 1, 1, 32, 1, 1, 0, stream, args));
        break;
    case GRAPH:
        CHECK(cuGraphLaunch(exec, stream));
        break;
    case PTSZ:
        CHECK(cuLaunchKernel_ptsz(f, grid, 1, 1, 32, 1, 1, 0, NULL, args, NULL));
        break;
    case NULLSTREAM:
        CHECK(cuLaunchKernel(f, grid, 1, 1, 32, 1, 1, 0, NULL, args, NULL));
        break;
    }
    return 0;
}

static int run_device(struct worker *w) {
    CUdevice dev;
    CUcontext ctx;
    CHECK(cuDeviceGet(&dev, w->device));
    CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CHECK(cuCtxSetCurrent(ctx));
    CUmodule module;
    CUfunction f;
    CUstream stream;
    if (load_busy(&module, &f, &stream) != 0) return -1;
    uint64_t ns = kernel_ns;
    void *args[] = {&ns};

    CUgraphExec exec = NULL;
    if (mode == GRAPH) {
        CUgraph graph;
        CHECK(cuStreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
        for (int i = 0; i < GRAPH_NODES; i++) CHECK(cuLaunchKernel(f, grid, 1, 1, 32, 1, 1, 0, stream, args, NULL));
        CHECK(cuStreamEndCapture(stream, &graph));
        CHECK(cuGraphInstantiateWithFlags(&exec, graph, 0));
        CHECK(cuGraphDestroy(graph));
    }
    /* where the bounding events are recorded: the stream the launches go to */
    CUstream record_on = mode == PTSZ ? CU_STREAM_PER_THREAD : mode == NULLSTREAM ? CU_STREAM_LEGACY : stream;
    CUevent *pending = NULL;
    if (max_pending > 0) {
        pending = calloc((size_t)max_pending, sizeof *pending);
        if (!pending) {
            printf("error: calloc = 0\n");
            __atomic_store_n(&failed, 1, __ATOMIC_SEQ_CST);
            return -1;
        }
        for (long i = 0; i < max_pending; i++) CHECK(cuEventCreate(&pending[i], CU_EVENT_DISABLE_TIMING));
    }

    pthread_barrier_wait(&ready);
    w->barrier_passed = 1;
    uint64_t t0 = now_ns();
    uint64_t seen = __atomic_load_n(&start_ns, __ATOMIC_SEQ_CST);
    while (t0 < seen && !__atomic_compare_exchange_n(&start_ns, &seen, t0, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {
    }
    uint64_t deadline = t0 + run_ns;
    for (unsigned long long i = 0; now_ns() < deadline && !__atomic_load_n(&failed, __ATOMIC_SEQ_CST); i++) {
        CUevent slot = pending ? pending[i % (unsigned long long)max_pending] : NULL;
        if (slot && i >= (unsigned long long)max_pending) CHECK(cuEventSynchronize(slot));
        if (launch_once(f, stream, exec, args) != 0) return -1;
        w->launches++;
        if (slot) CHECK(cuEventRecord(slot, record_on));
    }
    CHECK(cuCtxSynchronize());
    if (exec) CHECK(cuGraphExecDestroy(exec));
    for (long i = 0; pending && i < max_pending; i++) CHECK(cuEventDestroy(pending[i]));
    free(pending);
    CHECK(cuStreamDestroy(stream));
    CHECK(cuModuleUnload(module));
    return 0;
}

static int child_run(int device, double seconds) {
    CUdevice dev;
    CUcontext ctx;
    CHECK(cuDeviceGet(&dev, device));
    CHECK(cuCtxCreate_v4(&ctx, NULL, 0, dev));
    CUmodule module;
    CUfunction f;
    CUstream stream;
    if (load_busy(&module, &f, &stream) != 0) return -1;
    uint64_t ns = kernel_ns;
    void *args[] = {&ns};
    unsigned long long launches = 0;
    uint64_t deadline = now_ns() + (uint64_t)(seconds * 1e9);
    while (now_ns() < deadline) {
        CHECK(cuLaunchKernel(f, grid, 1, 1, 32, 1, 1, 0, stream, args, NULL));
        launches++;
    }
    CHECK(cuCtxSynchronize());
    printf("child.launches=%llu\n", launches);
    fflush(stdout);
    return 0;
}

static void *worker_main(void *arg) {
    struct worker *w = arg;
    if (run_device(w) != 0 && !w->barrier_passed) pthread_barrier_wait(&ready);
    return NULL;
}

static void usage(void) {
    fprintf(stderr,
            "usage: compute_load continuous|sync|ex|coop|graph|ptsz|null SECONDS KERNEL_NS [DEVICES]\n");
    exit(64);
}

int main(int argc, char **argv) {
    if (argc < 4 || argc > 5) usage();
    int found = 0;
    for (size_t i = 0; i < sizeof mode_names / sizeof *mode_names; i++)
        if (strcmp(argv[1], mode_names[i]) == 0) {
            mode = (enum mode)i;
            found = 1;
        }
    char *end = NULL;
    double seconds = strtod(argv[2], &end);
    if (!found || !end || *end || !(seconds >= 0 && seconds < 1e6)) usage();
    run_ns = (uint64_t)(seconds * 1e9);
    kernel_ns = strtoull(argv[3], &end, 10);
    if (!end || *end || argv[3][0] == '-') usage();
    const char *grid_text = getenv("COMPUTE_LOAD_GRID");
    if (grid_text && *grid_text) {
        long g = strtol(grid_text, &end, 10);
        if (*end || g < 1 || g > 2147483647L) usage();
        grid = (unsigned)g;
    }
    const char *pending_text = getenv("COMPUTE_LOAD_MAX_PENDING");
    if (pending_text && *pending_text) {
        max_pending = strtol(pending_text, &end, 10);
        if (*end || max_pending < 0 || max_pending > 1000000) usage();
    }

    static struct worker workers[MAX_DEVICES];
    int n = 0;
    const char *list = argc == 5 ? argv[4] : "0";
    for (const char *p = list; *p;) {
        long d = strtol(p, &end, 10);
        if (end == p || d < 0 || d > 1024 || n == MAX_DEVICES || (*end && *end != ',')) usage();
        workers[n++].device = (int)d;
        p = *end ? end + 1 : end;
    }
    if (n == 0) usage();

    CUresult r = cuInit(0);
    if (r != CUDA_SUCCESS) {
        printf("error: cuInit(0) = %d\n", (int)r);
        return 1;
    }
    pthread_barrier_init(&ready, NULL, (unsigned)n);
    for (int i = 0; i < n; i++)
        if (pthread_create(&workers[i].thread, NULL, worker_main, &workers[i]) != 0) {
            printf("error: pthread_create = -1\n");
            return 1;
        }
    pid_t child = -1;
    const char *fork_text = getenv("COMPUTE_LOAD_FORK_AT");
    if (fork_text && *fork_text) {
        double at = strtod(fork_text, &end);
        const char *child_text = getenv("COMPUTE_LOAD_CHILD_SECONDS");
        double child_seconds = child_text && *child_text ? strtod(child_text, NULL) : 2.0;
        if (*end || !(at >= 0 && at < 1e6) || !(child_seconds >= 0 && child_seconds < 1e6)) usage();
        while (__atomic_load_n(&start_ns, __ATOMIC_SEQ_CST) == UINT64_MAX && !__atomic_load_n(&failed, __ATOMIC_SEQ_CST))
            usleep(1000);
        while (now_ns() < __atomic_load_n(&start_ns, __ATOMIC_SEQ_CST) + (uint64_t)(at * 1e9)) usleep(1000);
        fflush(stdout);
        child = fork();
        if (child == 0) _exit(child_run(workers[0].device, child_seconds) == 0 ? 0 : 1);
    }
    for (int i = 0; i < n; i++) pthread_join(workers[i].thread, NULL);
    uint64_t done = now_ns();
    if (child > 0) {
        int status = 0;
        waitpid(child, &status, 0);
        printf("child.status=%d\n", status);
    } else if (child == -1 && fork_text && *fork_text) {
        printf("error: fork = -1\n");
        failed = 1;
    }
    for (int i = 0; i < n; i++) printf("device=%d launches=%llu\n", workers[i].device, workers[i].launches);
    uint64_t s = start_ns == UINT64_MAX ? done : start_ns;
    printf("wall_ns=%llu start_ns=%llu\n", (unsigned long long)(done - s), (unsigned long long)s);
    if (failed) return 1;
    printf("done=1\n");
    return 0;
}
