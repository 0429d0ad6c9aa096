"""What installing gpuwarden costs a user, against `pip install nvitop` in the same run; the image's size; the CLI's
start inside the image against the host.

  - wheel size: gpuwarden's manylinux2014 x86_64 wheel (deploy/wheel/build.py) vs nvitop's wheel from the index;
  - install time: `pip install` of each into a fresh venv, binary wheels only (--only-binary :all:, CC pointing
    nowhere: no compiler can take part), same index and pip settings, pip's cache warmed by one untimed install
    of each first; the median of --runs; the base install (`gpuwarden`), `gpuwarden[all]` and nvitop;
  - what each install leaves: distributions and site-packages MB (bytecode included, as pip leaves it), both
    without the venv's own pip and setuptools; checked against issue 36's targets (base <= 30 distributions,
    <= 70 MB, install wall <= 3x nvitop's);
  - the Kubernetes client (--clients): the official `kubernetes` against `lightkube`, each alone in a fresh venv:
    distributions, MB, and the import of what gpuwarden would use (median of 5 fresh interpreters);
  - image: gpuwarden:<version> built by deploy/container/build.py (its cached runtime stage), compressed and
    unpacked sizes;
  - `gpuwarden --version` inside the image (unshare + chroot, as the tests enter it) vs the host's install from
    the step above, with `true` through the same chroot as the entry's own cost.

    python tests/bench/bench_install.py [--runs 3] [--no-image] [--clients] [--json out.json]
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


# The venv's own installer, not what the package brought (venv.create(with_pip=True) puts them there).
OWN = ("pip", "setuptools", "_distutils_hack", "pkg_resources", "distutils-precedence.pth")
TARGETS = {"distributions": 30, "mb": 70.0, "wall_ratio": 3.0}  # issue 36


def _site(where: Path) -> Path:
    return next((where / "lib").glob("python3*/site-packages"))


def installed(where: Path) -> dict[str, float]:
    """Distributions and site-packages MB in the venv at `where`, the venv's pip and setuptools left out."""
    site = _site(where)
    dists = [d for d in site.glob("*.dist-info") if not d.name.startswith(("pip-", "setuptools-"))]
    size = 0
    for entry in site.iterdir():
        if entry.name.startswith(OWN) and (entry.name in OWN or entry.name.startswith(("pip-", "setuptools-"))):
            continue
        if entry.is_file():
            size += entry.stat().st_size
            continue
        for root, _, files in os.walk(entry):
            size += sum(os.lstat(os.path.join(root, f)).st_size for f in files)
    return {"distributions": len(dists), "mb": size / 1e6}


# What gpuwarden imports of each client: core (nodes, pods, evictions), coordination (Leases), events, and
# resource.k8s.io (DRA: ResourceSlice, DeviceTaintRule) -- lightkube through its models or a generic resource.
CLIENT_IMPORTS = {
    "kubernetes": "import kubernetes.client, kubernetes.config; kubernetes.client.CoreV1Api; "
                  "kubernetes.client.CoordinationV1Api; kubernetes.client.EventsV1Api; "
                  "getattr(kubernetes.client, 'ResourceV1beta1Api', None)",
    # What ops/k8s/kube.py imports since the port: the client core, the types that route its calls, generics.
    "lightkube": "import lightkube.core.generic_client, lightkube.config.kubeconfig, lightkube.generic_resource; "
                 "from lightkube.resources.core_v1 import Event, Node, NodeStatus, Pod, PodEviction; "
                 "from lightkube.resources.coordination_v1 import Lease; "
                 "from lightkube.core.resource_registry import resource_registry; "
                 "resource_registry.load('resource.k8s.io/v1', 'DeviceTaintRule'); "
                 "resource_registry.load('resource.k8s.io/v1', 'ResourceSlice')",
}
CLIENT_GROUPS = ("core_v1", "coordination_v1", "events_v1", "resource_v1", "resource_v1beta1", "resource_v1beta2",
                 "resource_v1alpha3")


