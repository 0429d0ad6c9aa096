"""An unmodified Python engine for the preload tests: registers SIZE bytes through ctypes (dlopen + dlsym).

Usage: engine_ctypes.py SIZE LIBDIR [hip|torchlike]; serves until SIGTERM, then unregisters and exits 0.
hip calls libamdhip64.so's hipHostRegister; torchlike calls into libtorchlike.so, which calls cudaHostRegister
itself, as torch.cuda.cudart().cudaHostRegister does from libtorch_python.so. STANDIN_GATHER=N: as engine.c.
"""

import ctypes
import os
import signal
import sys
import time

size, libdir = int(sys.argv[1]), sys.argv[2]
how = sys.argv[3] if len(sys.argv) > 3 else "hip"
stop = False


def on_term(signum, frame):
    global stop
    stop = True


signal.signal(signal.SIGTERM, on_term)
print(f"engine pid {os.getpid()} starting (ctypes {how})", flush=True)
if how == "torchlike":
    lib = ctypes.CDLL(os.path.join(libdir, "libtorchlike.so"))
    register, unregister = lib.torchlike_register, lib.torchlike_unregister
else:
    lib = ctypes.CDLL(os.path.join(libdir, "libamdhip64.so"))
    register, unregister = lib.hipHostRegister, lib.hipHostUnregister
register.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint]
unregister.argtypes = [ctypes.c_void_p]
arena = ctypes.create_string_buffer(4096)
if os.environ.get("STANDIN_GATHER") and os.environ.get("STANDIN_DIR"):
    here = os.environ["STANDIN_DIR"]
    open(os.path.join(here, f"ready-{os.getpid()}"), "w").close()
    deadline = time.monotonic() + 60
    while (sum(n.startswith("ready-") for n in os.listdir(here)) < int(os.environ["STANDIN_GATHER"])
           and time.monotonic() < deadline):
        time.sleep(0.01)
print(f"register returned {register(ctypes.addressof(arena), size, 0)}", flush=True)
print("session is up\nserving", flush=True)
while not stop:
    signal.pause()
print(f"unregister returned {unregister(ctypes.addressof(arena))}", flush=True)
