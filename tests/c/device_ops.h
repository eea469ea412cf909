/* The operations tests/c/drvapi.c and tests/c/runtime.c both carry (see scenario.h), written
 * once over a few hooks each program defines with its own API:
 *   dev=N  alloc=API:BYTES  free=K  info  ids  bypci=BUSID  attrs  ptrdev=K  peer=A,B
 *   copy=K,L  copyasync=K,L  hammer=SEED:ITERS:D,D..  sim=P  sleep=MS  touch=PATH
 * Include it after the program's slots, `current_device` and helpers; a program calls
 * device_op(i, arg) for operation i and goes on with its own operations where it returns 0.
 *
 * Keys: dev/free -> opI.rc; info -> opI.{rc,free,total}; bypci -> opI.{rc,dev};
 * peer -> opI.{rc,can}; ptrdev of a slot without a device pointer -> opI.error;
 * copy / copyasync -> opI.{fill,rc,back,bytes,equal} (opI.error without two device-pointer
 * slots); hammer -> hammer.threads and hammerD.{ctxrc,ok,refused,other,spurious,infobad,left,
 * maxheld,total,base}: one thread per device D (the device's context made current in the
 * thread; all threads meet at a barrier every 50 steps) allocating random sizes (up to
 * 1.25 GiB, now and then 4.5 GiB) and freeing at random, memory info after every step;
 * spurious = refusals although base + held + size <= total; infobad = steps where
 * total - free != base + held or the total changed; base = in use when the thread started.
 * sim=P -> what the simulated driver knows now about physical device P: opI.{used,peak} and
 * opI.calls.NAME (sim_hooks.h). sleep=MS waits (holding everything); touch=PATH creates PATH
 * (both -> opI.rc), so that tests can act on a process mid-run (kill it, start another);
 * waitfor=PATH waits (30 s at most) until PATH exists (-> opI.rc); stamp -> opI.ms, the
 * machine's monotonic clock in milliseconds (comparable between processes).
 */
#ifndef GPUSHIM_TEST_DEVICE_OPS_H
#define GPUSHIM_TEST_DEVICE_OPS_H

#include <pthread.h>
#include <time.h>
#include <unistd.h>

#include "scenario.h"
#include "sim_hooks.h"

/* ---- hooks: every program defines these (return values are the API's status, 0 = success) ---- */

static int set_device(int dev);                                        /* dev=N */
static void do_alloc(int i, const char *api, unsigned long long bytes); /* prints opI.rc */
static int release_slot(int k);
static int mem_info(size_t *free_b, size_t *total_b);
static void do_ids(void);
static int device_by_pci(int *dev, const char *bus_id);
static void do_attrs(void);
static int slot_is_dptr(int k);     /* slot k holds a device pointer */
static size_t slot_bytes(int k);
static void do_ptrdev(int i, int k); /* k holds a device pointer */
static int can_access_peer(int *can, int a, int b);
/* copy: fill slot k from src (its device current), copy k -> l between their devices, read
 * l back into back, then make device `was` current again */
static int copy_fill(int k, int l, const void *src, size_t n);
static int copy_peer(int k, int l, size_t n, int async);
static int copy_read_back(void *back, int l, size_t n);
static void copy_end(int was);
/* hammer, in its thread: make device dev's context current; allocate (HAMMER_OK,
 * HAMMER_REFUSED: out of memory, HAMMER_OTHER), free, memory info */
enum hammer_alloc_result { HAMMER_OK, HAMMER_REFUSED, HAMMER_OTHER };
static int hammer_enter(int dev);
static enum hammer_alloc_result hammer_alloc(unsigned long long *ptr, size_t size);
static int hammer_free(unsigned long long ptr);

/* ---- shared output ---- */

/* "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" of 16 UUID bytes */
static void uuid_string(char *out, size_t len, const unsigned char *u) {
    snprintf(out, len,
             "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
             u[0], u[1], u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13],
             u[14], u[15]);
}

/* opI.rc and opI.KEY */
static void kv_rc_and(int i, int rc, const char *key, int value) {
    kv("op%d.rc=%d", i, rc);
    kv("op%d.%s=%d", i, key, value);
}

/* "A,B" -> a, b; 0 on success */
static int parse_pair(const char *arg, int *a, int *b) {
    return sscanf(arg, "%d,%d", a, b) == 2 ? 0 : -1;
}

/* ---- info, bypci, peer ---- */

static void do_info(int i) {
    size_t free_b = 0, total_b = 0;
    int rc = mem_info(&free_b, &total_b);
    kv("op%d.rc=%d", i, rc);
    kv("op%d.free=%zu", i, free_b);
    kv("op%d.total=%zu", i, total_b);
}

