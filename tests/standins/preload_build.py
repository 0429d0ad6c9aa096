"""Builds what the preload tests run, once per session, with the system C compiler (`cc`, or $CC).

From tests/standins/preload/: stand-in runtimes (libamdhip64.so, libcuda.so.1, libcudart.so.12), a library
engines dlopen with RTLD_DEEPBIND (libdeep.so), one laid out like libtorch_python.so (libtorchlike.so),
unmodified engine programs (one static; `pinned` allocates pinned host memory), and a second interposer.
"""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

SOURCES = Path(__file__).resolve().with_name("preload")
CTYPES_ENGINE = SOURCES / "engine_ctypes.py"

# (output, source, extra arguments); $ORIGIN run paths let each program find the stand-ins beside it.
TARGETS = (
    # Versioned hip_4.2, as ROCm's libamdhip64 is (dlvsym asks for that version).
    ("libamdhip64.so", "standin_hip.c", ["-shared", "-Wl,-soname,libamdhip64.so",
                                         f"-Wl,--version-script,{SOURCES / 'hip.map'}"]),
    ("libcuda.so.1", "standin_cuda.c", ["-shared", "-Wl,-soname,libcuda.so.1"]),
    ("libcudart.so.12", "standin_cudart.c", ["-shared", "-Wl,-soname,libcudart.so.12", "-Wl,-rpath,$ORIGIN", "-ldl"]),
    ("libdeep.so", "deep.c", ["-shared", "-Wl,-soname,libdeep.so", "-Wl,-rpath,$ORIGIN", "-L{out}", "-lamdhip64",
                              "-ldl"]),
    ("libnext.so", "next_interposer.c", ["-shared", "-ldl"]),
    ("libtorchlike.so", "torchlike.c", ["-shared", "-Wl,-soname,libtorchlike.so", "-Wl,-rpath,$ORIGIN", "-L{out}",
                                        "-l:libcudart.so.12"]),
    ("engine_linked", "engine.c", ["-DLINKED", "-Wl,-rpath,$ORIGIN", "-L{out}", "-lamdhip64", "-ldl"]),
    ("engine_dlopen", "engine.c", ["-Wl,-rpath,$ORIGIN", "-ldl"]),
    ("engine_static", "static_engine.c", ["-static"]),
    ("pinned_linked", "pinned.c", ["-DLINKED", "-Wl,-rpath,$ORIGIN", "-L{out}", "-lamdhip64", "-ldl"]),
    ("pinned", "pinned.c", ["-Wl,-rpath,$ORIGIN", "-ldl"]),
)


def build(out: Path) -> Path:
    """Compile every target into `out` (the order matters: libdeep and engine_linked link libamdhip64)."""
    out.mkdir(parents=True, exist_ok=True)
    cc = shlex.split(os.environ.get("CC") or "cc")
    for target, source, extra in TARGETS:
        cmd = [*cc, "-O1", "-Wall", "-fPIC", "-o", str(out / target), str(SOURCES / source),
               *(a.replace("{out}", str(out)) for a in extra)]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"building {target} failed: {' '.join(cmd)}\n{done.stderr}")
    return out
