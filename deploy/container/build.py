#!/usr/bin/env python3
"""Builds gpuwarden's OCI image without a registry or a container engine: mmdebstrap, a venv, umoci.

Debian bookworm's python3 (no compiler, no apt) + the manylinux wheel and its PyPI dependencies in
/opt/gpuwarden, tagged gpuwarden:<version>. Writes an OCI layout and an oci-archive tarball that
`podman load -i` / `skopeo copy oci-archive:...` take. The Containerfile beside this builds the same image
with a container engine. Stages are cached in --cache (keyed by what went into them).

    python deploy/container/build.py [--wheel dist/gpuwarden-...whl] [--out dist/image] [--cache DIR]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import tomllib
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO / "deploy" / "wheel"))
import build as wheelbuild  # noqa: E402  (deploy/wheel/build.py)

SUITE = "bookworm"
PACKAGES = ("python3", "python3-venv", "ca-certificates")
# Documentation, manuals and translations are no use in a node agent's image (copyright files stay).
DPKG_OPTS = ("path-exclude=/usr/share/doc/*", "path-include=/usr/share/doc/*/copyright",
             "path-exclude=/usr/share/man/*", "path-exclude=/usr/share/info/*", "path-exclude=/usr/share/locale/*")
GLIBC_MINOR = 36  # bookworm's glibc 2.36: the newest manylinux tag its dependencies' wheels may carry
VENV = "/opt/gpuwarden"
ENTRYPOINT = "/usr/local/bin/gpuwarden"


def default_cache() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "gpuwarden-build"


def default_pip_cache() -> Path:
    return Path(os.environ.get("PIP_CACHE_DIR") or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "pip")


def _key(*parts: object) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def base_tarball(cache: Path) -> Path:
    """Debian with python3 and nothing to compile with, made by mmdebstrap (cached: ~30 s to make)."""
    if shutil.which("mmdebstrap") is None:
        raise SystemExit("the image's root fs is made by mmdebstrap: apt-get install mmdebstrap")
    out = cache / f"base-{SUITE}-{_key(SUITE, PACKAGES, DPKG_OPTS)}.tar"
    if out.is_file():
        return out
    cache.mkdir(parents=True, exist_ok=True)
    part = out.with_name(out.stem + ".part.tar")  # mmdebstrap picks its output format by the name
    argv = ["mmdebstrap", "--quiet", "--variant=essential", f"--include={','.join(PACKAGES)}",
            *(f"--dpkgopt={o}" for o in DPKG_OPTS),
            "--customize-hook=rm -rf $1/var/lib/apt/lists/* $1/var/cache/apt/* $1/var/log/*",
            SUITE, str(part)]
    subprocess.run(argv, check=True)
    part.rename(out)
    return out


def unpack(tarball: Path, into: Path) -> Path:
    into.mkdir(parents=True, exist_ok=True)
    subprocess.run(["tar", "-C", str(into), "--numeric-owner", "-xpf", str(tarball)], check=True)
    return into


def chroot_argv(root: Path, script: str, *, binds: dict[str, str] | None = None, readonly: tuple[str, ...] = (),
                env: dict[str, str] | None = None) -> tuple[list[str], dict[str, str]]:
    """The command (and its environment) that runs a shell script in `root` as a container would: own mount and
    pid namespaces, /proc, /dev, binds.

    binds maps a host path to a path inside root (created if missing); those inside paths named in readonly are
    mounted read-only (as a pod's readOnly volumeMounts), the others read-write.
    """
    mounts = ["mount -t proc proc \"$R/proc\"", "mount --rbind /dev \"$R/dev\""]
    for host, inside in (binds or {}).items():
        target = _quote(f"{root}{inside}")
        mounts.append(f"mkdir -p {target}" if Path(host).is_dir()
                      else f"mkdir -p \"$(dirname {target})\" && touch {target}")
        mounts.append(f"mount --bind {_quote(host)} {target}")
        if inside in readonly:
            mounts.append(f"mount -o remount,bind,ro {target}")
    inner_env = ["env", "-i", "PATH=/usr/local/bin:/usr/bin:/bin", "HOME=/root", "LANG=C.UTF-8",
                 *(f"{k}={v}" for k, v in (env or {}).items())]
    outer = "; ".join(["set -e", *mounts, 'exec chroot "$R" ' + " ".join(map(_quote, inner_env))
                       + " /bin/sh -c " + _quote(script)])
    # --kill-child: the namespace's processes die with unshare, whoever kills it
    return (["unshare", "--mount", "--pid", "--fork", "--kill-child", "--mount-proc", "sh", "-c", outer],
            {**os.environ, "R": str(root)})


def chroot(root: Path, script: str, *, binds: dict[str, str] | None = None, env: dict[str, str] | None = None,
           readonly: tuple[str, ...] = (), timeout: float = 600, check: bool = True,
           capture: bool = False) -> subprocess.CompletedProcess:
    """Run a shell script in `root` (chroot_argv) and wait for it."""
    argv, outer_env = chroot_argv(root, script, binds=binds, readonly=readonly, env=env)
    return subprocess.run(argv, env=outer_env, timeout=timeout, check=check, capture_output=capture, text=True)


def _quote(s: str) -> str:
    return "'" + s.replace("'", "'\\''") + "'"


def _dependencies(extra: str = "all") -> list[str]:
    """What `pip install 'gpuwarden[all]'` asks for: the base requirements and every extra's (the image runs
    Kubernetes mode, the fleet and serve). `all` names the other extras (gpuwarden[kubernetes,fleet,serve])."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    optional = project.get("optional-dependencies", {})
    deps, todo, seen = list(project["dependencies"]), [extra], set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        for req in optional[name]:
            own = re.fullmatch(r"gpuwarden\[([a-z0-9_,-]+)\]", req.replace(" ", ""))
            if own:
                todo += own.group(1).split(",")
            elif req not in deps:
                deps.append(req)
    return deps