static void do_bypci(int i, const char *bus_id) {
    int dev = -1;
    int rc = device_by_pci(&dev, bus_id);
    kv_rc_and(i, rc, "dev", dev);
}

static void do_peer(int i, const char *arg) {
    int a = -1, b = -1, can = -1;
    if (parse_pair(arg, &a, &b)) usage_error(arg);
    int rc = can_access_peer(&can, a, b);
    kv_rc_and(i, rc, "can", can);
}

/* ---- copies between devices ---- */

/* Fill slot k, copy it to slot l between their devices, read l back (at most 4 MiB). */
static void do_copy(int i, const char *arg, int async) {
    int k = -1, l = -1;
    if (parse_pair(arg, &k, &l) || !slot_is_dptr(k) || !slot_is_dptr(l)) {
        kv("op%d.error=copy needs two device-pointer slots: '%s'", i, arg);
        return;
    }
    size_t n = slot_bytes(k) < slot_bytes(l) ? slot_bytes(k) : slot_bytes(l);
    if (n > (4u << 20)) n = 4u << 20;
    unsigned char *src = malloc(n), *back = malloc(n);
    for (size_t j = 0; j < n; j++) src[j] = (unsigned char)(j * 7 + 13 * i + 1);
    memset(back, 0, n);
    int was = current_device;
    kv("op%d.fill=%d", i, copy_fill(k, l, src, n));
    kv("op%d.rc=%d", i, copy_peer(k, l, n, async));
    kv("op%d.back=%d", i, copy_read_back(back, l, n));
    kv("op%d.bytes=%zu", i, n);
    kv("op%d.equal=%d", i, memcmp(src, back, n) == 0);
    copy_end(was);
    free(src);
    free(back);
}

/* ---- hammer: a thread per device allocating and freeing at random ---- */

#define HAMMER_MAX_LIVE 256
#define HAMMER_MAX_THREADS 16
struct hammer {
    int dev;
    unsigned seed;
    int iters;
    pthread_barrier_t *start;
    int ctxrc;
    long ok, refused, other, spurious, infobad, left;
    unsigned long long maxheld, total, base;
};

static void *hammer_thread(void *arg) {
    struct hammer *h = arg;
    unsigned long long live[HAMMER_MAX_LIVE];
    size_t sizes[HAMMER_MAX_LIVE];
    int n = 0;
    unsigned long long held = 0;
    int rc = hammer_enter(h->dev);
    h->ctxrc = rc;
    pthread_barrier_wait(h->start);
    if (rc != 0) {
        /* keep meeting the others at the barrier, or they wait forever */
        for (int it = 0; it < h->iters; it++)
            if (it % 50 == 49) pthread_barrier_wait(h->start);
        return NULL;
    }
    size_t f = 0, t = 0;
    mem_info(&f, &t);
    h->total = t;
    h->base = t - f; /* in use before the threads started (other slots of the program) */
    for (int it = 0; it < h->iters; it++) {
        /* meet the other threads now and then, so that all of them hold memory at once */
        if (it % 50 == 49) pthread_barrier_wait(h->start);
        unsigned r = (unsigned)rand_r(&h->seed);
        if (n > 0 && (r % 3 == 0 || n == HAMMER_MAX_LIVE)) {
            int j = (int)((unsigned)rand_r(&h->seed) % (unsigned)n);
            if (hammer_free(live[j]) == 0) {
                held -= sizes[j];
            } else {
                h->other++;
            }
            live[j] = live[n - 1];
            sizes[j] = sizes[n - 1];
            n--;
        } else {
            /* 1 MiB .. 1.25 GiB in MiB steps; one in 16 asks 4.5 GiB at once */
            size_t size = (r % 16 == 1) ? (size_t)9 << 29
                                        : (size_t)(1 + (unsigned)rand_r(&h->seed) % 1280) << 20;
            unsigned long long p = 0;
            switch (hammer_alloc(&p, size)) {
            case HAMMER_OK:
                h->ok++;
                live[n] = p;
                sizes[n] = size;
                n++;
                held += size;
                if (held > h->maxheld) h->maxheld = held;
                break;
            case HAMMER_REFUSED:
                h->refused++;
                if (h->base + held + size <= h->total) h->spurious++;
                break;
            case HAMMER_OTHER: h->other++; break;
            }
        }
        f = t = 0;
        rc = mem_info(&f, &t);
        if (rc != 0 || t != h->total || t - f != h->base + held) h->infobad++;
    }
    while (n > 0) {
        n--;
        if (hammer_free(live[n]) != 0) h->left++;
    }
    return NULL;
}

