// A program's own allocator, preloaded as jemalloc or tcmalloc are: malloc and its kin from a
// bump arena (free keeps everything). It notes where each allocation was called from, and at
// exit prints how many calls came from libgpushim.so and how many pointers given to free or
// realloc were not its own (memory from another allocator):
//   own_malloc: shim_calls=N foreign=M
// Used by tests/hardening.rs: the library's C-library calls must reach the program's
// allocator, as any library's do.
#define _GNU_SOURCE
#include <errno.h>
#include <link.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#define ARENA ((size_t)512 << 20)
#define MAX_CALLERS 65536

static _Alignas(64) unsigned char arena[ARENA];
static size_t top;
static void *callers[MAX_CALLERS];
static unsigned n_callers;
static unsigned foreign;

static void note(void *from) {
    unsigned i = __atomic_fetch_add(&n_callers, 1, __ATOMIC_RELAXED);
    if (i < MAX_CALLERS) callers[i] = from;
}

static int ours(void *p) {
    return (unsigned char *)p >= arena && (unsigned char *)p < arena + ARENA;
}

static void *bump(size_t size, size_t align) {
    if (align < 16) align = 16;
    if (size > ARENA) { errno = ENOMEM; return NULL; }
    size_t need = size + 16 + align;
    size_t at = __atomic_fetch_add(&top, need, __ATOMIC_RELAXED);
    if (at + need > ARENA) { errno = ENOMEM; return NULL; }
    uintptr_t p = ((uintptr_t)arena + at + 16 + align - 1) & ~(uintptr_t)(align - 1);
    ((size_t *)p)[-1] = size;
    return (void *)p;
}

void *malloc(size_t n) { note(__builtin_return_address(0)); return bump(n, 16); }
void *calloc(size_t a, size_t b) {
    note(__builtin_return_address(0));
    size_t n;
    if (__builtin_mul_overflow(a, b, &n)) { errno = ENOMEM; return NULL; }
    return bump(n, 16); // the arena is never reused: still zero
}
void free(void *p) { if (p && !ours(p)) __atomic_fetch_add(&foreign, 1, __ATOMIC_RELAXED); }
void *realloc(void *p, size_t n) {
    note(__builtin_return_address(0));
    if (p && !ours(p)) { __atomic_fetch_add(&foreign, 1, __ATOMIC_RELAXED); return NULL; }
    void *q = bump(n, 16);
    if (q && p) {
        size_t old = ((size_t *)p)[-1];
        memcpy(q, p, old < n ? old : n);
    }
    return q;
}
int posix_memalign(void **out, size_t align, size_t n) {
    note(__builtin_return_address(0));
    void *p = bump(n, align);
    if (!p) return ENOMEM;
    *out = p;
    return 0;
}
void *aligned_alloc(size_t align, size_t n) { note(__builtin_return_address(0)); return bump(n, align); }
void *memalign(size_t align, size_t n) { note(__builtin_return_address(0)); return bump(n, align); }
size_t malloc_usable_size(void *p) { return p && ours(p) ? ((size_t *)p)[-1] : 0; }

struct span { uintptr_t lo[16], hi[16]; int n; };

static int find_shim(struct dl_phdr_info *info, size_t size, void *data) {
    (void)size;
    struct span *s = data;
    if (!info->dlpi_name || !strstr(info->dlpi_name, "libgpushim.so")) return 0;
    for (int i = 0; i < info->dlpi_phnum && s->n < 16; i++) {
        if (info->dlpi_phdr[i].p_type != PT_LOAD) continue;
        s->lo[s->n] = info->dlpi_addr + info->dlpi_phdr[i].p_vaddr;
        s->hi[s->n] = s->lo[s->n] + info->dlpi_phdr[i].p_memsz;
        s->n++;
    }
    return 1;
}

__attribute__((destructor)) static void report(void) {
    struct span s = {.n = 0};
    dl_iterate_phdr(find_shim, &s);
    unsigned n = n_callers < MAX_CALLERS ? n_callers : MAX_CALLERS, from_shim = 0;
    for (unsigned i = 0; i < n; i++)
        for (int k = 0; k < s.n; k++)
            if ((uintptr_t)callers[i] >= s.lo[k] && (uintptr_t)callers[i] < s.hi[k]) { from_shim++; break; }
    char line[128];
    int len = snprintf(line, sizeof line, "own_malloc: shim_calls=%u foreign=%u\n", from_shim, foreign);
    if (len > 0) (void)!write(2, line, (size_t)len);
}
