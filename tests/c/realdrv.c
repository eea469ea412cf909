/* Ground truth from a real NVIDIA driver library without a GPU (tests/real_driver.rs): what
 * cuGetProcAddress and cuGetExportTable answer, and that cuInit says there is no device. The
 * driver is reached as the CUDA runtime does: dlopen("libcuda.so.1") and one dlsym of
 * cuGetProcAddress_v2 (or the v1 cuGetProcAddress) — under the shim, its interposed dlsym.
 *
 *   realdrv gpa NAMES_FILE   for every base name in the file (one a line), every version of
 *                            VERSIONS and flags 0 and 2 (per-thread): one line
 *                            `gpa NAME VERSION FLAGS RC STATUS SYMBOL LIB` (v2), then the same
 *                            with `gpa1` and no status (v1); SYMBOL is the name dladdr gives for
 *                            the returned address (`-` for NULL), LIB `shim` (libgpushim),
 *                            `driver` (libcuda) or `other`
 *   realdrv tables           for each private table id the runtime uses:
 *                            `table ID RC SIZE` (SIZE: slot 0 for tables that have a size slot)
 *   realdrv init             init.rc=cuInit(0), version=cuDriverGetVersion
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int (*gpa2_t)(const char *, void **, int, unsigned long long, int *);
typedef int (*gpa1_t)(const char *, void **, int, unsigned long long);
typedef int (*table_t)(const void **, const unsigned char *);
typedef int (*init_t)(unsigned);
typedef int (*version_t)(int *);

static const int VERSIONS[] = {2000, 3020, 4000, 6000, 8000, 9020, 10020, 11020, 11040, 12000, 12020, 12050, 12090, 13000};

static void describe(void *p, const char **sym, const char **lib) {
    Dl_info info;
    *sym = "-";
    *lib = "-";
    if (!p) return;
    if (!dladdr(p, &info) || !info.dli_fname) {
        *sym = "?";
        *lib = "other";
        return;
    }
    *sym = info.dli_sname ? info.dli_sname : "?";
    *lib = strstr(info.dli_fname, "libgpushim") ? "shim" : strstr(info.dli_fname, "libcuda") ? "driver" : "other";
}

static void *need(void *h, const char *name) {
    void *p = dlsym(h, name);
    if (!p) {
        printf("missing=%s\n", name);
        exit(3);
    }
    return p;
}

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    if (!h) {
        printf("dlopen.error=%s\n", dlerror());
        return 3;
    }
    if (!strcmp(argv[1], "gpa") && argc > 2) {
        gpa2_t gpa2 = (gpa2_t)need(h, "cuGetProcAddress_v2");
        gpa1_t gpa1 = (gpa1_t)need(h, "cuGetProcAddress");
        FILE *f = fopen(argv[2], "r");
        if (!f) return 3;
        char name[256];
        while (fscanf(f, "%255s", name) == 1) {
            for (size_t v = 0; v < sizeof VERSIONS / sizeof *VERSIONS; v++) {
                for (int flags = 0; flags <= 2; flags += 2) {
                    const char *sym, *lib;
                    void *p = NULL;
                    int status = -1;
                    int rc = gpa2(name, &p, VERSIONS[v], (unsigned long long)flags, &status);
                    describe(p, &sym, &lib);
                    printf("gpa %s %d %d %d %d %s %s\n", name, VERSIONS[v], flags, rc, status, sym, lib);
                    p = NULL;
                    rc = gpa1(name, &p, VERSIONS[v], (unsigned long long)flags);
                    describe(p, &sym, &lib);
                    printf("gpa1 %s %d %d %d - %s %s\n", name, VERSIONS[v], flags, rc, sym, lib);
                }
            }
        }
        fclose(f);
    } else if (!strcmp(argv[1], "tables")) {
        static const struct { const char *name; unsigned char id[16]; int sized; } T[] = {
            {"f8cff951", {0xf8, 0xcf, 0xf9, 0x51, 0x21, 0x46, 0x8b, 0x4e, 0xb9, 0xe2, 0xfb, 0x46, 0x9e, 0x7c, 0x0d, 0xd9}, 1},
            {"6bd5fb6c", {0x6b, 0xd5, 0xfb, 0x6c, 0x5b, 0xf4, 0xe7, 0x4a, 0x89, 0x87, 0xd9, 0x39, 0x12, 0xfd, 0x9d, 0xf9}, 1},
            {"a094798c", {0xa0, 0x94, 0x79, 0x8c, 0x2e, 0x74, 0x2e, 0x74, 0x93, 0xf2, 0x08, 0x00, 0x20, 0x0c, 0x0a, 0x66}, 1},
            {"42d85a81", {0x42, 0xd8, 0x5a, 0x81, 0x23, 0xf6, 0xcb, 0x47, 0x82, 0x98, 0xf6, 0xe7, 0x8a, 0x3a, 0xec, 0xdc}, 1},
            {"21318c60", {0x21, 0x31, 0x8c, 0x60, 0x97, 0x14, 0x32, 0x48, 0x8c, 0xa6, 0x41, 0xff, 0x73, 0x24, 0xc8, 0xf2}, 1},
            {"c693336e", {0xc6, 0x93, 0x33, 0x6e, 0x11, 0x21, 0xdf, 0x11, 0xa8, 0xc3, 0x68, 0xf3, 0x55, 0xd8, 0x95, 0x93}, 0},
            {"263e8860", {0x26, 0x3e, 0x88, 0x60, 0x7c, 0xd2, 0x61, 0x43, 0x92, 0xf6, 0xbb, 0xd5, 0x00, 0x6d, 0xfa, 0x7e}, 1},
            {"d4082055", {0xd4, 0x08, 0x20, 0x55, 0xbd, 0xe6, 0x70, 0x4b, 0x8d, 0x34, 0xba, 0x12, 0x3c, 0x66, 0xe1, 0xf2}, 1},
        };
        table_t get = (table_t)need(h, "cuGetExportTable");
        for (size_t i = 0; i < sizeof T / sizeof *T; i++) {
            const void *t = NULL;
            int rc = get(&t, T[i].id);
            size_t size = (rc == 0 && t && T[i].sized) ? *(const size_t *)t : 0;
            printf("table %s %d %zu\n", T[i].name, rc, size);
        }
    } else if (!strcmp(argv[1], "init")) {
        int version = 0;
        printf("init.rc=%d\n", ((init_t)need(h, "cuInit"))(0));
        printf("version.rc=%d\n", ((version_t)need(h, "cuDriverGetVersion"))(&version));
        printf("version=%d\n", version);
    } else {
        return 2;
    }
    printf("done=1\n");
    return 0;
}
