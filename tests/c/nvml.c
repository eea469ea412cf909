/* NVML alone (no CUDA): linked with -lnvidia-ml (-DNVML_LINK) or dlopen("libnvidia-ml.so.1").
 * See nvml_ops.h for the keys.
 *
 * Operations, after nvmlInit_v2 (init.rc):
 *   list            every device NVML shows: count, count_v1, idxI.*
 *   uuid=UUID       nvmlDeviceGetHandleByUUID           -> opI.rc, opI.index, opI.uuid ...
 *   pci=BUSID       nvmlDeviceGetHandleByPciBusId_v2 (and v1: opI.rc_v1)
 *   serial=SERIAL   nvmlDeviceGetHandleBySerial
 *   index=N         nvmlDeviceGetHandleByIndex_v2
 *   index1=N        nvmlDeviceGetHandleByIndex (v1)
 *   uuidv=UUID      nvmlDeviceGetHandleByUUIDV, ASCII
 *   uuidvbin=UUID   nvmlDeviceGetHandleByUUIDV, the 16 bytes
 *   extra=N         unhooked functions on index N: opI.temp, opI.util.gpu, opI.power ... (nvml_extra)
 *   pair=A,B        two-device functions on indices A and B: opI.p2p, opI.board, opI.ancestor
 *   where=NAME      dlsym(libnvidia-ml.so.1, NAME): the file holding the answer -> opI.where
 *                   (its base name, or "none")
 */
#define _GNU_SOURCE /* dladdr */
#include "nvml_ops.h"

int main(int argc, char **argv) {
    kv("mode=%s", nvml_mode);
    int rc = nvml_open();
    kv("init.rc=%d", rc);
    if (rc != 0) {
        kv("done=1");
        return 0;
    }
    for (int i = 1; i < argc && i < MAX_OPS; i++) {
        const char *arg = argv[i];
        char prefix[32];
        snprintf(prefix, sizeof prefix, "op%d.", i);
        const char *eq = strchr(arg, '=');
        if (!strcmp(arg, "list")) {
            nvml_list("");
        } else if (eq && (starts_with(arg, "uuid=") || starts_with(arg, "pci=") ||
                          starts_with(arg, "serial=") || starts_with(arg, "index=") ||
                          starts_with(arg, "index1=") || starts_with(arg, "uuidv=") ||
                          starts_with(arg, "uuidvbin="))) {
            char kind[16];
            size_t n = (size_t)(eq - arg);
            memcpy(kind, arg, n);
            kind[n] = 0;
            nvml_lookup(prefix, kind, eq + 1);
        } else if (starts_with(arg, "extra=")) {
            nvml_extra(prefix, (unsigned int)atoi(arg + 6));
        } else if (starts_with(arg, "pair=") && strchr(arg, ',')) {
            nvml_pair(prefix, (unsigned int)atoi(arg + 5), (unsigned int)atoi(strchr(arg, ',') + 1));
        } else if (starts_with(arg, "where=")) {
            void *lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_NOLOAD);
            void *f = lib ? dlsym(lib, arg + 6) : NULL;
            Dl_info info;
            const char *where = "none";
            if (f && dladdr(f, &info) && info.dli_fname) {
                where = strrchr(info.dli_fname, '/') ? strrchr(info.dli_fname, '/') + 1 : info.dli_fname;
            }
            kv("%swhere=%s", prefix, where);
        } else {
            usage_error(arg);
        }
    }
    kv("shutdown.rc=%d", NVML_CALL(Shutdown));
    kv("done=1");
    return 0;
}