def _platforms(glibc_minor: int) -> list[str]:
    """pip download's --platform for every manylinux tag this glibc runs (pip does not widen one tag)."""
    tags = [f"manylinux_2_{v}_x86_64" for v in range(glibc_minor, 16, -1)] + ["manylinux2014_x86_64"]
    return [arg for tag in tags for arg in ("--platform", tag)]


def runtime_tarball(cache: Path, pip_cache: Path) -> Path:
    """The base + a venv with gpuwarden's PyPI dependencies (cached by the dependency list)."""
    base = base_tarball(cache)
    deps = _dependencies()
    out = cache / f"runtime-{_key(base.name, deps)}.tar"
    if out.is_file():
        return out
    with tempfile.TemporaryDirectory(prefix="gpuwarden-image-", dir=cache) as tmp:
        root = unpack(base, Path(tmp) / "root")
        wheels = Path(tmp) / "wheels"
        reqs = Path(tmp) / "requirements.txt"
        reqs.write_text("\n".join(deps) + "\n")
        # Fetched here, with this host's pip settings and cache, for the image's CPython (bookworm: 3.11,
        # glibc 2.36); installed inside the root fs with no index at all.
        pyver = chroot(root, "python3 -c 'import sys; print(\"%d.%d\" % sys.version_info[:2])'",
                       capture=True).stdout.strip()
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check",
                        "--only-binary", ":all:", "--python-version", pyver, "--implementation", "cp",
                        *_platforms(GLIBC_MINOR), "--cache-dir", str(pip_cache),
                        "-d", str(wheels), "-r", str(reqs)], check=True)
        shutil.copy(reqs, wheels / reqs.name)
        chroot(root, f"python3 -m venv {VENV} && {VENV}/bin/pip install -q --disable-pip-version-check "
                     f"--no-index --find-links /tmp/wheels --no-cache-dir -r /tmp/wheels/requirements.txt",
               binds={str(wheels): "/tmp/wheels"})
        _pack_dir(root, out)
    return out


