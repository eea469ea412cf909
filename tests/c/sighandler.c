/* CUDA called from a signal handler that interrupted the program's thread inside gpushim
 * (linked with -lcuda).
 *
 *   sighandler [HANDLED]
 *
 * A worker thread allocates and frees 4 KiB (cuMemAlloc_v2 / cuMemFree_v2) in a tight loop on
 * device 0 (with a short spin of its own between pairs); the main thread sends it SIGUSR1
 * signals (pthread_kill), a varying few microseconds apart, until the handler has called CUDA
 * HANDLED times (default 300; under the shim, a third of them with the worker inside it), or
 * 1,000,000 signals, or 20 s. The handler looks at where the
 * worker was interrupted (the
 * instruction pointer of its saved context): only inside libgpushim.so or the program itself
 * does it call CUDA; inside the C library, the dynamic loader or the driver it returns at once
 * (their own locks are not gpushim's to bound: CUDA's functions are not async-signal-safe, and
 * the simulated driver's are not either, as the real driver's). From the handler: cuMemGetInfo,
 * cuMemFree_v2 of the allocation the handler made at an earlier call (if it still holds one),
 * and, if it holds none, cuMemAlloc_v2 of 4 KiB. A free that is refused is retried at the next
 * call; at the end the main thread frees what the handler still holds.
 *
 * Prints: signals, landed.other (signals that found the worker elsewhere), handled.shim /
 * handled.program (handlers that called CUDA, by where the worker was), alloc.ok / alloc.oom / alloc.other, free.ok / free.refused (CUDA_ERROR_NOT_PERMITTED)
 * / free.other, info.ok / info.other, handler.max_us (the longest handler), worker.pairs,
 * worker.errors, leftover (1: the handler still held an allocation) and leftover.rc (the main
 * thread's free of it; 0 if none),
 * usage.rc / usage.in_use (gpushim_memory_usage(0), found with dlsym: -1 without the shim),
 * info.rc / info.free / info.total (cuMemGetInfo at the end), done=1.
 */
#define _GNU_SOURCE
#include <cuda.h>
#include <dlfcn.h>
#include <errno.h>
#include <link.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <time.h>
#include <ucontext.h>
#include <unistd.h>

#include "scenario.h"

#define CUDA_ERROR_NOT_PERMITTED_ 800

/* Executable ranges of libgpushim.so (kind 1) and the program (kind 2). */
static struct {
    uintptr_t start, end;
    int kind;
} ranges[16];
static int nranges;

static int add_ranges(struct dl_phdr_info *info, size_t size, void *data) {
    (void)size;
    int *first = data;
    int kind = 0;
    if (*first) kind = 2; /* the program comes first */
    else if (info->dlpi_name && strstr(info->dlpi_name, "libgpushim")) kind = 1;
    *first = 0;
    if (!kind) return 0;
    for (int i = 0; i < info->dlpi_phnum && nranges < 16; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type != PT_LOAD || !(ph->p_flags & PF_X)) continue;
        ranges[nranges].start = info->dlpi_addr + ph->p_vaddr;
        ranges[nranges].end = ranges[nranges].start + ph->p_memsz;
        ranges[nranges].kind = kind;
        nranges++;
    }
    return 0;
}

/* Whether libgpushim.so is in the process. */
static int shim_loaded;

static int where(uintptr_t ip) {
    for (int i = 0; i < nranges; i++)
        if (ip >= ranges[i].start && ip < ranges[i].end) return ranges[i].kind;
    return 0;
}

static CUcontext ctx;
static volatile int running = 1, ready;
static long landed_other, handled_shim, handled_program, alloc_ok, alloc_oom, alloc_other, free_ok, free_refused, free_other, info_ok, info_other;
static long max_ns;
static CUdeviceptr held; /* the handler's allocation */
static long pairs, worker_errors;

