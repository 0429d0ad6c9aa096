"""Builds gpuwarden's one native part during `pip install`: the registration interposer in native/.

It is an LD_PRELOAD library, not a Python extension: plain C, no Python headers or libpython, shipped
inside the package as ops/engines/libgwpreload.so. Everything else about the project is in pyproject.toml.

Two variables serve deploy/wheel/build.py, which makes the wheels that need no compiler:
GPUWARDEN_PRELOAD_PREBUILT names a library built beforehand (copied instead of compiled), and
GPUWARDEN_WHEEL_PLATFORM the wheel's platform tag (e.g. manylinux2014_aarch64). Without a C compiler an
install from source still succeeds, with everything but the interposer (ops/engines/preload.py says so).
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from pathlib import Path

from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext
from setuptools.errors import PlatformError

try:
    from setuptools.command.bdist_wheel import bdist_wheel
except ImportError:  # setuptools < 70.1 kept it in the wheel package
    try:
        from wheel.bdist_wheel import bdist_wheel
    except ImportError:  # `setup.py build_ext` run by hand: no wheel is made, nothing to tag
        bdist_wheel = None

NATIVE = Path("native")
LIBRARY = "gpuwarden.ops.engines.libgwpreload"


class BuildPreload(build_ext):
    """build_ext for one plain shared library: fixed file name, C compiler checked before it is used."""

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


class PlatformWheel(bdist_wheel or object):
    """One wheel for every CPython >= 3.11 on a platform: the only binary is the interposer, not an extension."""

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
    )],
    cmdclass={"build_ext": BuildPreload, **({"bdist_wheel": PlatformWheel} if bdist_wheel else {})},
)
