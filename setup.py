"""Builds gpuwarden's one native part during `pip install`: the registration interposer in native/.

It is an LD_PRELOAD library, not a Python extension: plain C, no Python headers or libpython, shipped
inside the package as ops/engines/libgwpreload.so. Everything else about the project is in pyproject.toml.
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
        compiler = shlex.split(os.environ["CC"])[0] if os.environ.get("CC") else self.compiler.compiler_so[0]
        if shutil.which(compiler) is None:
            raise PlatformError(
                f"gpuwarden needs a C compiler to build its LD_PRELOAD gate (native/), and {compiler!r} "
                "was not found: install one (Debian/Ubuntu: apt-get install gcc; RHEL/Fedora: dnf install gcc) "
                "or name it with CC=..., then run the install again")
        super().build_extension(ext)


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
    cmdclass={"build_ext": BuildPreload},
)
