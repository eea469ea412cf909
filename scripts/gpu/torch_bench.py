"""gpu-bench: training-step time of a small PyTorch model. Prints `RESULT {json}`.

    python3 torch_bench.py STEPS ROUNDS

A 3-layer MLP (1024 → 4096 → 4096 → 1024, batch 256, fp32, AdamW), 20 warm-up steps, then
ROUNDS timed rounds of STEPS steps each (synchronised before and after): step_ms has one
value per round. Steady-state training allocates from PyTorch's cache, so this shows what the
shim costs a real workload (nothing but the hooks on the few driver calls left).
"""
import json
import sys
import time


def main(argv):
    steps, rounds = int(argv[0]), int(argv[1])
    out = {}
    try:
        import torch
        out["torch"] = torch.__version__
        dev = "cuda:0"
        out["device"] = torch.cuda.get_device_name(0)
        torch.manual_seed(0)
        model = torch.nn.Sequential(
            torch.nn.Linear(1024, 4096), torch.nn.ReLU(),
            torch.nn.Linear(4096, 4096), torch.nn.ReLU(),
            torch.nn.Linear(4096, 1024)).to(dev)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        x = torch.randn(256, 1024, device=dev)
        y = torch.randn(256, 1024, device=dev)

        def step():
            opt.zero_grad(set_to_none=True)
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()

        for _ in range(20):
            step()
        torch.cuda.synchronize()
        out["step_ms"] = []
        for _ in range(rounds):
            t0 = time.perf_counter()
            for _ in range(steps):
                step()
            torch.cuda.synchronize()
            out["step_ms"].append((time.perf_counter() - t0) * 1000.0 / steps)
    except Exception as e:
        out["error"] = "%s: %s" % (type(e).__name__, str(e).strip()[:300])
    print("RESULT " + json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
