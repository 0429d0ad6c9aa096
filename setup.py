"""Builds gpuwarden's two native parts during `pip install`; everything else about the project is in pyproject.toml.

- The registration interposer (native/*.c): an LD_PRELOAD library, not a Python extension: plain C, no Python
  headers or libpython, shipped inside the package as ops/engines/libgwpreload.so.
- Triage's line parser (native/triage/lines.c): a CPython extension on the limited API (one .abi3.so for every
  CPython >= 3.11), ops/triage/_lines. Optional: ops/triage/lineparse.py falls back to the pure-Python parser,
  which gives the same results, when it is not there (a failed build says so and the install goes on).

Variables that serve deploy/wheel/build.py, which makes the wheels that need no compiler:
GPUWARDEN_PRELOAD_PREBUILT and GPUWARDEN_TRIAGE_PREBUILT name libraries built beforehand (copied instead of
compiled), GPUWARDEN_WHEEL_PLATFORM the wheel's platform tag (e.g. manylinux2014_aarch64). Without a C compiler
an install from source still succeeds, with everything but the interposer (ops/engines/preload.py says so)
and with triage's pure-Python parser.
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from pathlib import Path

from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext
from setuptools.errors import CCompilerError, CompileError, LinkError, PlatformError

try:
    from setuptools.command.bdist_wheel import bdist_wheel
except ImportError:  # setuptools < 70.1 kept it in the wheel package
    try:
        from wheel.bdist_wheel import bdist_wheel
    except ImportError:  # `setup.py build_ext` run by hand: no wheel is made, nothing to tag
        bdist_wheel = None

NATIVE = Path("native")
LIBRARY = "gpuwarden.ops.engines.libgwpreload"
TRIAGE = "gpuwarden.ops.triage._lines"
LIMITED_API = "0x030B0000"  # CPython 3.11's stable ABI: the oldest Python gpuwarden supports


class BuildPreload(build_ext):
    """build_ext for the plain shared library (fixed file name) and the optional triage extension; the C
    compiler is checked before either is built."""

    def get_ext_filename(self, fullname: str) -> str:
        # Asked with the full dotted name and with its last part alone; both mean plain "lib*.so".
        if fullname.split(".")[-1] == LIBRARY.split(".")[-1]:
            return os.path.join(*fullname.split(".")) + ".so"
        return super().get_ext_filename(fullname)

    def get_libraries(self, ext: Extension) -> list[str]:
        return list(ext.libraries)  # never libpython: engines that are not Python load it too

    def get_export_symbols(self, ext: Extension) -> list[str]:
        return []

    def build_extension(self, ext: Extension) -> None:
        if ext.name == TRIAGE:
            self._build_triage(ext)
            return
        if not sys.platform.startswith("linux"):
            raise PlatformError("gpuwarden's registration interposer (native/) is Linux-only; "
                                "gpuwarden itself needs Linux (/proc, KFD, flock)")
        target = self.get_ext_fullpath(ext.name)
        prebuilt = os.environ.get("GPUWARDEN_PRELOAD_PREBUILT")
        if prebuilt:
            os.makedirs(os.path.dirname(target), exist_ok=True)
            shutil.copyfile(prebuilt, target)
            os.chmod(target, 0o755)
            return
        compiler = shlex.split(os.environ["CC"])[0] if os.environ.get("CC") else self.compiler.compiler_so[0]
        if shutil.which(compiler) is None:
            # Everything else works without it; progress = "preload", launch and doctor say what is missing.
            print(f"warning: no C compiler ({compiler!r} not found): gpuwarden is installed without its "
                  "registration interposer (progress = \"preload\"). Install the manylinux wheel, which has it "
                  "prebuilt, or install gcc and reinstall.", file=sys.stderr)
            return
        super().build_extension(ext)

    def _build_triage(self, ext: Extension) -> None:
        """Triage's compiled line parser, or a warning: the pure-Python parser gives the same results, slower."""
        target = self.get_ext_fullpath(ext.name)
        prebuilt = os.environ.get("GPUWARDEN_TRIAGE_PREBUILT")
        if prebuilt:
            os.makedirs(os.path.dirname(target), exist_ok=True)
            shutil.copyfile(prebuilt, target)
            return
        compiler = shlex.split(os.environ["CC"])[0] if os.environ.get("CC") else self.compiler.compiler_so[0]
        why = f"no C compiler ({compiler!r} not found)" if shutil.which(compiler) is None else None
        if why is None:
            try:
                super().build_extension(ext)
                return
            except (CCompilerError, CompileError, LinkError, OSError) as e:
                why = f"its build failed ({e})"
        print(f"warning: triage's compiled line parser was not built: {why}. gpuwarden works without it (the "
              "pure-Python parser gives the same findings, with more CPU on a big log); the manylinux wheel has "
              "it prebuilt.", file=sys.stderr)


class PlatformWheel(bdist_wheel or object):
    """One wheel for every CPython >= 3.11 on a platform. Tagged py3-none, not cp311-abi3: the interposer serves
    any Python, and an interpreter that cannot load the abi3 extension (PyPy, free-threaded builds) imports
    the package all the same and takes triage's pure-Python parser (ops/triage/lineparse.py)."""

    def finalize_options(self) -> None:
        super().finalize_options()
        self.root_is_pure = False

    def get_tag(self) -> tuple[str, str, str]:
        platform = os.environ.get("GPUWARDEN_WHEEL_PLATFORM") or super().get_tag()[2]
        return "py3", "none", platform


setup(
    # find_packages sees ops, playbooks and tui as the folders name them; installed they are gpuwarden's.
    packages=[f"gpuwarden.{name}" for name in find_packages(include=["ops*", "playbooks*", "tui*"])],
    ext_modules=[Extension(
        LIBRARY,
        sources=sorted(str(p) for p in NATIVE.glob("*.c")),
        depends=[str(NATIVE / "gwpreload.h")],
        include_dirs=[str(NATIVE)],
        libraries=["dl", "pthread"],
        extra_compile_args=["-std=gnu11", "-O2", "-fvisibility=hidden", "-Wall", "-Wextra"],
        extra_link_args=["-Wl,-z,now"],
    ), Extension(
        TRIAGE,
        sources=[str(NATIVE / "triage" / "lines.c")],
        define_macros=[("Py_LIMITED_API", LIMITED_API)],
        py_limited_api=True,
        extra_compile_args=["-std=gnu11", "-O2", "-Wall", "-Wextra"],
        optional=True,
    )],
    cmdclass={"build_ext": BuildPreload, **({"bdist_wheel": PlatformWheel} if bdist_wheel else {})},
)
