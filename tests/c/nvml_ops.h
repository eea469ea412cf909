/* NVML as a test program sees it, shared by tests/c/nvml.c and tests/c/runtime.c.
 *
 * No nvml.h is needed: the few types and entry points used are declared here with the
 * layouts of nvml.h (NVML 12.x). The library is reached one of two ways:
 *   -DNVML_LINK  linked with -lnvidia-ml (the exported names, bound by the loader)
 *   otherwise    dlopen("libnvidia-ml.so.1") + dlsym of the exported names (as pynvml,
 *                PyTorch and nvidia-smi's helpers do)
 *
 * nvml_list(prefix) prints, for the devices NVML shows:
 *   PREFIXinit.rc PREFIXcount.rc PREFIXcount (nvmlDeviceGetCount_v2) PREFIXcount_v1
 *   PREFIXidxI.{rc,index,name,uuid,serial,pci,pcilegacy,mem.rc,total,free,used,mem2.rc,total2,free2,used2}
 * nvml_extra(prefix, index) / nvml_pair(prefix, a, b): functions the shim does not hook, on one
 * handle (temperature, utilisation, power, minor number) or two (P2P status, same board,
 * common ancestor); see their comments for the keys.
 * nvml_lookup(prefix, kind, value) looks a device up by uuid / pci / serial / index, or
 * uuidv / uuidvbin (nvmlDeviceGetHandleByUUIDV, ASCII or binary) / index1 (the v1
 * nvmlDeviceGetHandleByIndex):
 *   PREFIXrc PREFIXindex PREFIXuuid (and PREFIXrc_v1 for pci: the v1 nvmlDeviceGetHandleByPciBusId)
 */
#ifndef GPUSHIM_TEST_NVML_OPS_H
#define GPUSHIM_TEST_NVML_OPS_H

#include <dlfcn.h>

#include "scenario.h"

typedef int nvmlReturn_t;
typedef void *nvmlDevice_t;

typedef struct {
    unsigned long long total;
    unsigned long long free;
    unsigned long long used;
} nvmlMemory_t;

typedef struct {
    unsigned int version;
    unsigned long long total;
    unsigned long long reserved;
    unsigned long long free;
    unsigned long long used;
} nvmlMemory_v2_t;

typedef struct {
    unsigned int version;
    unsigned int type; /* 1: ASCII, 2: binary */
    union {
        char str[41];
        unsigned char bytes[16];
    } value;
} nvmlUUID_v1_t;

/* NVML_STRUCT_VERSION(UUID, 1) */
#define NVML_UUID_V1 ((unsigned int)(sizeof(nvmlUUID_v1_t) | (1u << 24)))

/* NVML_STRUCT_VERSION(Memory, 2) */
#define NVML_MEMORY_V2 ((unsigned int)(sizeof(nvmlMemory_v2_t) | (2u << 24)))

typedef struct {
    char busIdLegacy[16];
    unsigned int domain;
    unsigned int bus;
    unsigned int device;
    unsigned int pciDeviceId;
    unsigned int pciSubSystemId;
    char busId[32];
} nvmlPciInfo_t;

typedef struct {
    unsigned int gpu;
    unsigned int memory;
} nvmlUtilization_t;

