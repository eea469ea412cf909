"""A compute workload of real PyTorch ops: `x = x * 1.0001` on a CUDA tensor, back to back.

Settings (environment):
  LOAD_SECONDS  wall time to keep launching, from the first op (default 1.0)
  LOAD_DEVICE   the device ordinal (default 0)
  LOAD_SYNC     1: torch.cuda.synchronize() after every op (default 0)
  LOAD_ELEMS    elements of the tensor (default 1024)

Each op is one elementwise kernel launch; on the simulator with GPUSIM_KERNEL_NS=100000 each
kernel takes 100 us of simulated GPU time. Prints, like tests/c/compute_load.c,
`device=D launches=N` (N = ops issued), `wall_ns=W start_ns=S` (S = CLOCK_MONOTONIC ns at the
first op, W = ns from S until the device was synchronised) and `done=1`.
"""
import os
import time

import torch

seconds = float(os.environ.get("LOAD_SECONDS", "1.0"))
device = int(os.environ.get("LOAD_DEVICE", "0"))
sync = os.environ.get("LOAD_SYNC", "0") == "1"
elems = int(os.environ.get("LOAD_ELEMS", "1024"))

torch.cuda.set_device(device)
x = torch.ones(elems, device="cuda:%d" % device)
torch.cuda.synchronize()
ops = 0
start = time.monotonic_ns()
deadline = start + int(seconds * 1e9)
while time.monotonic_ns() < deadline:
    x = x * 1.0001
    ops += 1
    if sync:
        torch.cuda.synchronize()
torch.cuda.synchronize()
done = time.monotonic_ns()
print("device=%d launches=%d" % (device, ops))
print("wall_ns=%d start_ns=%d" % (done - start, start))
print("done=1")
