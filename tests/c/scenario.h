/* Shared helpers of the gpushim test programs.
 *
 * Every program takes a list of operations on its command line and prints one
 * `key=value` line per fact, which tests/common/mod.rs parses. Operations:
 *   dev=N            make device N current
 *   alloc=API:BYTES  allocate BYTES through API (program specific), slot = op index
 *   free=K           free the allocation made by operation K
 *   info             memory info of the current device  -> opI.free, opI.total, opI.rc
 * plus program-specific ones. Operation I prints keys prefixed with `opI.`.
 */
#ifndef GPUSHIM_TEST_SCENARIO_H
#define GPUSHIM_TEST_SCENARIO_H

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_OPS 256

static void kv(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void kv(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    putchar('\n');
    fflush(stdout);
}

/* xorshift64: the seeded pseudo-random sequence of the workload programs (race, modes, stress). */
__attribute__((unused)) static uint64_t next_random(uint64_t *s) {
    uint64_t x = *s;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return *s = x;
}

/* "alloc=API:BYTES" -> api (static buffer) and bytes; returns 0 on success. */
__attribute__((unused)) static int parse_alloc(const char *arg, char *api, size_t api_len, unsigned long long *bytes) {
    const char *colon = strchr(arg, ':');
    if (!colon || (size_t)(colon - arg) >= api_len) return -1;
    memcpy(api, arg, (size_t)(colon - arg));
    api[colon - arg] = 0;
    char *end = NULL;
    *bytes = strtoull(colon + 1, &end, 10);
    return (end && *end == 0) ? 0 : -1;
}

__attribute__((unused)) static int starts_with(const char *s, const char *prefix) {
    return strncmp(s, prefix, strlen(prefix)) == 0;
}

__attribute__((unused)) static void usage_error(const char *arg) {
    kv("error=bad operation '%s'", arg);
    exit(64);
}

#endif
