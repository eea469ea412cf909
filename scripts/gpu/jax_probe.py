"""gpu-validate: what an unmodified JAX program sees and can do. Prints `RESULT {json}`.

    python3 jax_probe.py prealloc BIG HOLD_MS   default settings (XLA preallocates its pool):
                                                memory_stats() of device 0, then one array of
                                                BIG bytes (expected to fail past a limit), then a
                                                small computation; sleeps HOLD_MS so a monitor
                                                can sample the process' device memory
    python3 jax_probe.py chunks CHUNK CAP       CHUNK-byte arrays until an error or CAP bytes
                                                (run with XLA_PYTHON_CLIENT_ALLOCATOR=platform and
                                                XLA_PYTHON_CLIENT_PREALLOCATE=false by the caller)

Errors are recorded with their type and first line (RESOURCE_EXHAUSTED is what XLA says for
out of memory); the process exits 0 whatever happened, unless Python itself dies.
"""
import json
import sys
import time

RESULT = {}


def err(e):
    text = str(e).strip()
    return "%s: %s" % (type(e).__name__, text.splitlines()[0][:300] if text else "")


def devices(jax):
    RESULT["jax"] = jax.__version__
    devs = jax.devices()
    RESULT["devices"] = [{"platform": d.platform, "kind": getattr(d, "device_kind", "")} for d in devs]
    return devs


def stats(dev):
    try:
        s = dev.memory_stats() or {}
        return {k: int(v) for k, v in s.items() if isinstance(v, (int, float))}
    except Exception as e:
        return {"error": err(e)}


def prealloc(jax, big, hold_ms):
    import jax.numpy as jnp
    devs = devices(jax)
    RESULT["stats_before"] = stats(devs[0])
    try:
        x = jnp.zeros((big // 4,), dtype=jnp.float32)
        x.block_until_ready()
        RESULT["big"] = "ok"
        del x
    except Exception as e:
        RESULT["big"] = err(e)
    try:
        RESULT["small"] = float(jnp.ones(1024, dtype=jnp.float32).sum())
    except Exception as e:
        RESULT["small"] = err(e)
    RESULT["stats_after"] = stats(devs[0])
    print("HOLDING", flush=True)
    time.sleep(hold_ms / 1000.0)


def chunks(jax, chunk, cap):
    import jax.numpy as jnp
    devs = devices(jax)
    arrays, outcome = [], "cap"
    try:
        while len(arrays) * chunk < cap:
            a = jnp.zeros((chunk // 4,), dtype=jnp.float32)
            a.block_until_ready()
            arrays.append(a)
    except Exception as e:
        outcome = err(e)
    RESULT["count"] = len(arrays)
    RESULT["bytes"] = len(arrays) * chunk
    RESULT["outcome"] = outcome
    del arrays
    try:
        RESULT["small"] = float(jnp.ones(1024, dtype=jnp.float32).sum())
    except Exception as e:
        RESULT["small"] = err(e)
    RESULT["stats_after"] = stats(devs[0])


def main(argv):
    try:
        import jax
    except Exception as e:
        RESULT["import_error"] = err(e)
        print("RESULT " + json.dumps(RESULT), flush=True)
        return 0
    try:
        if argv[0] == "prealloc":
            prealloc(jax, int(argv[1]), int(argv[2]))
        elif argv[0] == "chunks":
            chunks(jax, int(argv[1]), int(argv[2]))
        else:
            print("usage: jax_probe.py prealloc BIG HOLD_MS | chunks CHUNK CAP", file=sys.stderr)
            return 64
    except Exception as e:
        RESULT["error"] = err(e)
    print("RESULT " + json.dumps(RESULT), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
