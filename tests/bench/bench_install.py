"""What installing gpuwarden costs a user, against `pip install nvitop` in the same run; the image's size; the CLI's
start inside the image against the host.

  - wheel size: gpuwarden's manylinux2014 x86_64 wheel (deploy/wheel/build.py) vs nvitop's wheel from the index;
  - install time: `pip install` of each into a fresh venv, binary wheels only (--only-binary :all:, CC pointing
    nowhere: no compiler can take part), same index and pip settings, pip's cache warmed by one untimed install
    of each first; the median of --runs;
  - image: gpuwarden:<version> built by deploy/container/build.py (its cached runtime stage), compressed and
    unpacked sizes;
  - `gpuwarden --version` inside the image (unshare + chroot, as the tests enter it) vs the host's install from
    the step above, with `true` through the same chroot as the entry's own cost.

    python tests/bench/bench_install.py [--runs 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import venv
from pathlib import Path

import benchlib

REPO = Path(__file__).resolve().parents[2]
PEER = "nvitop"


def _module(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _own_backend() -> bool:
    try:
        import setuptools
        import wheel  # noqa: F401
    except ImportError:
        return False
    return int(setuptools.__version__.split(".")[0]) >= 68


def _install_s(requirement: str, where: Path) -> float:
    """Seconds of `pip install requirement` into a fresh venv at `where` (venv creation not counted)."""
    shutil.rmtree(where, ignore_errors=True)
    venv.create(where, with_pip=True)
    env = {**os.environ, "CC": "/nonexistent/cc", "CXX": "/nonexistent/c++"}
    t = time.perf_counter()
    subprocess.run([str(where / "bin/python"), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                    "--only-binary", ":all:", requirement], check=True, env=env)
    return time.perf_counter() - t


def _times_s(argv: list[str], runs: int, env: dict | None = None) -> list[float]:
    out = []
    for i in range(runs + 1):
        t = time.perf_counter()
        subprocess.run(argv, check=True, capture_output=True, env=env)
        if i:  # the first is a warm-up (page cache)
            out.append(time.perf_counter() - t)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3, help="timed installs of each (default 3)")
    ap.add_argument("--cli-runs", type=int, default=10, help="timed --version runs on each side (default 10)")
    ap.add_argument("--json", type=Path, help="also write the figures here")
    args = ap.parse_args()
    wheelbuild = _module("gpuwarden_wheel_build", REPO / "deploy/wheel/build.py")
    container = _module("gpuwarden_container_build", REPO / "deploy/container/build.py")
    version = wheelbuild.version()
    print(benchlib.machine_line())
    out: dict[str, object] = {"machine": benchlib.machine(), "load_start": benchlib.load(), "version": version}
    with tempfile.TemporaryDirectory(prefix="gpuwarden-bench-install-") as tmp_s:
        tmp = Path(tmp_s)
        wheel = wheelbuild.build_wheel("x86_64", tmp / "dist", isolated=not _own_backend())
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check", "--no-deps",
                        "--only-binary", ":all:", "-d", str(tmp / "peer"), PEER], check=True)
        (peer_wheel,) = (tmp / "peer").glob("*.whl")
        sizes = {"gpuwarden": wheel.stat().st_size, PEER: peer_wheel.stat().st_size}
        print(f"wheel: {wheel.name} {sizes['gpuwarden'] / 1e3:.0f} KB; {peer_wheel.name} {sizes[PEER] / 1e3:.0f} KB "
              f"(ratio {sizes['gpuwarden'] / sizes[PEER]:.2f}x)")
        out["wheel_bytes"] = sizes

        # one untimed install of each: pip's cache then holds every wheel either needs
        for req in (str(wheel), PEER):
            _install_s(req, tmp / "warm")
        installs: dict[str, list[float]] = {"gpuwarden": [], PEER: []}
        for _ in range(args.runs):  # interleaved, so a load spike hits both
            installs["gpuwarden"].append(_install_s(str(wheel), tmp / "v-gw"))
            installs[PEER].append(_install_s(PEER, tmp / "v-peer"))
        med = {k: statistics.median(v) for k, v in installs.items()}
        print(f"install into a fresh venv (median of {args.runs}, warm cache, wheels only): gpuwarden "
              f"{med['gpuwarden']:.1f} s, {PEER} {med[PEER]:.1f} s (ratio {med['gpuwarden'] / med[PEER]:.2f}x)")
        out["install_s"] = installs

        if shutil.which("mmdebstrap") and shutil.which("umoci") and shutil.which("unshare"):
            root = container.rootfs(wheel, tmp / "image/root", container.default_cache(), container.default_pip_cache())
            container.oci(root, tmp / "image", version)
            compressed = container.image_size(tmp / "image/oci", version)
            unpacked = int(subprocess.run(["du", "-sb", str(root)], capture_output=True, text=True,
                                          check=True).stdout.split()[0])
            print(f"image gpuwarden:{version}: {compressed / 1e6:.1f} MB compressed, {unpacked / 1e6:.0f} MB unpacked")
            out["image_bytes"] = {"compressed": compressed, "unpacked": unpacked}
            argv, env = container.chroot_argv(root, "gpuwarden --version")
            inside = _times_s(argv, args.cli_runs, env)
            argv, env = container.chroot_argv(root, "true")
            entry = _times_s(argv, args.cli_runs, env)
            host = _times_s([str(tmp / "v-gw/bin/gpuwarden"), "--version"], args.cli_runs)
            m = {k: statistics.median(v) * 1e3 for k, v in (("image", inside), ("entry", entry), ("host", host))}
            print(f"gpuwarden --version (median of {args.cli_runs}): in the image {m['image']:.0f} ms (of which "
                  f"unshare+chroot {m['entry']:.0f} ms), on the host {m['host']:.0f} ms (ratio "
                  f"{m['image'] / m['host']:.2f}x; {(m['image'] - m['entry']) / m['host']:.2f}x without the entry)")
            out["version_ms"] = m
        else:
            print("image: skipped (needs mmdebstrap, umoci, unshare)")
    out["load_end"] = benchlib.load()
    print(f"load at the end: {out['load_end']}")
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
