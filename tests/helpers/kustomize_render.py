"""deploy/k8s rendered as a user applies it: `kubectl kustomize` of the base, each overlay, each overlay with
every combination of its optional components, the admission bases and the NPD base; each rendered once a run.
"""

from __future__ import annotations

import atexit
import functools
import itertools
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
import yaml

from helpers.paths import REPO

K8S = REPO / "deploy" / "k8s"
VENDORS = ("amd", "nvidia")
OPTIONS = ("condition-policy", "servicemonitor")  # components any overlay may add
# What a user can apply: the shipped kustomizations, and each vendor overlay plus every subset of OPTIONS.
SHIPPED = ("base", *(f"overlays/{v}" for v in VENDORS), "admission/cel", "admission/kyverno", "npd")
AGENT_VARIANTS = ("base", *(f"overlays/{v}" + "".join(f"+{o}" for o in opts)
                            for v in VENDORS for n in range(len(OPTIONS) + 1)
                            for opts in itertools.combinations(OPTIONS, n)))


def _kubectl() -> str:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.fail("kubectl not found: the overlays are rendered with `kubectl kustomize` (tests/run-all.sh "
                    "installs it)")
    return kubectl


@functools.cache
def _scratch() -> Path:
    where = Path(tempfile.mkdtemp(prefix="gpuwarden-kustomize-"))
    atexit.register(shutil.rmtree, where, ignore_errors=True)
    return where


def _kustomization_for(variant: str) -> Path:
    """The directory to render: a shipped one, or a scratch overlay adding components (`overlays/amd+a+b`),
    written the way a user's own overlay would be (kustomize refuses absolute paths: relative ones)."""
    name, *components = variant.split("+")
    if not components:
        return K8S / name
    where = _scratch() / variant.replace("/", "_")
    where.mkdir(exist_ok=True)
    rel = lambda p: os.path.relpath(p, where)  # noqa: E731
    (where / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "resources": [rel(K8S / name)], "components": [rel(K8S / "components" / c) for c in components]}))
    return where


def _kustomize(variant: str) -> subprocess.CompletedProcess:
    return subprocess.run([_kubectl(), "kustomize", str(_kustomization_for(variant))], capture_output=True,
                          text=True, timeout=60)


@functools.cache
def _all_rendered() -> dict[str, subprocess.CompletedProcess]:
    """Every variant the tests know, rendered at once (kubectl starts in half a second; they overlap)."""
    from concurrent.futures import ThreadPoolExecutor
    variants = sorted({*SHIPPED, *AGENT_VARIANTS})
    with ThreadPoolExecutor(max_workers=4) as pool:
        return dict(zip(variants, pool.map(_kustomize, variants), strict=True))


def _render_text(variant: str) -> str:
    proc = _all_rendered().get(variant) or _kustomize(variant)
    if proc.returncode != 0:
        hint = ""
        if "unknown field \"components\"" in proc.stderr or "must be a file (got d=" in proc.stderr:
            hint = ("\nthis kubectl's kustomize predates directory resources and components (they need kubectl "
                    ">= 1.21, kustomize >= 4); Debian 12's kubernetes-client 1.20 bundles kustomize 2.0.3")
        pytest.fail(f"kubectl kustomize {variant} failed: {proc.stderr.strip()}{hint}")
    return proc.stdout


def render(variant: str) -> list[dict]:
    """The objects `kubectl kustomize` makes of a variant (a fresh copy each call: tests may change them)."""
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    return [d for d in yaml.load_all(_render_text(variant), Loader=loader) if d]


def render_error(*variants: str) -> subprocess.CompletedProcess:
    """kubectl kustomize of a scratch kustomization that includes all these shipped ones (to see it refused)."""
    where = Path(tempfile.mkdtemp(dir=_scratch()))
    (where / "kustomization.yaml").write_text(yaml.safe_dump({
        "resources": [os.path.relpath(K8S / v, where) for v in variants]}))
    return subprocess.run([_kubectl(), "kustomize", str(where)], capture_output=True, text=True, timeout=60)


def by_kind(docs: list[dict], kind: str) -> dict:
    (doc,) = [d for d in docs if d["kind"] == kind]
    return doc


def containers(doc: dict) -> list[dict]:
    spec = doc.get("spec") or {}
    spec = (spec.get("template") or {}).get("spec") or spec
    return [*spec.get("initContainers", []), *spec.get("containers", [])]
