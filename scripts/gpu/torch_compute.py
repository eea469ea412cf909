"""gpu-validate, compute share: PyTorch workloads whose throughput shows the share of the GPU's
time a process gets. Prints `RESULT {json}`.

    python3 torch_compute.py matmul SECONDS [START_AT]   # fp16 4096x4096 matmuls
    python3 torch_compute.py graph SECONDS               # a CUDA graph of 8 matmuls, replayed
    python3 torch_compute.py launches SECONDS            # tiny kernels (a 1-element add)
    python3 torch_compute.py green SECONDS               # two threads doing matmuls

Each warms up (and, given START_AT, seconds since the epoch, waits for it, so that two processes
run side by side), then works for SECONDS, synchronising every batch: `marks` holds one
[time since the epoch, work items done] pair per batch, from which the harness takes the rate
over any window (the pacer's promise holds over windows of 2 s and more after the first
second). `sms` is the SM count PyTorch sees (`multi_processor_count`).
"""
import json
import os
import sys
import threading
import time

N = 4096
BATCH = 16


def run(kind, seconds, start_at):
    import torch
    out = {"torch": torch.__version__, "pid": os.getpid(), "kind": kind}
    dev = torch.device("cuda:0")
    props = torch.cuda.get_device_properties(0)
    out["device"], out["sms"] = props.name, props.multi_processor_count
    a = torch.randn(N, N, device=dev, dtype=torch.float16)
    b = torch.randn(N, N, device=dev, dtype=torch.float16)
    c = torch.empty(N, N, device=dev, dtype=torch.float16)
    one = torch.zeros(1, device=dev)

    if kind == "matmul":
        def batch():
            for _ in range(BATCH):
                torch.matmul(a, b, out=c)
            return BATCH
    elif kind == "graph":
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):  # warm-up on a side stream, as torch.cuda.graphs asks
                torch.matmul(a, b, out=c)
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for _ in range(8):
                torch.matmul(a, b, out=c)

        def batch():
            for _ in range(BATCH // 8):
                g.replay()
            return BATCH  # matmuls
    elif kind == "launches":
        def batch():
            for _ in range(1000):
                one.add_(1.0)
            return 1000
    elif kind == "green":
        return green(torch, out, a, b, seconds)
    else:
        raise SystemExit("unknown workload %r" % kind)

    for _ in range(3):
        batch()
    torch.cuda.synchronize()
    if start_at:
        time.sleep(max(0.0, start_at - time.time()))
    marks, done = [[time.time(), 0]], 0
    end = time.time() + seconds
    while time.time() < end:
        done += batch()
        torch.cuda.synchronize()
        marks.append([time.time(), done])
    out["marks"] = marks
    out["done"] = done
    out["rate"] = done / (marks[-1][0] - marks[0][0])
    return out


def green(torch, out, a, b, seconds):
    """Two threads, each with its own stream, doing matmuls; what each got done."""
    counts, errors = [0, 0], []
    end = time.time() + seconds

    def work(k):
        try:
            with torch.cuda.stream(torch.cuda.Stream()):
                x = torch.empty_like(a)
                while time.time() < end:
                    for _ in range(BATCH):
                        torch.matmul(a, b, out=x)
                    torch.cuda.current_stream().synchronize()
                    counts[k] += BATCH
        except Exception as e:  # recorded: what happens is the finding
            errors.append("thread %d: %s: %s" % (k, type(e).__name__, str(e).strip()[:300]))

    t0 = time.time()
    threads = [threading.Thread(target=work, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    out["threads"] = counts
    out["rate"] = sum(counts) / (time.time() - t0)
    out["sms_after"] = torch.cuda.get_device_properties(0).multi_processor_count
    if errors:
        out["error"] = "; ".join(errors)
    return out


def main(argv):
    kind, seconds = argv[0], float(argv[1])
    start_at = float(argv[2]) if len(argv) > 2 else None
    try:
        out = run(kind, seconds, start_at)
    except ImportError as e:
        out = {"import_error": str(e)}
    except Exception as e:
        out = {"error": "%s: %s" % (type(e).__name__, str(e).strip()[:300])}
    print("RESULT " + json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
