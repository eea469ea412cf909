"""gpu-validate: what an unmodified PyTorch program sees and can do. Prints `RESULT {json}`.

    python3 torch_probe.py info                 counts, per device: name, uuid, total_memory,
                                                mem_get_info, and a kernel + copy (`touch`)
    python3 torch_probe.py fill CHUNK CAP       256 MiB tensors on cuda:0 until OutOfMemoryError
                                                or CAP bytes; free; fill again (pass1, pass2)
    python3 torch_probe.py train STEPS          a small MLP trained for STEPS steps on cuda:0
    python3 torch_probe.py pair CHUNK CAP       (virtual devices) tensors on cuda:0 and cuda:1,
                                                .to() between them, then a fill of each

The allocator is whatever PYTORCH_CUDA_ALLOC_CONF says (set by the caller). Every step
records its exception instead of dying, so the caller sees what happened.
"""
import json
import math
import sys
import time

RESULT = {}


def err(e):
    return "%s: %s" % (type(e).__name__, str(e).strip().splitlines()[0][:300] if str(e).strip() else "")


def counts(torch):
    RESULT["torch"] = torch.__version__
    RESULT["torch_cuda"] = torch.version.cuda
    RESULT["is_available"] = bool(torch.cuda.is_available())
    RESULT["device_count"] = torch.cuda.device_count()
    try:
        RESULT["cuda_device_count"] = torch._C._cuda_getDeviceCount()
    except Exception as e:  # the private name may move; device_count() is the public answer
        RESULT["cuda_device_count_error"] = err(e)
        RESULT["cuda_device_count"] = RESULT["device_count"]
    return max(RESULT["device_count"], RESULT["cuda_device_count"])


def info(torch):
    n = counts(torch)
    devices = []
    for i in range(n):
        d = {"index": i}
        devices.append(d)
        try:
            p = torch.cuda.get_device_properties(i)
            d["name"] = p.name
            d["uuid"] = str(getattr(p, "uuid", ""))
            d["total_memory"] = int(p.total_memory)
            free, total = torch.cuda.mem_get_info(i)
            d["mem_free"], d["mem_total"] = int(free), int(total)
        except Exception as e:
            d["error"] = err(e)
            continue
        try:  # a kernel, a reduction and a copy back: the runtime is really usable
            x = torch.arange(1 << 20, device="cuda:%d" % i, dtype=torch.float32)
            s = float((x * 2).sum().item())
            want = float((1 << 20) * ((1 << 20) - 1))
            y = x[:16].cpu().tolist()
            d["touch"] = "ok" if math.isclose(s, want, rel_tol=1e-6) and y == [float(k) for k in range(16)] else \
                "wrong result %r" % s
            torch.cuda.synchronize(i)
        except Exception as e:
            d["touch"] = err(e)
    RESULT["devices"] = devices


def fill_once(torch, chunk, cap, device="cuda:0"):
    tensors, outcome = [], "cap"
    try:
        while len(tensors) * chunk < cap:
            tensors.append(torch.empty(chunk, dtype=torch.uint8, device=device))
    except torch.cuda.OutOfMemoryError as e:
        outcome = "oom"
        RESULT.setdefault("oom_messages", []).append(str(e).splitlines()[0][:300])
    except Exception as e:
        outcome = "error " + err(e)
    idx = torch.device(device).index or 0
    r = {"count": len(tensors), "bytes": len(tensors) * chunk, "outcome": outcome,
         "reserved": int(torch.cuda.memory_reserved(idx))}
    try:
        free, total = torch.cuda.mem_get_info(idx)
        r["mem_free"], r["mem_total"] = int(free), int(total)
    except Exception as e:
        r["mem_error"] = err(e)
    del tensors
    torch.cuda.synchronize(idx)
    torch.cuda.empty_cache()
    return r


def fill(torch, chunk, cap):
    counts(torch)
    RESULT["pass1"] = fill_once(torch, chunk, cap)
    RESULT["pass2"] = fill_once(torch, chunk, cap)
    RESULT["max_reserved"] = int(torch.cuda.max_memory_reserved(0))


def train(torch, steps):
    counts(torch)
    torch.manual_seed(0)
    dev = "cuda:0"
    model = torch.nn.Sequential(
        torch.nn.Linear(512, 1024), torch.nn.ReLU(),
        torch.nn.Linear(1024, 1024), torch.nn.ReLU(),
        torch.nn.Linear(1024, 10)).to(dev)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x = torch.randn(256, 512, device=dev)
    y = torch.randint(0, 10, (256,), device=dev)
    losses = []
    t0 = time.perf_counter()
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        losses.append(float(loss.item()))
    torch.cuda.synchronize()
    RESULT["seconds"] = time.perf_counter() - t0
    RESULT["losses"] = losses
    RESULT["max_reserved"] = int(torch.cuda.max_memory_reserved(0))


def pair(torch, chunk, cap):
    info(torch)
    try:
        a = torch.arange(1024, device="cuda:0", dtype=torch.float32)
        b = a.to("cuda:1") * 3
        c = b.to("cuda:0")
        RESULT["copy"] = "ok" if torch.equal(c, a * 3) else "wrong result"
    except Exception as e:
        RESULT["copy"] = err(e)
    RESULT["fill0"] = fill_once(torch, chunk, cap, "cuda:0")
    RESULT["fill1"] = fill_once(torch, chunk, cap, "cuda:1")


def main(argv):
    try:
        import torch
    except Exception as e:
        RESULT["import_error"] = err(e)
        print("RESULT " + json.dumps(RESULT), flush=True)
        return 0
    cmd = argv[0] if argv else "info"
    try:
        if cmd == "info":
            info(torch)
        elif cmd == "fill":
            fill(torch, int(argv[1]), int(argv[2]))
        elif cmd == "train":
            train(torch, int(argv[1]))
        elif cmd == "pair":
            pair(torch, int(argv[1]), int(argv[2]))
        else:
            print("usage: torch_probe.py info|fill CHUNK CAP|train STEPS|pair CHUNK CAP", file=sys.stderr)
            return 64
    except Exception as e:
        RESULT["error"] = err(e)
    print("RESULT " + json.dumps(RESULT), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