static void do_hammer(const char *arg) {
    unsigned seed = 0;
    int iters = 0, used = 0;
    struct hammer h[HAMMER_MAX_THREADS];
    pthread_t th[HAMMER_MAX_THREADS];
    int nt = 0;
    if (sscanf(arg, "%u:%d:%n", &seed, &iters, &used) < 2 || used == 0) usage_error(arg);
    for (const char *p = arg + used; *p && nt < HAMMER_MAX_THREADS;) {
        memset(&h[nt], 0, sizeof h[nt]);
        h[nt].dev = atoi(p);
        h[nt].seed = seed * 7919u + (unsigned)h[nt].dev;
        h[nt].iters = iters;
        nt++;
        p = strchr(p, ',');
        if (!p) break;
        p++;
    }
    pthread_barrier_t start;
    pthread_barrier_init(&start, NULL, (unsigned)nt);
    for (int k = 0; k < nt; k++) {
        h[k].start = &start;
        pthread_create(&th[k], NULL, hammer_thread, &h[k]);
    }
    for (int k = 0; k < nt; k++) pthread_join(th[k], NULL);
    pthread_barrier_destroy(&start);
    kv("hammer.threads=%d", nt);
    for (int k = 0; k < nt; k++) {
        int d = h[k].dev;
        kv("hammer%d.ctxrc=%d", d, h[k].ctxrc);
        kv("hammer%d.ok=%ld", d, h[k].ok);
        kv("hammer%d.refused=%ld", d, h[k].refused);
        kv("hammer%d.other=%ld", d, h[k].other);
        kv("hammer%d.spurious=%ld", d, h[k].spurious);
        kv("hammer%d.infobad=%ld", d, h[k].infobad);
        kv("hammer%d.left=%ld", d, h[k].left);
        kv("hammer%d.maxheld=%llu", d, h[k].maxheld);
        kv("hammer%d.total=%llu", d, h[k].total);
        kv("hammer%d.base=%llu", d, h[k].base);
    }
}

/* ---- the shared operations ---- */

/* Runs operation i if it is one of the shared ones (then returns 1). */
static int device_op(int i, const char *arg) {
    if (starts_with(arg, "dev=")) {
        kv("op%d.rc=%d", i, set_device(atoi(arg + 4)));
    } else if (starts_with(arg, "alloc=")) {
        char name[32];
        unsigned long long bytes;
        if (parse_alloc(arg + 6, name, sizeof name, &bytes)) usage_error(arg);
        do_alloc(i, name, bytes);
    } else if (starts_with(arg, "free=")) {
        kv("op%d.rc=%d", i, release_slot(atoi(arg + 5)));
    } else if (!strcmp(arg, "info")) {
        do_info(i);
    } else if (!strcmp(arg, "ids")) {
        do_ids();
    } else if (starts_with(arg, "bypci=")) {
        do_bypci(i, arg + 6);
    } else if (!strcmp(arg, "attrs")) {
        do_attrs();
    } else if (starts_with(arg, "ptrdev=")) {
        int k = atoi(arg + 7);
        if (slot_is_dptr(k))
            do_ptrdev(i, k);
        else
            kv("op%d.error=slot %d holds no device pointer", i, k);
    } else if (starts_with(arg, "peer=")) {
        do_peer(i, arg + 5);
    } else if (starts_with(arg, "copy=")) {
        do_copy(i, arg + 5, 0);
    } else if (starts_with(arg, "copyasync=")) {
        do_copy(i, arg + 10, 1);
    } else if (starts_with(arg, "hammer=")) {
        do_hammer(arg + 7);
    } else if (starts_with(arg, "sleep=")) {
        /* hold what the process has for MS milliseconds (other processes act meanwhile) */
        fflush(stdout);
        usleep((useconds_t)atoi(arg + 6) * 1000);
        kv("op%d.rc=0", i);
    } else if (starts_with(arg, "touch=")) {
        /* create the file PATH: tells a test that the operations before it are done */
        fflush(stdout);
        FILE *f = fopen(arg + 6, "w");
        if (f) fclose(f);
        kv("op%d.rc=%d", i, f ? 0 : 1);
    } else if (starts_with(arg, "waitfor=")) {
        /* wait (up to 30 s) until the file PATH exists: another process got somewhere */
        int n = 0;
        while (access(arg + 8, F_OK) != 0 && n++ < 3000) usleep(10000);
        kv("op%d.rc=%d", i, access(arg + 8, F_OK) == 0 ? 0 : 1);
    } else if (!strcmp(arg, "stamp")) {
        /* the machine's monotonic clock (ms, comparable between processes) */
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        kv("op%d.ms=%lld", i, (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000);
    } else if (starts_with(arg, "sim=")) {
        char prefix[32];
        snprintf(prefix, sizeof prefix, "op%d.", i);
        sim_op(prefix, atoi(arg + 4));
    } else {
        return 0;
    }
    return 1;
}

#endif
