/* Driver look-ups and calls on a small stack: a raw clone(2) child (SIGCHLD only: a copy of the
 * process, as fork makes, but running on a stack the program mapped) whose stack is KIB KiB with
 * an inaccessible guard page below it, as programs that make their own threads or coroutines
 * have (tests/hardening.rs).
 *
 *   smallstack KIB first|default|later|calls
 *
 * The driver is opened (dlopen, RTLD_NOW) before the child starts, on the program's own stack;
 * the program is linked with -lcuda too, so RTLD_DEFAULT finds the driver without the shim.
 * first:   the child makes the process' first look-up, dlsym(handle, "cuInit"), then a later
 *          one, dlsym(RTLD_DEFAULT, "cuMemAlloc_v2");
 * default: the same names the other way round: dlsym(RTLD_DEFAULT, "cuInit") first, then
 *          dlsym(handle, "cuMemAlloc_v2");
 * later:   the program looks cuInit up in the handle on its own stack first; the child then
 *          does what it does in first;
 * calls:   as first, then cuInit(0), cuDeviceGet(0), cuDevicePrimaryCtxRetain,
 *          cuCtxSetCurrent, cuMemAlloc_v2(1 MiB), cuMemFree_v2 through the pointers found.
 * Output, per step the child reached: STEP.rc (a look-up: 1 found, 0 not), STEP.stack (the
 * bytes of stack the step used below the child's frame: the lowest byte it changed, the
 * stack having been filled with a pattern before the step); then child=exit:N or
 * child=signal:N (SIGSEGV: the stack overflowed into the guard page) and done=1.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#define PAGE 4096
#define PATTERN 0xA5
#define STEPS 8

typedef int (*init_t)(unsigned);
typedef int (*device_get_t)(int *, int);
typedef int (*retain_t)(void **, int);
typedef int (*set_current_t)(void *);
typedef int (*alloc_t)(unsigned long long *, size_t);
typedef int (*free_t)(unsigned long long);

/* Shared with the parent (MAP_SHARED): what the child did. */
struct results {
    int steps;
    const char *name[STEPS];
    long rc[STEPS];
    long stack[STEPS];
};

static struct results *res;
static unsigned char *stack_lo; /* the lowest usable byte (above the guard page) */
static void *driver;
static const char *what;

/* Fills the stack below the caller's frame (and this one's) with the pattern. */
__attribute__((noinline)) static void refill(void) {
    volatile unsigned char here = 0;
    unsigned char *top = (unsigned char *)&here - 256;
    for (volatile unsigned char *p = stack_lo; p < top; p++) *p = PATTERN;
}

/* The bytes of stack used below `frame`: from the lowest byte no longer the pattern. */
__attribute__((noinline)) static long used_below(unsigned char *frame) {
    volatile unsigned char *p = stack_lo;
    while (p < frame && *p == PATTERN) p++;
    return (long)(frame - (unsigned char *)p);
}

static void note(const char *name, long rc, unsigned char *frame) {
    int i = res->steps;
    if (i >= STEPS) return;
    res->name[i] = name;
    res->rc[i] = rc;
    res->stack[i] = used_below(frame);
    res->steps = i + 1;
    refill();
}

static int child(void *arg) {
    (void)arg;
    volatile unsigned char frame_mark = 0;
    unsigned char *frame = (unsigned char *)&frame_mark - 128;
    refill();
    int other_way = !strcmp(what, "default");
    init_t init = (init_t)dlsym(other_way ? RTLD_DEFAULT : driver, "cuInit");
    note("lookup1", init != NULL, frame);
    alloc_t alloc = (alloc_t)dlsym(other_way ? driver : RTLD_DEFAULT, "cuMemAlloc_v2");
    note("lookup2", alloc != NULL, frame);
    if (strcmp(what, "calls") != 0) return 0;
    if (!init || !alloc) return 3;
    device_get_t device_get = (device_get_t)dlsym(driver, "cuDeviceGet");
    retain_t retain = (retain_t)dlsym(driver, "cuDevicePrimaryCtxRetain");
    set_current_t set_current = (set_current_t)dlsym(driver, "cuCtxSetCurrent");
    free_t release = (free_t)dlsym(driver, "cuMemFree_v2");
    if (!device_get || !retain || !set_current || !release) return 3;
    refill();
    note("init", init(0), frame);
    int dev = -1;
    note("deviceget", device_get(&dev, 0), frame);
    void *ctx = NULL;
    note("retain", retain(&ctx, dev), frame);
    note("setcurrent", set_current(ctx), frame);
    unsigned long long p = 0;
    note("alloc", alloc(&p, 1 << 20), frame);
    note("free", release(p), frame);
    return 0;
}

int main(int argc, char **argv) {
    if (argc != 3) return 2;
    long kib = atol(argv[1]);
    what = argv[2];
    if (kib < 1 || kib > 1024 || (strcmp(what, "first") && strcmp(what, "default") && strcmp(what, "later") && strcmp(what, "calls"))) return 2;
    driver = dlopen("libcuda.so.1", RTLD_NOW);
    if (!driver) {
        printf("dlopen=0\ndone=1\n");
        return 0;
    }
    if (!strcmp(what, "later") && !dlsym(driver, "cuInit")) return 3;
    res = mmap(NULL, sizeof *res, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    size_t size = (size_t)kib << 10;
    unsigned char *map = mmap(NULL, size + PAGE, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (res == MAP_FAILED || map == MAP_FAILED || mprotect(map, PAGE, PROT_NONE)) return 4;
    stack_lo = map + PAGE;
    fflush(stdout);
    pid_t pid = clone(child, stack_lo + size, SIGCHLD, NULL);
    if (pid < 0) return 5;
    int status = 0;
    if (waitpid(pid, &status, 0) != pid) return 6;
    for (int i = 0; i < res->steps; i++) printf("%s.rc=%ld\n%s.stack=%ld\n", res->name[i], res->rc[i], res->name[i], res->stack[i]);
    if (WIFSIGNALED(status))
        printf("child=signal:%d\n", WTERMSIG(status));
    else
        printf("child=exit:%d\n", WEXITSTATUS(status));
    printf("done=1\n");
    return 0;
}