def clients(tmp: Path, runs: int = 5) -> dict[str, dict[str, object]]:
    out: dict[str, dict[str, object]] = {}
    for name, code in CLIENT_IMPORTS.items():
        where = tmp / f"client-{name}"
        wall = _install_s(name, where)
        py = str(where / "bin/python")
        probe = f"import time; t = time.perf_counter(); {code}; print(time.perf_counter() - t)"
        imports = [float(subprocess.run([py, "-c", probe], capture_output=True, text=True, check=True).stdout)
                   for _ in range(runs + 1)][1:]
        version = subprocess.run([py, "-c", f"import importlib.metadata as m; print(m.version({name!r}))"],
                                 capture_output=True, text=True, check=True).stdout.strip()
        if name == "lightkube":
            have = "import importlib.util as u; print(' '.join(g for g in {!r} if u.find_spec('lightkube.resources.' + g)))"
        else:
            have = ("import kubernetes.client as c; names = {{'core_v1': 'CoreV1Api', 'coordination_v1': "
                    "'CoordinationV1Api', 'events_v1': 'EventsV1Api', 'resource_v1': 'ResourceV1Api', "
                    "'resource_v1beta1': 'ResourceV1beta1Api', 'resource_v1beta2': 'ResourceV1beta2Api', "
                    "'resource_v1alpha3': 'ResourceV1alpha3Api'}}; "
                    "print(' '.join(g for g in {!r} if hasattr(c, names[g])))")
        groups = subprocess.run([py, "-c", have.format(CLIENT_GROUPS)], capture_output=True, text=True,
                                check=True).stdout.split()
        out[name] = {"version": version, "install_s": wall, "import_ms": statistics.median(imports) * 1e3,
                     "groups": groups, **installed(where)}
        print(f"client {name} {version}: {out[name]['distributions']} distributions, {out[name]['mb']:.1f} MB, "
              f"install {wall:.1f} s, import {out[name]['import_ms']:.0f} ms (median of {runs}); "
              f"API groups with typed models: {' '.join(groups) or '-'}")
    return out


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
    ap.add_argument("--no-image", action="store_true", help="skip the image and the in-image --version")
    ap.add_argument("--clients", action="store_true", help="also compare the Kubernetes clients")
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
        wanted = {"gpuwarden": str(wheel), "gpuwarden[all]": f"{wheel}[all]", PEER: PEER}
        for req in wanted.values():
            _install_s(req, tmp / "warm")
        installs: dict[str, list[float]] = {k: [] for k in wanted}
        left: dict[str, dict[str, float]] = {}
        for _ in range(args.runs):  # interleaved, so a load spike hits all
            for key, req in wanted.items():
                where = tmp / f"v-{key}"
                installs[key].append(_install_s(req, where))
                left[key] = installed(where)
        med = {k: statistics.median(v) for k, v in installs.items()}
        print(f"install into a fresh venv (median of {args.runs}, warm cache, wheels only):")
        for key in wanted:
            print(f"  {key}: {med[key]:.1f} s ({med[key] / med[PEER]:.2f}x {PEER}), "
                  f"{left[key]['distributions']} distributions, {left[key]['mb']:.1f} MB of site-packages")
        base = left["gpuwarden"]
        verdict = {"distributions": base["distributions"] <= TARGETS["distributions"],
                   "mb": base["mb"] <= TARGETS["mb"],
                   "wall_ratio": med["gpuwarden"] / med[PEER] <= TARGETS["wall_ratio"]}
        print("targets (issue 36) for the base install: " + ", ".join(
            f"{k} <= {TARGETS[k]:g}: {'met' if ok else 'MISSED'}" for k, ok in verdict.items()))
        out["install_s"] = installs
        out["installed"] = left
        out["targets_met"] = verdict
        if args.clients:
            out["clients"] = clients(tmp)

        if args.no_image:
            print("image: skipped (--no-image)")
        elif shutil.which("mmdebstrap") and shutil.which("umoci") and shutil.which("unshare"):
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
            host = _times_s([str(tmp / "v-gpuwarden/bin/gpuwarden"), "--version"], args.cli_runs)
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