/* X(field, exported name, parameter list) */
#define NVML_TABLE(X)                                                                             \
    X(Init, nvmlInit_v2, (void))                                                      \
    X(Shutdown, nvmlShutdown, (void))                                                 \
    X(GetCount, nvmlDeviceGetCount_v2, (unsigned int *))                              \
    X(GetCountV1, nvmlDeviceGetCount, (unsigned int *))                               \
    X(ByIndex, nvmlDeviceGetHandleByIndex_v2, (unsigned int, nvmlDevice_t *))         \
    X(ByIndexV1, nvmlDeviceGetHandleByIndex, (unsigned int, nvmlDevice_t *))          \
    X(ByUuidV, nvmlDeviceGetHandleByUUIDV, (const nvmlUUID_v1_t *, nvmlDevice_t *))     \
    X(ByUuid, nvmlDeviceGetHandleByUUID, (const char *, nvmlDevice_t *))              \
    X(ByPci, nvmlDeviceGetHandleByPciBusId_v2, (const char *, nvmlDevice_t *))        \
    X(ByPciV1, nvmlDeviceGetHandleByPciBusId, (const char *, nvmlDevice_t *))         \
    X(BySerial, nvmlDeviceGetHandleBySerial, (const char *, nvmlDevice_t *))          \
    X(GetIndex, nvmlDeviceGetIndex, (nvmlDevice_t, unsigned int *))                   \
    X(GetName, nvmlDeviceGetName, (nvmlDevice_t, char *, unsigned int))               \
    X(GetUuid, nvmlDeviceGetUUID, (nvmlDevice_t, char *, unsigned int))               \
    X(GetSerial, nvmlDeviceGetSerial, (nvmlDevice_t, char *, unsigned int))           \
    X(GetPci, nvmlDeviceGetPciInfo_v3, (nvmlDevice_t, nvmlPciInfo_t *))               \
    X(GetMem, nvmlDeviceGetMemoryInfo, (nvmlDevice_t, nvmlMemory_t *))                \
    X(GetMem2, nvmlDeviceGetMemoryInfo_v2, (nvmlDevice_t, nvmlMemory_v2_t *))              \
    X(GetTemp, nvmlDeviceGetTemperature, (nvmlDevice_t, int, unsigned int *))           \
    X(GetUtil, nvmlDeviceGetUtilizationRates, (nvmlDevice_t, nvmlUtilization_t *))      \
    X(GetPower, nvmlDeviceGetPowerUsage, (nvmlDevice_t, unsigned int *))                \
    X(GetMinor, nvmlDeviceGetMinorNumber, (nvmlDevice_t, unsigned int *))               \
    X(GetP2P, nvmlDeviceGetP2PStatus, (nvmlDevice_t, nvmlDevice_t, int, int *))         \
    X(OnSameBoard, nvmlDeviceOnSameBoard, (nvmlDevice_t, nvmlDevice_t, int *))          \
    X(GetAncestor, nvmlDeviceGetTopologyCommonAncestor, (nvmlDevice_t, nvmlDevice_t, int *))

#define NVML_FN_TYPE(field, name, params) typedef nvmlReturn_t nvml_##field##_fn params;
NVML_TABLE(NVML_FN_TYPE)
#undef NVML_FN_TYPE

static struct {
#define NVML_FIELD(field, name, params) nvml_##field##_fn *field;
    NVML_TABLE(NVML_FIELD)
#undef NVML_FIELD
} nvml;

static int nvml_ready;      /* 1: resolved and nvmlInit_v2 called */
static int nvml_init_rc = -1;

#if defined(NVML_LINK)
#define NVML_DECL(field, name, params) extern nvml_##field##_fn name;
NVML_TABLE(NVML_DECL)
#undef NVML_DECL
__attribute__((unused)) static const char *nvml_mode = "link";
static int nvml_resolve(void) {
#define NVML_LINKED(field, name, params) nvml.field = &name;
    NVML_TABLE(NVML_LINKED)
#undef NVML_LINKED
    return 0;
}
#else
__attribute__((unused)) static const char *nvml_mode = "dlopen";
static int nvml_resolve(void) {
    void *lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        kv("nvml.error=dlopen libnvidia-ml.so.1: %s", dlerror());
        return -1;
    }
#define NVML_DLSYM(field, name, params) nvml.field = (nvml_##field##_fn *)dlsym(lib, #name);
    NVML_TABLE(NVML_DLSYM)
#undef NVML_DLSYM
    return 0;
}
#endif

/* Resolve and nvmlInit_v2 once; returns nvmlInit's answer (or -1 without a library). */
static int nvml_open(void) {
    if (nvml_ready) return nvml_init_rc;
    nvml_ready = 1;
    if (nvml_resolve() != 0) return nvml_init_rc = -1;
    nvml_init_rc = nvml.Init ? nvml.Init() : -1;
    return nvml_init_rc;
}

