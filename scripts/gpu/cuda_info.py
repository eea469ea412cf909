"""gpu-validate: the driver API and NVML through ctypes (dlopen + dlsym), standard library only.

Used twice: without the shim, once, to read the physical devices the expectations are computed
from (cuDeviceTotalMem_v2, UUIDs, NVML totals); and with the shim as the `dlopen`+`dlsym`
access path (the way XLA, cudarc or TensorFlow's stubs reach the driver).

    python3 cuda_info.py [--no-nvml] [--fill DEV:CHUNK:CAP]

Prints one line `RESULT {json}`: driver {loaded, error, init_rc, version, count, path, devices:
[{name, uuid, pci, total, info_rc, free, info_total}]}, nvml {loaded, error, init_rc, count,
devices: [{uuid, total, used, free}]}, and with --fill: fill {count, bytes, rc} (cuMemAlloc_v2
of CHUNK bytes on DEV until an error or CAP bytes, then cuMemFree_v2 of all).
"""
import ctypes
import json
import os
import sys

RESULT = {}


def load(names):
    errors = []
    for name in names:
        try:
            return ctypes.CDLL(name), None
        except OSError as e:
            errors.append(str(e))
    return None, "; ".join(errors)


def mapped_path(stem):
    """The file a loaded library was mapped from (/proc/self/maps), for linking against it."""
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                path = line.split()[-1]
                if "/" in path and os.path.basename(path).startswith(stem):
                    return os.path.realpath(path)
    except OSError:
        pass
    return None


def fmt_uuid(raw):
    h = bytes(raw).hex()
    return "GPU-%s-%s-%s-%s-%s" % (h[0:8], h[8:12], h[12:16], h[16:20], h[20:32])


def driver_info(fill):
    out = {"loaded": False}
    RESULT["driver"] = out
    cu, err = load(["libcuda.so.1", "libcuda.so"])
    if cu is None:
        out["error"] = err
        return None
    out["loaded"] = True
    out["path"] = mapped_path("libcuda.so")
    rc = cu.cuInit(0)
    out["init_rc"] = rc
    version = ctypes.c_int(0)
    cu.cuDriverGetVersion(ctypes.byref(version))
    out["version"] = version.value
    if rc != 0:
        out["count"] = 0
        out["devices"] = []
        return cu
    n = ctypes.c_int(0)
    out["count_rc"] = cu.cuDeviceGetCount(ctypes.byref(n))
    out["count"] = n.value
    out["devices"] = []
    for i in range(n.value):
        dev = ctypes.c_int(0)
        cu.cuDeviceGet(ctypes.byref(dev), i)
        name = ctypes.create_string_buffer(256)
        cu.cuDeviceGetName(name, 256, dev)
        uuid = (ctypes.c_ubyte * 16)()
        cu.cuDeviceGetUuid(uuid, dev)
        pci = ctypes.create_string_buffer(64)
        cu.cuDeviceGetPCIBusId(pci, 64, dev)
        total = ctypes.c_size_t(0)
        total_rc = cu.cuDeviceTotalMem_v2(ctypes.byref(total), dev)
        ctx = ctypes.c_void_p(0)
        info_rc = cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev)
        if info_rc == 0:
            info_rc = cu.cuCtxSetCurrent(ctx)
        free_b, total_b = ctypes.c_size_t(0), ctypes.c_size_t(0)
        if info_rc == 0:
            info_rc = cu.cuMemGetInfo_v2(ctypes.byref(free_b), ctypes.byref(total_b))
        out["devices"].append({
            "name": name.value.decode(errors="replace"),
            "uuid": fmt_uuid(uuid),
            "pci": pci.value.decode(errors="replace").lower(),
            "total_rc": total_rc,
            "total": total.value,
            "info_rc": info_rc,
            "free": free_b.value,
            "info_total": total_b.value,
        })
    if fill:
        dev_i, chunk, cap = fill
        dev = ctypes.c_int(0)
        ctx = ctypes.c_void_p(0)
        rc = cu.cuDeviceGet(ctypes.byref(dev), dev_i)
        if rc == 0:
            rc = cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev)
        if rc == 0:
            rc = cu.cuCtxSetCurrent(ctx)
        ptrs, nbytes = [], 0
        while rc == 0 and nbytes < cap:
            p = ctypes.c_uint64(0)
            rc = cu.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(chunk))
            if rc == 0:
                ptrs.append(p.value)
                nbytes += chunk
        RESULT["fill"] = {"count": len(ptrs), "bytes": nbytes, "rc": rc}
        for p in ptrs:
            cu.cuMemFree_v2(ctypes.c_uint64(p))
    return cu


class NvmlMemory(ctypes.Structure):
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]


def nvml_info():
    out = {"loaded": False}
    RESULT["nvml"] = out
    nv, err = load(["libnvidia-ml.so.1", "libnvidia-ml.so"])
    if nv is None:
        out["error"] = err
        return
    out["loaded"] = True
    rc = nv.nvmlInit_v2()
    out["init_rc"] = rc
    if rc != 0:
        return
    n = ctypes.c_uint(0)
    out["count_rc"] = nv.nvmlDeviceGetCount_v2(ctypes.byref(n))
    out["count"] = n.value
    out["devices"] = []
    for i in range(n.value):
        h = ctypes.c_void_p(0)
        rc = nv.nvmlDeviceGetHandleByIndex_v2(i, ctypes.byref(h))
        uuid = ctypes.create_string_buffer(96)
        mem = NvmlMemory()
        if rc == 0:
            nv.nvmlDeviceGetUUID(h, uuid, 96)
            rc = nv.nvmlDeviceGetMemoryInfo(h, ctypes.byref(mem))
        out["devices"].append({"rc": rc, "uuid": uuid.value.decode(errors="replace"),
                               "total": mem.total, "used": mem.used, "free": mem.free})
    nv.nvmlShutdown()


def main(argv):
    fill = None
    with_nvml = True
    i = 0
    while i < len(argv):
        if argv[i] == "--no-nvml":
            with_nvml = False
        elif argv[i] == "--fill" and i + 1 < len(argv):
            fill = tuple(int(x) for x in argv[i + 1].split(":"))
            i += 1
        else:
            print("usage: cuda_info.py [--no-nvml] [--fill DEV:CHUNK:CAP]", file=sys.stderr)
            return 64
        i += 1
    driver_info(fill)
    if with_nvml:
        nvml_info()
    print("RESULT " + json.dumps(RESULT), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
