/* Concurrent first use, and a program that finds the shim's driver functions without linking
 * the driver (tests/hardening.rs). Every function is looked up with dlsym(RTLD_DEFAULT, …), as a
 * program on a machine without libcuda.so.1 would find the preloaded shim's exports.
 *
 *   firstuse THREADS [setaccess=COUNT]
 *
 * THREADS threads meet at a barrier, then each looks up and calls cuInit(0) and cuDeviceGetCount
 * at once -> found (threads that found cuInit), init.ok, init.rc (the first non-zero result, or
 * 0), count (the device count all of them saw, -1 if they disagree).
 * setaccess=COUNT: after that, cuMemSetAccess(0, 0, &one_descriptor, COUNT) -> setaccess.rc
 * (a hostile count: only one descriptor is there).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int (*init_t)(unsigned);
typedef int (*count_t)(int *);
struct desc { int type, id, flags; };
typedef int (*set_access_t)(unsigned long long, size_t, const struct desc *, size_t);

static pthread_barrier_t start;
static int found, init_ok, init_rc, count = -2;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

static void *first(void *arg) {
    (void)arg;
    pthread_barrier_wait(&start);
    init_t init = (init_t)dlsym(RTLD_DEFAULT, "cuInit");
    count_t get_count = (count_t)dlsym(RTLD_DEFAULT, "cuDeviceGetCount");
    int rc = init ? init(0) : -1, n = -1;
    if (rc == 0 && get_count) get_count(&n);
    pthread_mutex_lock(&lock);
    found += init != NULL;
    init_ok += rc == 0;
    if (rc != 0 && init_rc == 0) init_rc = rc;
    count = count == -2 ? n : (count == n ? n : -1);
    pthread_mutex_unlock(&lock);
    return NULL;
}

int main(int argc, char **argv) {
    int threads = argc > 1 ? atoi(argv[1]) : 8;
    if (threads < 1 || threads > 64) return 2;
    pthread_t t[64];
    pthread_barrier_init(&start, NULL, (unsigned)threads);
    for (int i = 0; i < threads; i++) pthread_create(&t[i], NULL, first, NULL);
    for (int i = 0; i < threads; i++) pthread_join(t[i], NULL);
    printf("found=%d\ninit.ok=%d\ninit.rc=%d\ncount=%d\n", found, init_ok, init_rc, count);
    for (int i = 2; i < argc; i++) {
        if (!strncmp(argv[i], "setaccess=", 10)) {
            struct desc one = {1, 0, 3};
            set_access_t set = (set_access_t)dlsym(RTLD_DEFAULT, "cuMemSetAccess");
            printf("setaccess.rc=%d\n", set ? set(0, 0, &one, (size_t)strtoull(argv[i] + 10, NULL, 10)) : -1);
        }
    }
    printf("done=1\n");
    fflush(stdout);
    return 0;
}
