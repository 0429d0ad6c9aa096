#!/usr/bin/env python3
"""Builds gpuwarden's wheels that install without a C compiler: manylinux2014 x86_64 and aarch64.

The interposer (native/*.c) and triage's line parser (native/triage/lines.c, a CPython extension on the 3.11
limited API, so one build serves every CPython >= 3.11) are compiled once per architecture by zig's clang
against glibc 2.17 (PyPI's `ziglang` package, no system toolchain) and put into an otherwise ordinary wheel
tagged py3-none-manylinux2014_* (setup.py's PlatformWheel says why not cp311-abi3).

    python deploy/wheel/build.py [--out dist] [--arch x86_64 --arch aarch64]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ARCHES = ("x86_64", "aarch64")
GLIBC = "2.17"  # manylinux2014's baseline
LIMITED_API = "0x030B0000"  # the extension's stable ABI: CPython 3.11's (setup.py builds it with the same)
# What a wheel is built from: the rest of the checkout (tests, deploy, .venv) stays out of it.
SOURCES = ("pyproject.toml", "setup.py", "README.md", "CHANGELOG.md", "__init__.py", "__main__.py",
           "ops", "playbooks", "tui", "native")
# The same flags setup.py gives the system compiler, plus no debug info: the wheel ships the library stripped.
CFLAGS = ["-std=gnu11", "-O2", "-fPIC", "-fvisibility=hidden", "-Wall", "-Wextra", "-g0", "-s"]


def version() -> str:
    """ops/__init__.py's __version__, the one place it is written."""
    for line in (REPO / "ops" / "__init__.py").read_text().splitlines():
        if line.startswith("__version__"):
            return line.split("=", 1)[1].strip().strip("\"'")
    raise SystemExit("ops/__init__.py has no __version__")


def zig_cc() -> list[str]:
    try:
        # deferred: optional extra [test] (the wheel build's compiler); the ImportError below says how to get it
        import ziglang  # noqa: F401
    except ImportError:
        raise SystemExit("the wheels are cross-built with zig: pip install ziglang (the test extra has it)") from None
    return [sys.executable, "-m", "ziglang", "cc"]


def build_library(arch: str, dest: Path) -> Path:
    """libgwpreload.so for `arch`, linked against glibc 2.17's symbol versions."""
    native = REPO / "native"
    dest.parent.mkdir(parents=True, exist_ok=True)
    argv = [*zig_cc(), "-target", f"{arch}-linux-gnu.{GLIBC}", "-shared", *CFLAGS, f"-I{native}",
            *map(str, sorted(native.glob("*.c"))), "-ldl", "-lpthread", "-Wl,-z,now", "-o", str(dest)]
    # zig keeps its compile cache under the user's cache dir; a read-only HOME (CI) must not stop it
    env = {**os.environ, "ZIG_GLOBAL_CACHE_DIR": os.environ.get(
        "ZIG_GLOBAL_CACHE_DIR", str(Path(tempfile.gettempdir()) / "gpuwarden-zig-cache"))}
    subprocess.run(argv, check=True, env=env)
    return dest


def build_triage(arch: str, dest: Path) -> Path:
    """ops/triage/_lines.abi3.so for `arch`. The limited API's headers are the same on every architecture, so
    this Python's own (its pyconfig.h is x86_64's or aarch64's; both are LP64 Linux: the same sizes) serve both;
    the extension links no libpython, as CPython extensions on Linux never do."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    argv = [*zig_cc(), "-target", f"{arch}-linux-gnu.{GLIBC}", "-shared", "-std=gnu11", "-O2", "-fPIC", "-Wall",
            "-Wextra", "-g0", "-s", f"-DPy_LIMITED_API={LIMITED_API}", f"-I{sysconfig.get_paths()['include']}",
            str(REPO / "native" / "triage" / "lines.c"), "-o", str(dest)]
    env = {**os.environ, "ZIG_GLOBAL_CACHE_DIR": os.environ.get(
        "ZIG_GLOBAL_CACHE_DIR", str(Path(tempfile.gettempdir()) / "gpuwarden-zig-cache"))}
    subprocess.run(argv, check=True, env=env)
    return dest


def _source_tree(into: Path) -> Path:
    into.mkdir(parents=True)
    for name in SOURCES:
        src = REPO / name
        if src.is_dir():
            shutil.copytree(src, into / name, ignore=shutil.ignore_patterns("__pycache__", "*.so", "*.pyc"))
        elif src.is_file():
            shutil.copy2(src, into / name)
    return into


def build_wheel(arch: str, out: Path, *, isolated: bool = True) -> Path:
    """The manylinux2014 wheel for `arch`, in `out`. isolated=False builds with this Python's own setuptools
    (pip's --no-build-isolation: no fresh build environment per wheel; the tests do that)."""
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f"gpuwarden-wheel-{arch}-") as tmp:
        tree = _source_tree(Path(tmp) / "src")
        lib = build_library(arch, Path(tmp) / "lib" / "libgwpreload.so")
        triage = build_triage(arch, Path(tmp) / "lib" / "_lines.abi3.so")
        env = {**os.environ, "GPUWARDEN_PRELOAD_PREBUILT": str(lib), "GPUWARDEN_TRIAGE_PREBUILT": str(triage),
               "GPUWARDEN_WHEEL_PLATFORM": f"manylinux2014_{arch}"}
        wheel = out / f"gpuwarden-{version()}-py3-none-manylinux2014_{arch}.whl"
        wheel.unlink(missing_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                        *(() if isolated else ("--no-build-isolation",)), "-w", str(out), str(tree)],
                       check=True, env=env)
    if not wheel.is_file():
        raise SystemExit(f"pip wheel did not make {wheel}")
    return wheel


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=REPO / "dist", help="where the wheels go (default: dist/)")
    ap.add_argument("--arch", action="append", choices=ARCHES, help="one architecture (repeatable; default both)")
    args = ap.parse_args(argv)
    for arch in args.arch or ARCHES:
        print(build_wheel(arch, args.out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
