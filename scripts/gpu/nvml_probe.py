"""gpu-validate: what pynvml (nvidia-ml-py) shows. Prints `RESULT {json}`:
count, devices [{index, uuid, name, pci, total, used, free, by_uuid}] where by_uuid says whether
nvmlDeviceGetHandleByUUID(uuid) finds the same device again.
"""
import json
import sys

RESULT = {}


def text(v):
    return v.decode(errors="replace") if isinstance(v, bytes) else str(v)


def err(e):
    return "%s: %s" % (type(e).__name__, str(e).strip()[:300])


def main():
    try:
        import pynvml
    except Exception as e:
        RESULT["import_error"] = err(e)
        print("RESULT " + json.dumps(RESULT), flush=True)
        return 0
    try:
        pynvml.nvmlInit()
        RESULT["count"] = pynvml.nvmlDeviceGetCount()
        devices = []
        for i in range(RESULT["count"]):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            d = {"index": i, "uuid": text(pynvml.nvmlDeviceGetUUID(h)), "name": text(pynvml.nvmlDeviceGetName(h))}
            try:
                d["pci"] = text(pynvml.nvmlDeviceGetPciInfo(h).busId)
            except Exception as e:
                d["pci_error"] = err(e)
            m = pynvml.nvmlDeviceGetMemoryInfo(h)
            d["total"], d["used"], d["free"] = int(m.total), int(m.used), int(m.free)
            try:
                d["by_uuid"] = pynvml.nvmlDeviceGetIndex(pynvml.nvmlDeviceGetHandleByUUID(d["uuid"])) == i
            except Exception as e:
                d["by_uuid"] = err(e)
            devices.append(d)
        RESULT["devices"] = devices
        pynvml.nvmlShutdown()
    except Exception as e:
        RESULT["error"] = err(e)
    print("RESULT " + json.dumps(RESULT), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
