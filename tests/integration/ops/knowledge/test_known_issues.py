"""The catalog of known issues (ops/knowledge): it loads and is well-formed, every claim is located in a source
or marked as gpuwarden's own reasoning, every id the code cites exists, every entry with a log signature matches
a real log excerpt it was written from (tests/fixtures/SOURCES.md, tests/triage_corpus/SOURCES.md), healthy logs
match nothing, and `triage`, `triage --json` and `gpuwarden known` cite or list the entries.
"""

from __future__ import annotations

import json


from helpers.known_excerpts import CASES
from helpers.paths import REPO
from gpuwarden.ops.knowledge import load

TESTS = REPO / "tests"



# --- the commands -------------------------------------------------------------------------------------

def _doc(text: str) -> dict:
    from gpuwarden.ops.foundation import jsondoc
    d = json.loads(text)
    jsondoc.validate(d)
    return d


def test_known_lists_searches_and_shows_one(cli):
    proc = cli("known")
    assert proc.returncode == 0 and f"of {len(load())};" in proc.stdout
    proc = cli("known", "GSP", "timeout")
    assert proc.returncode == 0 and "nvidia-gsp-rpc-timeout-xid119" in proc.stdout
    proc = cli("known", "mes-firmware-0x83-strix-halo")
    assert proc.returncode == 0
    for text in ("What upstream said:", "Workaround:", "Fixed in:", "https://github.com/ROCm/ROCm/issues/5724"):
        assert text in proc.stdout
    said = proc.stdout.split("What upstream said:")[1].split("\n\n")[0]
    assert "    - https://github.com/ROCm/ROCm/issues/5724 (comment by @" in said  # the evidence under its claim
    proc = cli("known", "no-such-thing-anywhere")
    assert proc.returncode == 1 and "no known issue matches" in proc.stderr and not proc.stdout


def test_known_json_follows_its_schema(cli):
    d = _doc(cli("known", "--json").stdout)
    assert d["schema"] == "gpuwarden.known/2" and d["count"] == d["total"] == len(load())
    assert all(e["sources"] or e["own_reasoning"] for e in d["entries"])
    d = _doc(cli("known", "--topic", "arena", "--json").stdout)
    assert {e["kind"] for e in d["entries"]} == {"issue", "alternative"}


def test_triage_cites_matches_in_text_and_json(cli):
    log = str(TESTS / CASES["nvidia-gsp-rpc-timeout-xid119"])
    proc = cli("triage", log)
    assert "## Known issues that match" in proc.stdout and "`nvidia-gsp-rpc-timeout-xid119`" in proc.stdout
    d = _doc(cli("triage", log, "--json").stdout)
    (k,) = [k for k in d["known_issues"] if k["id"] == "nvidia-gsp-rpc-timeout-xid119"]
    assert k["rule"] == "nvidia.xid" and k["versions"].startswith("not known")  # a bare log has no versions


def test_explain_names_the_entries_of_a_rule(cli):
    proc = cli("triage", "--explain", "mes.no_response")
    assert proc.returncode == 0 and "Known issues with this signature" in proc.stdout
    assert "mes-firmware-0x83-strix-halo" in proc.stdout
    proc = cli("triage", "--explain", "hip-no-binary-for-gpu")
    assert proc.returncode == 0 and "HSA_OVERRIDE_GFX_VERSION" in proc.stdout


def test_bundle_triage_judges_versions_from_the_bundle(state_dir, tmp_path, monkeypatch):
    import os
    import tarfile

    from gpuwarden.ops.bundle.collect import collect_bundle
    from gpuwarden.ops.foundation.settings import Settings
    from gpuwarden.ops.node.sim.node import SimNode
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "dmesg").write_text(f"#!/bin/sh\ncat {TESTS / CASES['nvidia-gsp-heartbeat-timeout-open595']}\n")
    (bindir / "dmesg").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    SimNode(state_dir).init(gpus=1, vram=8 << 30)
    result = collect_bundle(Settings(state_dir=state_dir, config_path=state_dir / "node.toml", backend="sim"),
                            output=tmp_path, timeout_s=5)
    with tarfile.open(result.path) as tf:
        top = tf.getnames()[0].split("/")[0]
        tri = json.loads(tf.extractfile(f"{top}/triage.json").read())
    assert tri["environment"]["kernel"] == os.uname().release
    (k,) = [k for k in tri["known_issues"] if k["id"] == "nvidia-gsp-heartbeat-timeout-open595"]
    assert k["versions"] == "not known (nvidia version not recorded)"  # no NVIDIA module on this machine