#define NVML_CALL(field, ...) (nvml.field ? nvml.field(__VA_ARGS__) : (kv("nvml.missing=%s", #field), -1))

/* Everything about one handle, keys PREFIX.* */
static void nvml_describe(const char *p, nvmlDevice_t h) {
    unsigned int index = 9999;
    char name[96] = "", uuid[96] = "", serial[32] = "";
    nvmlPciInfo_t pci;
    memset(&pci, 0, sizeof pci);
    kv("%sindex.rc=%d", p, NVML_CALL(GetIndex, h, &index));
    kv("%sindex=%u", p, index);
    kv("%sname.rc=%d", p, NVML_CALL(GetName, h, name, sizeof name));
    kv("%sname=%s", p, name);
    kv("%suuid.rc=%d", p, NVML_CALL(GetUuid, h, uuid, sizeof uuid));
    kv("%suuid=%s", p, uuid);
    kv("%sserial.rc=%d", p, NVML_CALL(GetSerial, h, serial, sizeof serial));
    kv("%sserial=%s", p, serial);
    kv("%spci.rc=%d", p, NVML_CALL(GetPci, h, &pci));
    kv("%spci=%s", p, pci.busId);
    kv("%spcilegacy=%s", p, pci.busIdLegacy);
    kv("%spcibus=%u", p, pci.bus);

    nvmlMemory_t m;
    memset(&m, 0, sizeof m);
    kv("%smem.rc=%d", p, NVML_CALL(GetMem, h, &m));
    kv("%stotal=%llu", p, m.total);
    kv("%sfree=%llu", p, m.free);
    kv("%sused=%llu", p, m.used);

    nvmlMemory_v2_t m2;
    memset(&m2, 0, sizeof m2);
    m2.version = NVML_MEMORY_V2;
    kv("%smem2.rc=%d", p, NVML_CALL(GetMem2, h, &m2));
    kv("%stotal2=%llu", p, m2.total);
    kv("%sfree2=%llu", p, m2.free);
    kv("%sused2=%llu", p, m2.used);
    kv("%sreserved2=%llu", p, m2.reserved);
}

__attribute__((unused)) static void nvml_list(const char *prefix) {
    int rc = nvml_open();
    kv("%sinit.rc=%d", prefix, rc);
    if (rc != 0) return;
    unsigned int count = 0, count_v1 = 0;
    kv("%scount.rc=%d", prefix, NVML_CALL(GetCount, &count));
    kv("%scount=%u", prefix, count);
    kv("%scount_v1.rc=%d", prefix, NVML_CALL(GetCountV1, &count_v1));
    kv("%scount_v1=%u", prefix, count_v1);
    for (unsigned int i = 0; i < count && i < 64; i++) {
        char p[96];
        nvmlDevice_t h = NULL;
        snprintf(p, sizeof p, "%sidx%u.", prefix, i);
        int hrc = NVML_CALL(ByIndex, i, &h);
        kv("%src=%d", p, hrc);
        if (hrc == 0) nvml_describe(p, h);
    }
}

