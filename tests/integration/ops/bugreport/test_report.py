"""`gpuwarden report BUNDLE`: an upstream bug report from a real bundle of the sim node (kernel log = real
excerpts of a shared HIP crash and a GSP timeout, plus a planted secret): every section, the schema, redaction,
the known issues it cites, attachments matching the manifest, and how long it takes.
"""

from __future__ import annotations

import json
import os
import tarfile
import time
from pathlib import Path

import pytest

from helpers.paths import REPO
from gpuwarden.ops.foundation import jsondoc

LOGS = [REPO / "tests/triage_corpus/c40_sdnext2252_ctime_three_python_segfaults_libamdhip64_same_offset.log",
        REPO / "tests/triage_corpus/c32_ogkm446_ctime_xid119_gsp_rpc_timeout_nvidia_smi.log"]
SECRET = "Hunter2-Report-Secret"


@pytest.fixture(scope="module")
def bundle(tmp_path_factory) -> Path:
    from gpuwarden.ops.bundle.collect import collect_bundle
    from gpuwarden.ops.foundation.settings import Settings
    from gpuwarden.ops.node.sim.node import SimNode
    base = tmp_path_factory.mktemp("report")
    log = base / "kern.log"
    log.write_text("".join(p.read_text() for p in LOGS) + f"kernel: loader started with password={SECRET}\n")
    bindir = base / "bin"
    bindir.mkdir()
    (bindir / "dmesg").write_text(f"#!/bin/sh\ncat {log}\n")
    (bindir / "dmesg").chmod(0o755)
    old = os.environ["PATH"]
    os.environ["PATH"] = f"{bindir}{os.pathsep}{old}"
    try:
        state = base / "state"
        state.mkdir()
        SimNode(state).init(gpus=2, vram=8 << 30)
        return collect_bundle(Settings(state_dir=state, config_path=state / "node.toml", backend="sim"),
                              output=base, timeout_s=5).path
    finally:
        os.environ["PATH"] = old


def test_markdown_has_every_section_and_no_secret(cli, bundle):
    proc = cli("report", str(bundle))
    assert proc.returncode == 0, proc.stderr
    md = proc.stdout
    for heading in ("## Environment", "## What happened", "## How to reproduce", "## What was ruled out",
                    "## Known issues that match", "## Attachments"):
        assert heading in md
    assert "gfx942" in md and "SIMULATED" in md and "no_system_mem_limit=N" in md
    assert "3 processes crashed with the same signature: segfault in libamdhip64.so at offset 0xb40a7" in md
    assert "nvidia-gsp-rpc-timeout-xid119" in md and "https://github.com/NVIDIA/open-gpu-kernel-modules/issues/446" in md
    assert "| `kernel/kernel.log` |" in md
    assert SECRET not in md


def test_json_follows_its_schema_and_matches_the_manifest(cli, bundle):
    proc = cli("report", str(bundle), "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    jsondoc.validate(doc)
    assert SECRET not in proc.stdout
    with tarfile.open(bundle) as tf:
        top = tf.getnames()[0].split("/")[0]
        manifest = json.loads(tf.extractfile(f"{top}/manifest.json").read())
    sizes = {i["path"]: i["bytes"] for i in manifest["items"] if i.get("path")}
    assert doc["attachments_total"] == len(sizes)
    assert all(sizes[a["path"]] == a["bytes"] for a in doc["attachments"])
    assert [c["check"] for c in doc["ruled_out"]] and doc["environment"]["gpus"][0]["gfx_target"] == "gfx942"
    assert doc["reproduction"]["command"] is None and "arena probe" in doc["reproduction"]["why"]


def test_reproduction_names_the_probe_for_the_incidents_arena():
    from gpuwarden.ops.bugreport.build import _reproduction
    gpus = {"gpus": [{"vendor": "amd"}] * 4}
    rep = _reproduction([{"path": "/dev/shm/w.arena", "size": 64 << 30, "mappers": [{}, {}, {}, {}]}],
                        {"engines": [{"name": f"dp{i}"} for i in range(4)]}, gpus,
                        [f"dp{i}" for i in range(4)], [])
    assert rep["command"] == ("gpuwarden arena probe --engines 4 --concurrency 4 --arena /dev/shm/w.arena "
                              "--runtime hip --visibility all --hold 30")


def test_reproduction_uses_the_bundles_runtime_its_gpus_and_the_engines_that_registered():
    from gpuwarden.ops.bugreport.build import _reproduction
    # A sim bundle whose state dir kept 12 engine records; 4 registered in their last run on a 4-GPU node.
    snapshot = {"engines": [{"name": f"canary{i}"} for i in range(12)], "warnings": [{"code": "simulated"}]}
    specs = [{"argv": ["python", "-m", "gpuwarden.ops.canary", "--runtime", "sim"]}]
    rep = _reproduction([{"path": "/x/scenario.arena", "size": 64 << 20, "mappers": [{}] * 12}], snapshot,
                        {"gpus": [{"vendor": "amd"}] * 4}, [f"canary{i}" for i in range(4)], specs)
    assert "--engines 4 --concurrency 4" in rep["command"] and "--runtime sim" in rep["command"], rep
    assert "canary0, canary1, canary2, canary3" in rep["why"]
    many = _reproduction([{"path": "/x/a.arena", "mappers": []}], {}, {"gpus": [{"vendor": "amd"}] * 4},
                         [f"e{i}" for i in range(6)], [])
    assert "--engines 4 " in many["command"] and "2 more registered than the node has GPUs" in many["why"]


def test_a_missing_or_foreign_file_is_one_line(cli, tmp_path):
    proc = cli("report", str(tmp_path / "none.tar.gz"))
    assert proc.returncode == 2 and "no such bundle" in proc.stderr and "Traceback" not in proc.stderr
    (tmp_path / "x.tar.gz").write_bytes(b"not a tarball")
    proc = cli("report", str(tmp_path / "x.tar.gz"))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr


def test_report_takes_under_a_second(bundle):
    from gpuwarden.ops.bugreport import build
    from gpuwarden.ops.bugreport.render import markdown
    markdown(build(bundle))  # imports and the triage rules' regexes compile once per process
    t0 = time.perf_counter()
    markdown(build(bundle))
    assert time.perf_counter() - t0 < 1.0


def test_the_seconds_column_has_one_precision():
    # One row said 0.0012, the next 1.2345678901234567 (a difference of two timestamps): issue 36.
    from gpuwarden.ops.bugreport.render import _seconds
    assert [_seconds(v) for v in (0.0012, 1.2345678901234567, 2, None)] == ["0.001", "1.235", "2.000", "not recorded"]
