/* A preloaded library that wraps a C-library function the usual way, with
 * dlsym(RTLD_NEXT, name) (as tracers, allocators and fakeroot do). Loaded after libgpushim.so
 * (LD_PRELOAD=libgpushim.so:this), its look-up goes through the shim's dlsym: glibc must still
 * take this library as the caller, so that "next" is the C library and not this library
 * itself. The constructor prints where the look-up led:
 *   wrap.next=<file name of the object dladdr names>   wrap.self=<1 if it found itself, else 0>
 * tests/hardening.rs (the_dlsym_hook_keeps_the_callers_rtld_next). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

pid_t getpid(void) {
    static pid_t (*next)(void);
    if (!next)
        next = (pid_t(*)(void))dlsym(RTLD_NEXT, "getpid");
    return next && next != getpid ? next() : -1;
}

__attribute__((constructor)) static void wrap_init(void) {
    void *next = dlsym(RTLD_NEXT, "getpid");
    Dl_info info;
    const char *file = "none";
    if (next && dladdr(next, &info) && info.dli_fname) {
        const char *slash = strrchr(info.dli_fname, '/');
        file = slash ? slash + 1 : info.dli_fname;
    }
    fprintf(stderr, "wrap.next=%s\nwrap.self=%d\n", file, next == (void *)getpid);
}