static void handler(int sig, siginfo_t *si, void *context) {
    (void)sig;
    (void)si;
    ucontext_t *uc = context;
#if defined(__aarch64__)
    int kind = where((uintptr_t)uc->uc_mcontext.pc); /* the interrupted instruction */
#else
    int kind = where((uintptr_t)uc->uc_mcontext.gregs[REG_RIP]);
#endif
    if (!kind) {
        landed_other++;
        return;
    }
    int saved = errno;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    if (kind == 1) handled_shim++;
    else handled_program++;
    size_t f = 0, t = 0;
    if (cuMemGetInfo(&f, &t) == CUDA_SUCCESS) info_ok++;
    else info_other++;
    if (held) {
        CUresult rc = cuMemFree(held);
        if (rc == CUDA_SUCCESS) { free_ok++; held = 0; }
        else if (rc == CUDA_ERROR_NOT_PERMITTED_) free_refused++;
        else free_other++;
    }
    if (!held) {
        CUdeviceptr p = 0;
        CUresult rc = cuMemAlloc(&p, 4096);
        if (rc == CUDA_SUCCESS) { alloc_ok++; held = p; }
        else if (rc == CUDA_ERROR_OUT_OF_MEMORY) alloc_oom++;
        else alloc_other++;
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    long ns = (t1.tv_sec - t0.tv_sec) * 1000000000L + (t1.tv_nsec - t0.tv_nsec);
    if (ns > max_ns) max_ns = ns;
    errno = saved;
}

static void *work(void *arg) {
    (void)arg;
    if (cuCtxSetCurrent(ctx) != CUDA_SUCCESS) { worker_errors++; ready = 1; return NULL; }
    /* one pair first: the reserve's first chunk and every one-time step before any signal */
    CUdeviceptr p;
    if (cuMemAlloc(&p, 4096) != CUDA_SUCCESS || cuMemFree(p) != CUDA_SUCCESS) worker_errors++;
    __atomic_store_n(&ready, 1, __ATOMIC_SEQ_CST);
    while (__atomic_load_n(&running, __ATOMIC_RELAXED)) {
        if (cuMemAlloc(&p, 4096) != CUDA_SUCCESS) { worker_errors++; continue; }
        if (cuMemFree(p) != CUDA_SUCCESS) worker_errors++;
        pairs++;
        for (volatile int n = 500; n > 0; n--) {}
    }
    return NULL;
}

int main(int argc, char **argv) {
    long wanted = argc > 1 ? atol(argv[1]) : 300;
    if (wanted < 1) usage_error("HANDLED");
    int first = 1;
    dl_iterate_phdr(add_ranges, &first);
    for (int i = 0; i < nranges; i++) shim_loaded |= ranges[i].kind == 1;

    CUresult rc = cuInit(0);
    kv("init.rc=%d", (int)rc);
    if (rc != CUDA_SUCCESS) return 0;
    CUdevice dev;
    rc = cuDeviceGet(&dev, 0);
    if (rc == CUDA_SUCCESS) rc = cuDevicePrimaryCtxRetain(&ctx, dev);
    kv("ctx.rc=%d", (int)rc);
    if (rc != CUDA_SUCCESS) return 0;
    cuCtxSetCurrent(ctx);

    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = handler;
    sa.sa_flags = SA_SIGINFO | SA_RESTART;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGUSR1, &sa, NULL);

    pthread_t worker;
    pthread_create(&worker, NULL, work, NULL);
    while (!__atomic_load_n(&ready, __ATOMIC_SEQ_CST)) sched_yield();
    uint64_t seed = 0x9E3779B97F4A7C15ull;
    struct timespec start, now;
    clock_gettime(CLOCK_MONOTONIC, &start);
    long signals = 0;
    while (signals < 1000000) {
        pthread_kill(worker, SIGUSR1);
        signals++;
        /* a varying pause (spun: a sleep would land the signals on the same instructions) */
        for (volatile uint64_t n = next_random(&seed) % 4000; n > 0; n--) {}
        long in_shim = __atomic_load_n(&handled_shim, __ATOMIC_RELAXED);
        if (in_shim + __atomic_load_n(&handled_program, __ATOMIC_RELAXED) >= wanted && (!shim_loaded || in_shim >= wanted / 3)) break;
        clock_gettime(CLOCK_MONOTONIC, &now);
        if (now.tv_sec - start.tv_sec >= 20) break;
    }
    __atomic_store_n(&running, 0, __ATOMIC_SEQ_CST);
    pthread_join(worker, NULL);

    kv("signals=%ld", signals);
    kv("landed.other=%ld", landed_other);
    kv("handled.shim=%ld", handled_shim);
    kv("handled.program=%ld", handled_program);
    kv("alloc.ok=%ld", alloc_ok);
    kv("alloc.oom=%ld", alloc_oom);
    kv("alloc.other=%ld", alloc_other);
    kv("free.ok=%ld", free_ok);
    kv("free.refused=%ld", free_refused);
    kv("free.other=%ld", free_other);
    kv("info.ok=%ld", info_ok);
    kv("info.other=%ld", info_other);
    kv("handler.max_us=%ld", max_ns / 1000);
    kv("worker.pairs=%ld", pairs);
    kv("worker.errors=%ld", worker_errors);
    kv("leftover=%d", held ? 1 : 0);
    kv("leftover.rc=%d", held ? (int)cuMemFree(held) : 0);

    typedef int (*usage_fn)(int, uint64_t *, uint64_t *, uint64_t *);
    usage_fn usage = (usage_fn)dlsym(RTLD_DEFAULT, "gpushim_memory_usage");
    uint64_t in_use = 0, peak = 0, limit = 0;
    kv("usage.rc=%d", usage ? usage(0, &in_use, &peak, &limit) : -1);
    kv("usage.in_use=%llu", (unsigned long long)in_use);
    size_t free_b = 0, total_b = 0;
    kv("info.rc=%d", (int)cuMemGetInfo(&free_b, &total_b));
    kv("info.free=%zu", free_b);
    kv("info.total=%zu", total_b);
    kv("done=1");
    return 0;
}
