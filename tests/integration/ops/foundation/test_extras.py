"""A base install (no extras) runs every node command, and each command that needs an extra says which, exit 2.

The base venv is real: a fresh venv whose site-packages holds only gpuwarden and the distributions its base
requirements pull in (linked from this test venv, resolved from their metadata): kubernetes, grpc, asyncssh,
ClusterShell, textual-serve and aiohttp are simply not there, as after `pip install gpuwarden`.
"""

from __future__ import annotations

import importlib.metadata as md
import os
import re
import subprocess
import sys
import tomllib
import venv
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from helpers.paths import REPO

EXTRAS_MODULES = ("kubernetes", "grpc", "google.protobuf", "asyncssh", "ClusterShell", "textual_serve", "aiohttp")


def base_distributions() -> dict[str, md.Distribution]:
    """gpuwarden's base requirements and theirs, as this venv has them (markers evaluated, no extras)."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    todo = [(Requirement(r), "") for r in project["dependencies"]]
    found: dict[str, md.Distribution] = {}
    while todo:
        req, extra = todo.pop()
        if req.marker is not None and not req.marker.evaluate({"extra": extra}):
            continue
        name = canonicalize_name(req.name)
        if name in found:
            continue
        dist = found[name] = md.distribution(req.name)
        todo += [(Requirement(r), "") for r in dist.requires or []]
        for wanted in req.extras:  # an extra one of them asks of another (none today; kept honest)
            todo += [(Requirement(r), wanted) for r in dist.requires or []]
    return found


def _top_entries(dist: md.Distribution) -> set[str]:
    """The site-packages entries (packages, modules, .libs folders, its .dist-info) a distribution installed."""
    tops = set()
    for f in dist.files or []:
        first = f.parts[0]
        if first not in ("..", "__pycache__") and not first.endswith(".pth") and not str(f).startswith("/"):
            tops.add(first)
    return tops


@pytest.fixture(scope="module")
def base_venv(tmp_path_factory) -> Path:
    where = tmp_path_factory.mktemp("base") / "venv"
    venv.create(where, with_pip=False)
    py = where / "bin/python"
    site = Path(subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                               capture_output=True, text=True, check=True).stdout.strip())
    ours = Path(md.distribution("typer").locate_file(""))  # this venv's site-packages
    for dist in base_distributions().values():
        for top in _top_entries(dist):
            if (ours / top).exists() and not (site / top).exists():
                (site / top).symlink_to(ours / top)
    (site / "gpuwarden").symlink_to(REPO)  # the checkout is the package (pyproject: package-dir)
    return py


def run(py: Path, state: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUWARDEN_", "KUBE"))}
    env["HOME"] = str(state)  # no ~/.kube/config, no ~/.ssh of the person running the tests
    return subprocess.run([str(py), "-m", "gpuwarden.tui.main", "--state-dir", str(state / "s"), "--backend", "sim",
                           *args], capture_output=True, text=True, timeout=60, env=env, stdin=subprocess.DEVNULL)


def test_the_base_venv_lacks_every_extra_and_has_gpuwardens_base(base_venv):
    probe = ("import importlib.util as u, sys; "
             f"print([m for m in {EXTRAS_MODULES!r} if u.find_spec(m.split('.')[0]) and u.find_spec(m)])")
    out = subprocess.run([str(base_venv), "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
    names = set(base_distributions())
    assert not names & {"kubernetes", "grpcio", "protobuf", "asyncssh", "clustershell", "textual-serve", "aiohttp"}


def test_a_node_command_runs_on_the_base_install(base_venv, tmp_path):
    init = run(base_venv, tmp_path, "sim", "init")
    assert init.returncode == 0, init.stderr
    status = run(base_venv, tmp_path, "status", "--json")
    assert status.returncode in (0, 1), status.stderr
    assert '"gpus"' in status.stdout
    # A tenant's init container and the exporter: Kubernetes and Prometheus, without the kubernetes extra.
    check = run(base_venv, tmp_path, "gpu-check", "--no-agent")
    assert check.returncode == 0 and "GPU 0: clean" in check.stdout, check.stdout + check.stderr
    metrics = run(base_venv, tmp_path, "metrics")
    assert metrics.returncode == 0 and "gpuwarden_gpu_vram_used_bytes" in metrics.stdout, metrics.stderr


MISSING = [
    (("drain", "0", "--kubernetes", "--yes"), "drain --kubernetes", "kubernetes"),
    (("undrain", "0", "--kubernetes"), "undrain --kubernetes", "kubernetes"),
    (("agent", "--kubernetes", "--foreground"), "agent --kubernetes", "kubernetes"),
    (("k8s-agent",), "k8s-agent", "kubernetes"),
    (("fleet", "status", "--hosts", "{hosts}"), "fleet status", "fleet"),
    (("fleet", "purge", "--hosts", "{hosts}", "--yes"), "fleet purge", "fleet"),
    (("fleet", "status", "--nodelist", "gpu[01-02]"), "--nodelist", "fleet"),
    (("serve",), "serve", "serve"),
]


@pytest.mark.parametrize("args,feature,extra", MISSING, ids=[" ".join(m[0][:2]) for m in MISSING])
def test_a_command_that_needs_a_missing_extra_says_which_in_one_line(base_venv, tmp_path, args, feature, extra):
    hosts = tmp_path / "hosts"
    hosts.write_text("gpu01\n")
    result = run(base_venv, tmp_path, *(a.format(hosts=hosts) for a in args))
    assert result.returncode == 2, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert lines[0] == f"gpuwarden: error: {feature} needs the {extra} extra", result.stderr
    assert re.fullmatch(rf"\s*hint: pip install 'gpuwarden\[{extra}\]'", lines[1]), result.stderr
    assert "Traceback" not in result.stderr and "credentials" not in result.stderr


def test_the_extras_bring_what_the_helper_says(tmp_path):
    # ops/foundation/extras.py's table and pyproject's extras name the same packages: one cannot move without the other.
    from gpuwarden.ops.foundation import extras
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    optional = project["optional-dependencies"]
    for extra, modules in extras.MODULES.items():
        names = {canonicalize_name(Requirement(r).name) for r in optional[extra]}
        for module in modules:
            dists = {canonicalize_name(d) for d in md.packages_distributions()[module.split(".")[0]]}
            brought = names | {canonicalize_name(Requirement(r).name)
                               for n in names for r in md.distribution(n).requires or []}
            assert dists & brought, (extra, module, dists, names)
    assert Requirement(optional["all"][0]).extras == set(extras.MODULES)
    assert sys.version_info >= (3, 11)


def test_an_extra_installed_without_its_dependencies_is_named_too(base_venv, tmp_path):
    # A `kubernetes` whose own dependency is missing (pip install --no-deps): still one line, naming both.
    fake = tmp_path / "fake" / "kubernetes"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("import urllib3_missing_for_this_test  # noqa\n")
    (fake / "client.py").write_text("")
    code = ("from gpuwarden.ops.foundation import extras\n"
            "try:\n    extras.require('kubernetes.client', 'agent --kubernetes')\n"
            "except extras.MissingExtra as exc:\n    print(exc.message); print(exc.hint)\n")
    out = subprocess.run([str(base_venv), "-c", code], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PYTHONPATH": str(fake.parent)})
    assert out.stdout.splitlines() == [
        "agent --kubernetes needs the kubernetes extra (urllib3_missing_for_this_test, which kubernetes needs, "
        "is missing)", "pip install 'gpuwarden[kubernetes]'"], out.stdout + out.stderr