/* kind: uuid, pci, serial, index */
__attribute__((unused)) static void nvml_lookup(const char *p, const char *kind, const char *value) {
    int rc = nvml_open();
    if (rc != 0) {
        kv("%sinit.rc=%d", p, rc);
        return;
    }
    nvmlDevice_t h = NULL;
    if (!strcmp(kind, "uuid")) {
        rc = NVML_CALL(ByUuid, value, &h);
    } else if (!strcmp(kind, "pci")) {
        nvmlDevice_t h1 = NULL;
        int rc1 = NVML_CALL(ByPciV1, value, &h1);
        kv("%src_v1=%d", p, rc1);
        rc = NVML_CALL(ByPci, value, &h);
        kv("%ssame_v1=%d", p, rc1 == 0 && h1 == h);
    } else if (!strcmp(kind, "serial")) {
        rc = NVML_CALL(BySerial, value, &h);
    } else if (!strcmp(kind, "index")) {
        rc = NVML_CALL(ByIndex, (unsigned int)atoi(value), &h);
    } else if (!strcmp(kind, "index1")) {
        rc = NVML_CALL(ByIndexV1, (unsigned int)atoi(value), &h);
    } else if (!strcmp(kind, "uuidv") || !strcmp(kind, "uuidvbin")) {
        nvmlUUID_v1_t u;
        memset(&u, 0, sizeof u);
        u.version = NVML_UUID_V1;
        if (!strcmp(kind, "uuidv")) {
            u.type = 1;
            snprintf(u.value.str, sizeof u.value.str, "%s", value);
        } else {
            /* GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx -> 16 bytes */
            u.type = 2;
            const char *c = strncmp(value, "GPU-", 4) ? value : value + 4;
            int n = 0;
            while (*c && n < 16) {
                if (*c == '-') { c++; continue; }
                unsigned int byte = 0;
                if (sscanf(c, "%2x", &byte) != 1) break;
                u.value.bytes[n++] = (unsigned char)byte;
                c += 2;
            }
        }
        rc = NVML_CALL(ByUuidV, &u, &h);
    } else {
        kv("error=unknown nvml lookup '%s'", kind);
        exit(64);
    }
    kv("%src=%d", p, rc);
    if (rc == 0) nvml_describe(p, h);
}

/* Functions the shim does not hook, on the handle of index `index` (keys PREFIX.*):
 * temp.rc temp (GPU sensor) util.rc util.gpu util.mem power.rc power minor.rc minor */
__attribute__((unused)) static void nvml_extra(const char *p, unsigned int index) {
    int rc = nvml_open();
    if (rc != 0) {
        kv("%sinit.rc=%d", p, rc);
        return;
    }
    nvmlDevice_t h = NULL;
    rc = NVML_CALL(ByIndex, index, &h);
    kv("%src=%d", p, rc);
    if (rc != 0) return;
    unsigned int temp = 0, power = 0, minor = 9999;
    nvmlUtilization_t util = {999, 999};
    kv("%stemp.rc=%d", p, NVML_CALL(GetTemp, h, 0, &temp));
    kv("%stemp=%u", p, temp);
    kv("%sutil.rc=%d", p, NVML_CALL(GetUtil, h, &util));
    kv("%sutil.gpu=%u", p, util.gpu);
    kv("%sutil.mem=%u", p, util.memory);
    kv("%spower.rc=%d", p, NVML_CALL(GetPower, h, &power));
    kv("%spower=%u", p, power);
    kv("%sminor.rc=%d", p, NVML_CALL(GetMinor, h, &minor));
    kv("%sminor=%u", p, minor);
}

/* Two-device functions on the handles of indices a and b (keys PREFIX.*):
 * rc p2p.rc p2p (NVML_P2P_CAPS_INDEX_READ) board.rc board ancestor.rc ancestor */
__attribute__((unused)) static void nvml_pair(const char *p, unsigned int a, unsigned int b) {
    int rc = nvml_open();
    if (rc != 0) {
        kv("%sinit.rc=%d", p, rc);
        return;
    }
    nvmlDevice_t ha = NULL, hb = NULL;
    rc = NVML_CALL(ByIndex, a, &ha);
    if (rc == 0) rc = NVML_CALL(ByIndex, b, &hb);
    kv("%src=%d", p, rc);
    if (rc != 0) return;
    int p2p = -1, board = -1, ancestor = -1;
    kv("%sp2p.rc=%d", p, NVML_CALL(GetP2P, ha, hb, 0, &p2p));
    kv("%sp2p=%d", p, p2p);
    kv("%sboard.rc=%d", p, NVML_CALL(OnSameBoard, ha, hb, &board));
    kv("%sboard=%d", p, board);
    kv("%sancestor.rc=%d", p, NVML_CALL(GetAncestor, ha, hb, &ancestor));
    kv("%sancestor=%d", p, ancestor);
}

#endif
