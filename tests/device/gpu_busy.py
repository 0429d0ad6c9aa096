"""A CUDA process busy about half the time (matmuls, then as long asleep), for the per-process utilisation checks.

Prints "busy" once its first kernels ran; runs until killed. Usage: python3 tests/device/gpu_busy.py [DUTY=0.5]
"""

import sys
import time

import torch

duty = float(sys.argv[1]) if len(sys.argv) > 1 else 0.5
a = torch.randn(4096, 4096, device="cuda")
torch.cuda.synchronize()
print("busy", flush=True)
while True:
    t = time.monotonic()
    while time.monotonic() - t < 0.1 * duty:
        a = a @ a
        a = a / a.norm()
        torch.cuda.synchronize()
    time.sleep(0.1 * (1 - duty))
