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
 */
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
        } else {
            usage_error(arg);
        }
    }
    kv("shutdown.rc=%d", NVML_CALL(Shutdown));
    kv("done=1");
    return 0;
}
