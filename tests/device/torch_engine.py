"""An unmodified PyTorch engine for tests/device/preload_torch.sh: no gpuwarden code in it at all.

Maps the arena file MAP_SHARED, starts CUDA (a real engine loads its model first), registers the whole mapping
with torch.cuda.cudart().cudaHostRegister (Portable|Mapped, as the incident's engines did), prints "serving",
and waits for SIGTERM; then unregisters and exits 0. Usage: python3 torch_engine.py ARENA_FILE
"""

import ctypes
import mmap
import os
import signal
import sys
import time

import torch

PORTABLE_MAPPED = 1 | 2  # cudaHostRegisterPortable | cudaHostRegisterMapped
stop = False


def on_term(signum, frame):
    global stop
    stop = True


signal.signal(signal.SIGTERM, on_term)
fd = os.open(sys.argv[1], os.O_RDWR)
size = os.fstat(fd).st_size
arena = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
base = ctypes.addressof(ctypes.c_char.from_buffer(arena))
torch.zeros(1, device="cuda")
cudart = torch.cuda.cudart()
print(f"pid {os.getpid()} registering {size} bytes at {base:#x}", flush=True)
started = time.monotonic()
err = int(cudart.cudaHostRegister(base, size, PORTABLE_MAPPED))
print(f"cudaHostRegister returned {err} after {time.monotonic() - started:.3f}s", flush=True)
if err != 0:
    sys.exit(3)
print("serving", flush=True)
while not stop:
    signal.pause()
print(f"cudaHostUnregister returned {int(cudart.cudaHostUnregister(base))}", flush=True)
