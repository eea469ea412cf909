/* What a forked child does to its parent's figures (tests/hardening.rs). Linked with -lcuda.
 *
 *   forkq MODE PARENT_BYTES CHILD_BYTES
 *
 * The parent initialises CUDA, creates a context and allocates PARENT_BYTES (parent.rc), then
 * forks. The child, by MODE:
 *   exit   exits at once with exit(0) (its exit handlers run)
 *   clone, _Fork, vfork, clonevm   the same, the child made without fork() (no fork handler
 *          runs): a raw clone system call (SIGCHLD, no CLONE_VM), glibc's _Fork(), vfork(), or
 *          clone() with CLONE_VM (a stack of its own); the child calls exit(0)
 *   exec   execs /bin/true
 *   alloc  initialises CUDA, creates a context of its own, allocates CHILD_BYTES twice
 *          (child.rc1, child.rc2, printed by the child), then exits with exit(0)
 *   linger (tests/observability.rs) allocates CHILD_BYTES in a context of its own and sleeps;
 *          the parent does not wait: it creates the file argv[4] once the child allocated
 *          and sleeps (both 60 s)
 *   initrace (the other arguments unused) a thread makes the process' first CUDA call, cuInit,
 *          while the main thread forks children as fast as it can until that call returns
 *          (and 8 more after), from the moment the driver's own cuInit is done: the simulator
 *          has counted GPUSIM_DEVICES calls of cuDeviceGetUuid (the shim's look at the devices,
 *          right before it publishes them), or the call returned (a child forked in the middle
 *          of the driver's own initialisation would find its lock taken for ever, as with a
 *          real driver's); each child calls cuInit and exits with 0 if it returned. The
 *          parent waits up to 10 s for all of them, kills those left, and prints
 *          children=N during=D (forked before the first cuInit returned) hung=H failed=F
 *          fork_errors=E init.rc=RC done=1 (no other output; at most 256 children)
 * The parent waits (parent.pid, child.pid, child.status), reads cuMemGetInfo (before.free); with
 * a fourth argument PAUSE, creates the file PAUSE and waits until it is removed (60 s at most);
 * then allocates CHILD_BYTES (after.rc1) and again (after.rc2) and reads cuMemGetInfo (after.free).
 */
#define _GNU_SOURCE
#include <cuda.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "sim_hooks.h"

static atomic_int init_done;
static int init_rc = -1;

static void *first_init(void *arg) {
    (void)arg;
    init_rc = (int)cuInit(0);
    atomic_store(&init_done, 1);
    return NULL;
}

/* Reaps the children that have ended (without waiting): `left` down by each, `failed` up by
 * each that did not exit with 0. Returns how many. */
static int reap_ended(int *left, int *failed) {
    int status, n = 0;
    while (waitpid(-1, &status, WNOHANG) > 0) {
        (*left)--;
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) (*failed)++;
        n++;
    }
    return n;
}

static char clone_stack[64 * 1024] __attribute__((aligned(16)));

static int child_exits(void *arg) {
    (void)arg;
    exit(0);
}

/* The child of MODE (see the top); a vfork or CLONE_VM child exits here. */
static pid_t make_child(const char *mode) {
    if (!strcmp(mode, "clone")) return (pid_t)syscall(SYS_clone, (long)SIGCHLD, 0L, 0L, 0L, 0L);
    if (!strcmp(mode, "_Fork")) return _Fork();
    if (!strcmp(mode, "vfork")) {
        pid_t pid = vfork();
        if (pid == 0) exit(0);
        return pid;
    }
    if (!strcmp(mode, "clonevm")) return clone(child_exits, clone_stack + sizeof clone_stack, CLONE_VM | SIGCHLD, NULL);
    return fork();
}

