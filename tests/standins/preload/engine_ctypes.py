"""An unmodified Python engine for the preload tests: registers SIZE bytes through ctypes (dlopen + dlsym).

Usage: engine_ctypes.py SIZE LIBDIR; serves until SIGTERM, then unregisters and exits 0.
"""

import ctypes
import os
import signal
import sys

size, libdir = int(sys.argv[1]), sys.argv[2]
stop = False


def on_term(signum, frame):
    global stop
    stop = True


signal.signal(signal.SIGTERM, on_term)
print(f"engine pid {os.getpid()} starting (ctypes)", flush=True)
hip = ctypes.CDLL(os.path.join(libdir, "libamdhip64.so"))
hip.hipHostRegister.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint]
hip.hipHostUnregister.argtypes = [ctypes.c_void_p]
arena = ctypes.create_string_buffer(4096)
print(f"register returned {hip.hipHostRegister(ctypes.addressof(arena), size, 0)}", flush=True)
print("session is up\nserving", flush=True)
while not stop:
    signal.pause()
print(f"unregister returned {hip.hipHostUnregister(ctypes.addressof(arena))}", flush=True)
