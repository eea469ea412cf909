/* Shared by the GPU probes (cudart_probe.c, driver_probe.c): `key=value` output and the
 * "D:A:B" argument parser. */
#ifndef GPUSHIM_PROBE_H
#define GPUSHIM_PROBE_H

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Prints one `key=value` line and flushes it (a probe killed by a timeout keeps its output). */
static void kv(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void kv(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    putchar('\n');
    fflush(stdout);
}

/* "D:A:B" or "D:A" -> values; returns the number parsed, -1 on malformed input. */
static int parse3(const char *s, unsigned long long out[3]) {
    int n = 0;
    char *end = NULL;
    while (n < 3) {
        out[n++] = strtoull(s, &end, 10);
        if (end == s) return -1;
        if (*end == 0) return n;
        if (*end != ':') return -1;
        s = end + 1;
    }
    return -1;
}

#endif