static int init_race(void) {
    enum { MAX = 256 };
    static pid_t kids[MAX];
    int n = 0, after = 0, during = 0, fork_errors = 0, left = 0, failed = 0, hung = 0;
    pthread_t t;
    const char *devices = getenv("GPUSIM_DEVICES");
    unsigned long long looked = devices ? strtoull(devices, NULL, 10) : 1;
    if (pthread_create(&t, NULL, first_init, NULL) != 0) return 3;
    while (!atomic_load(&init_done) && sim_calls("cuDeviceGetUuid") < looked) {
    }
    while (n < MAX && after < 8) {
        int done = atomic_load(&init_done);
        pid_t pid = fork();
        if (pid == 0) _exit(cuInit(0) == CUDA_SUCCESS ? 0 : 1);
        if (pid < 0) {
            fork_errors++;
            usleep(1000);
            continue;
        }
        kids[n++] = pid;
        left++;
        if (done) after++;
        else during++;
        reap_ended(&left, &failed); /* (so that the children do not pile up) */
    }
    pthread_join(t, NULL);
    struct timespec start, now;
    clock_gettime(CLOCK_MONOTONIC, &start);
    while (left > 0) {
        if (reap_ended(&left, &failed) > 0) continue;
        clock_gettime(CLOCK_MONOTONIC, &now);
        if (now.tv_sec - start.tv_sec >= 10) break;
        usleep(1000);
    }
    for (int i = 0; i < n && left > 0; i++) {
        if (waitpid(kids[i], NULL, WNOHANG) == 0) {
            kill(kids[i], SIGKILL);
            waitpid(kids[i], NULL, 0);
            hung++;
            left--;
        }
    }
    printf("children=%d\nduring=%d\nhung=%d\nfailed=%d\nfork_errors=%d\ninit.rc=%d\ndone=1\n", n, during, hung, failed, fork_errors, init_rc);
    return 0;
}

int main(int argc, char **argv) {
    if (argc >= 2 && !strcmp(argv[1], "initrace")) return init_race();
    if (argc < 4) return 2;
    const char *mode = argv[1];
    size_t parent_bytes = (size_t)strtoull(argv[2], NULL, 10), child_bytes = (size_t)strtoull(argv[3], NULL, 10);
    CUdevice dev;
    CUcontext ctx;
    CUdeviceptr p = 0, a = 0, b = 0;
    printf("init.rc=%d\n", (int)cuInit(0));
    cuDeviceGet(&dev, 0);
    cuCtxCreate_v2(&ctx, 0, dev);
    printf("parent.rc=%d\n", (int)cuMemAlloc(&p, parent_bytes));
    fflush(stdout);
    int ready[2];
    if (pipe(ready) != 0) return 3;
    pid_t pid = make_child(mode);
    if (pid == 0 && !strcmp(mode, "linger")) {
        CUcontext own;
        cuInit(0);
        cuCtxCreate_v2(&own, 0, dev);
        printf("child.rc1=%d\n", (int)cuMemAlloc(&a, child_bytes));
        fflush(stdout);
        if (write(ready[1], "x", 1) != 1) _exit(3);
        sleep(60);
        _exit(0);
    }
    if (pid > 0 && !strcmp(mode, "linger")) {
        char c;
        if (argc < 5 || read(ready[0], &c, 1) != 1) return 3;
        FILE *f = fopen(argv[4], "w");
        if (f) fclose(f);
        sleep(60);
        return 0;
    }
    if (pid == 0) {
        if (!strcmp(mode, "exec")) {
            execl("/bin/true", "true", (char *)NULL);
            _exit(127);
        }
        if (!strcmp(mode, "alloc")) {
            CUcontext own;
            printf("child.init=%d\n", (int)cuInit(0));
            printf("child.ctx=%d\n", (int)cuCtxCreate_v2(&own, 0, dev));
            printf("child.rc1=%d\n", (int)cuMemAlloc(&a, child_bytes));
            printf("child.rc2=%d\n", (int)cuMemAlloc(&b, child_bytes));
            fflush(stdout);
        }
        exit(0);
    }
    int status = -1;
    waitpid(pid, &status, 0);
    printf("parent.pid=%d\nchild.pid=%d\nchild.status=%d\n", (int)getpid(), (int)pid, status);
    size_t f = 0, t = 0;
    cuMemGetInfo(&f, &t);
    printf("before.free=%zu\n", f);
    fflush(stdout);
    if (argc >= 5) {
        FILE *pause = fopen(argv[4], "w");
        if (!pause) return 3;
        fclose(pause);
        for (int i = 0; i < 6000 && access(argv[4], F_OK) == 0; i++) usleep(10000);
    }
    printf("after.rc1=%d\n", (int)cuMemAlloc(&a, child_bytes));
    printf("after.rc2=%d\n", (int)cuMemAlloc(&b, child_bytes));
    cuMemGetInfo(&f, &t);
    printf("after.free=%zu\n", f);
    printf("done=1\n");
    return 0;
}
