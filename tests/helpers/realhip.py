"""ROCm 5.4's real HIP runtime for the tests: libamdhip64.so and what it loads, from PyPI's pytorch-triton-rocm wheel.

`python tests/helpers/realhip.py fetch` (tests/run-all.sh runs it) downloads the wheel once with pip (169 MB), checks its
sha256, keeps only the eight libraries the runtime needs (about 160 MB unpacked, most of it libamd_comgr.so) under
.cache/rocm-5.4/ in the checkout (or $GPUWARDEN_TEST_ROCM_CACHE) and drops the wheel. The `real_hip` fixture
calls the same ensure(), so a plain `pytest` run fetches it too.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
REQUIREMENT = "pytorch-triton-rocm==2.1.0"
# The cp311 manylinux2014 x86_64 wheel, as PyPI served it (any Python can download it: --python-version).
WHEEL_SHA256 = "ec63623c16eebe356d40460a09374a2546591dd2b0cb2122622111fc4d0f7f25"
INSIDE = "triton/third_party/rocm/lib/"
# libamdhip64.so's DT_NEEDED closure within the wheel (the rest, libstdc++ and libz included, is the system's).
LIBRARIES = ("libamdhip64.so", "libhsa-runtime64.so", "libamd_comgr.so", "libnuma.so", "libdrm.so",
             "libdrm_amdgpu.so", "libelf.so", "libtinfo.so")
# A program linked with -l:libamdhip64.so records its SONAME; the libraries name each other unversioned.
SONAME_LINKS = {"libamdhip64.so.5": "libamdhip64.so"}
DONE = ".complete"


def cache_dir() -> Path:
    return Path(os.environ.get("GPUWARDEN_TEST_ROCM_CACHE") or REPO / ".cache" / "rocm-5.4")


def unsupported() -> str | None:
    """Why the real runtime cannot run here; None when it can."""
    if not sys.platform.startswith("linux") or platform.machine() != "x86_64":
        return f"the ROCm 5.4 wheel holds x86_64 Linux libraries only (this is {sys.platform}/{platform.machine()})"
    return None


def ready(where: Path) -> bool:
    try:
        done = json.loads((where / DONE).read_text())
    except (OSError, ValueError):
        return False
    return done.get("sha256") == WHEEL_SHA256 and all((where / n).is_file() for n in LIBRARIES)


def ensure(where: Path | None = None, say=lambda text: None) -> Path:
    """The directory holding the real libraries, fetching them first when they are not there."""
    where = where or cache_dir()
    if ready(where):
        return where
    where.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=where, prefix=".download-") as tmp:
        say(f"downloading {REQUIREMENT} (169 MB) with pip, for ROCm 5.4's libamdhip64.so")
        cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
               "--python-version", "3.11", "--implementation", "cp", "--abi", "cp311",
               "--platform", "manylinux2014_x86_64", REQUIREMENT, "-d", tmp]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        wheels = list(Path(tmp).glob("*.whl"))
        if done.returncode != 0 or len(wheels) != 1:
            raise RuntimeError(f"`{' '.join(cmd)}` failed (exit {done.returncode}): {done.stderr.strip()[-800:]}")
        digest = hashlib.sha256()
        with open(wheels[0], "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
        if digest.hexdigest() != WHEEL_SHA256:
            raise RuntimeError(f"{wheels[0].name} has sha256 {digest.hexdigest()}, not the {WHEEL_SHA256} it had "
                               "when these tests were written: not using it")
        with zipfile.ZipFile(wheels[0]) as z:
            for name in LIBRARIES:
                part = where / f".{name}.part"
                with z.open(INSIDE + name) as src, open(part, "wb") as dst:
                    shutil.copyfileobj(src, dst, 1 << 20)
                part.chmod(0o755)
                part.replace(where / name)
    for link, target in SONAME_LINKS.items():
        (where / link).unlink(missing_ok=True)
        (where / link).symlink_to(target)
    size = sum((where / n).stat().st_size for n in LIBRARIES)
    (where / DONE).write_text(json.dumps({"requirement": REQUIREMENT, "sha256": WHEEL_SHA256,
                                          "libraries": list(LIBRARIES), "bytes": size}) + "\n")
    say(f"kept {len(LIBRARIES)} libraries ({size / 1e6:.0f} MB) in {where}")
    return where


if __name__ == "__main__":
    if sys.argv[1:] != ["fetch"]:
        sys.exit("usage: python tests/helpers/realhip.py fetch")
    why = unsupported()
    if why:
        print(f"realhip: not fetched: {why}", file=sys.stderr)
        sys.exit(0)
    try:
        ensure(say=lambda text: print(f"realhip: {text}", file=sys.stderr))
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
        sys.exit(f"realhip: {exc}")
