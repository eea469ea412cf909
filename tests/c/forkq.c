/* What a forked child does to its parent's figures (tests/hardening.rs). Linked with -lcuda.
 *
 *   forkq MODE PARENT_BYTES CHILD_BYTES
 *
 * The parent initialises CUDA, creates a context and allocates PARENT_BYTES (parent.rc), then
 * forks. The child, by MODE:
 *   exit   exits at once with exit(0) (its exit handlers run)
 *   exec   execs /bin/true
 *   alloc  initialises CUDA, creates a context of its own, allocates CHILD_BYTES twice
 *          (child.rc1, child.rc2, printed by the child), then exits with exit(0)
 *   linger (tests/observability.rs) allocates CHILD_BYTES in a context of its own and sleeps;
 *          the parent does not wait: it creates the file argv[4] once the child allocated
 *          and sleeps (both 60 s)
 * The parent waits (child.status), then allocates CHILD_BYTES (after.rc1) and again (after.rc2)
 * and reads cuMemGetInfo (after.free).
 */
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

int main(int argc, char **argv) {
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
    pid_t pid = fork();
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
    printf("child.status=%d\n", status);
    printf("after.rc1=%d\n", (int)cuMemAlloc(&a, child_bytes));
    printf("after.rc2=%d\n", (int)cuMemAlloc(&b, child_bytes));
    size_t f = 0, t = 0;
    cuMemGetInfo(&f, &t);
    printf("after.free=%zu\n", f);
    printf("done=1\n");
    return 0;
}
