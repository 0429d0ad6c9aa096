"""Pod attribution from /proc/<pid>/cgroup: every real format in k8s_fixtures/cgroups.txt, and the cache."""

from __future__ import annotations


import pytest

from gpuwarden.ops.k8s.cgroup import PodCgroup, parse
from helpers.paths import TESTS

CASES_FILE = TESTS / "k8s_fixtures" / "cgroups.txt"


def _cases():
    cases, current = [], None
    for line in CASES_FILE.read_text().splitlines():
        if line.startswith("## "):
            name, uid, cid, runtime, qos, deleted = [f.strip() for f in line[3:].split("|")]
            current = {"name": name, "uid": uid, "cid": cid, "runtime": runtime, "qos": qos,
                       "deleted": deleted == "yes", "text": []}
            cases.append(current)
        elif current is not None and not line.startswith("# "):
            current["text"].append(line)
    return cases


CASES = _cases()


def test_the_fixture_file_has_every_format():
    names = " ".join(c["name"] for c in CASES)
    for kind in ("v1 cgroupfs", "v1 systemd", "v2 systemd", "v2 cgroupfs", "containerd", "CRI-O", "docker",
                 "cgroup namespace", "zombie", "conmon"):
        assert kind in names, kind
    assert len(CASES) >= 20


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_real_cgroup_files(case):
    got = parse("\n".join(case["text"]))
    if case["uid"] == "-":
        assert got is None
        return
    none = lambda v: None if v == "-" else v  # noqa: E731
    assert got == PodCgroup(pod_uid=case["uid"], container_id=none(case["cid"]), runtime=none(case["runtime"]),
                            qos=case["qos"], deleted=case["deleted"])
