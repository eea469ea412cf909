"""gpu-validate: what an unmodified CuPy program sees and can do. Prints `RESULT {json}`.

    python3 cupy_probe.py POOL CHUNK CAP    POOL = default | async (cupy.cuda.MemoryAsyncPool):
                                            device count, totalGlobalMem and memGetInfo of
                                            device 0; CHUNK-byte arrays until OutOfMemoryError or
                                            CAP bytes; free everything; fill again (pass1, pass2)
"""
import json
import sys

RESULT = {}


def err(e):
    text = str(e).strip()
    return "%s: %s" % (type(e).__name__, text.splitlines()[0][:300] if text else "")


def fill_once(cp, pool, chunk, cap):
    arrays, outcome = [], "cap"
    try:
        while len(arrays) * chunk < cap:
            arrays.append(cp.empty(chunk, dtype=cp.uint8))
        cp.cuda.Device(0).synchronize()
    except cp.cuda.memory.OutOfMemoryError as e:
        outcome = "oom"
        RESULT.setdefault("oom_messages", []).append(err(e))
    except cp.cuda.runtime.CUDARuntimeError as e:
        # MemoryAsyncPool may surface the runtime's error instead of OutOfMemoryError
        outcome = "oom-runtime" if "cudaErrorMemoryAllocation" in str(e) else "error " + err(e)
        RESULT.setdefault("oom_messages", []).append(err(e))
    except Exception as e:
        outcome = "error " + err(e)
    r = {"count": len(arrays), "bytes": len(arrays) * chunk, "outcome": outcome}
    del arrays
    cp.cuda.Device(0).synchronize()
    pool.free_all_blocks()
    return r


def main(argv):
    try:
        import cupy as cp
    except Exception as e:
        RESULT["import_error"] = err(e)
        print("RESULT " + json.dumps(RESULT), flush=True)
        return 0
    try:
        kind, chunk, cap = argv[0], int(argv[1]), int(argv[2])
        RESULT["cupy"] = cp.__version__
        RESULT["count"] = cp.cuda.runtime.getDeviceCount()
        RESULT["total"] = int(cp.cuda.runtime.getDeviceProperties(0)["totalGlobalMem"])
        free, total = cp.cuda.runtime.memGetInfo()
        RESULT["mem_free"], RESULT["mem_total"] = int(free), int(total)
        if kind == "async":
            pool = cp.cuda.MemoryAsyncPool()
        else:
            pool = cp.get_default_memory_pool()
        cp.cuda.set_allocator(pool.malloc)
        RESULT["pass1"] = fill_once(cp, pool, chunk, cap)
        RESULT["pass2"] = fill_once(cp, pool, chunk, cap)
        RESULT["small"] = float(cp.arange(1024, dtype=cp.float32).sum())
    except Exception as e:
        RESULT["error"] = err(e)
    print("RESULT " + json.dumps(RESULT), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