def _pack_dir(root: Path, out: Path) -> None:
    part = out.with_name(out.stem + ".part.tar")  # mmdebstrap picks its output format by the name
    subprocess.run(["tar", "-C", str(root), "--numeric-owner", "-cpf", str(part), "."], check=True)
    part.rename(out)


def rootfs(wheel: Path, into: Path, cache: Path, pip_cache: Path) -> Path:
    """The image's root fs in `into`: runtime + this wheel (no dependencies fetched: they are there)."""
    root = unpack(runtime_tarball(cache, pip_cache), into)
    shutil.copy(wheel, root / "tmp" / wheel.name)
    chroot(root, f"{VENV}/bin/pip install -q --disable-pip-version-check --no-deps --no-cache-dir /tmp/{wheel.name}"
                 f" && rm /tmp/{wheel.name} && ln -sf {VENV}/bin/gpuwarden {ENTRYPOINT}")
    return root


def oci(root: Path, out: Path, tag: str) -> Path:
    """An OCI layout at out/oci (tag `tag`) and out/gpuwarden-<tag>.oci.tar, from the root fs."""
    if shutil.which("umoci") is None:
        raise SystemExit("the image is packed by umoci: apt-get install umoci")
    layout = out / "oci"
    shutil.rmtree(layout, ignore_errors=True)
    out.mkdir(parents=True, exist_ok=True)
    image = f"{layout}:{tag}"
    subprocess.run(["umoci", "init", "--layout", str(layout)], check=True)
    subprocess.run(["umoci", "new", "--image", image], check=True)
    subprocess.run(["umoci", "insert", "--image", image, "--history.created_by", "deploy/container/build.py",
                    str(root), "/"], check=True)
    subprocess.run(["umoci", "config", "--image", image, f"--config.entrypoint={ENTRYPOINT}",
                    "--config.cmd=agent", "--config.env=PYTHONDONTWRITEBYTECODE=1",
                    "--config.label=org.opencontainers.image.title=gpuwarden",
                    f"--config.label=org.opencontainers.image.version={tag}",
                    "--architecture=amd64", "--os=linux"], check=True)
    archive = out / f"gpuwarden-{tag}.oci.tar"
    with tarfile.open(archive, "w") as tar:
        for item in sorted(layout.iterdir()):
            tar.add(item, arcname=item.name)
    return archive


def image_size(layout: Path, tag: str) -> int:
    """Compressed bytes a registry stores for the tag: its config and layers (what `podman images` calls size
    is the unpacked one; RESULTS.md gives both)."""
    index = json.loads((layout / "index.json").read_text())
    desc = next(m for m in index["manifests"]
                if m.get("annotations", {}).get("org.opencontainers.image.ref.name") == tag)
    blob = lambda d: layout / "blobs" / d["digest"].replace(":", "/")  # noqa: E731
    manifest = json.loads(blob(desc).read_text())
    return sum(d["size"] for d in [manifest["config"], *manifest["layers"]])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--wheel", type=Path, help="the x86_64 wheel (default: build it with deploy/wheel/build.py)")
    ap.add_argument("--out", type=Path, default=REPO / "dist" / "image")
    ap.add_argument("--cache", type=Path, default=default_cache())
    args = ap.parse_args(argv)
    tag = wheelbuild.version()
    wheel = args.wheel or wheelbuild.build_wheel("x86_64", args.out.parent)
    with tempfile.TemporaryDirectory(prefix="gpuwarden-rootfs-", dir=args.cache if args.cache.is_dir() else None) as tmp:
        root = rootfs(wheel, Path(tmp) / "root", args.cache, default_pip_cache())
        archive = oci(root, args.out, tag)
    print(f"gpuwarden:{tag}: {archive} ({image_size(args.out / 'oci', tag) / 1e6:.1f} MB compressed)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
