"""The shipped Prometheus rules and Grafana dashboard: promtool checks and unit-tests the rules (every alert firing
and not firing), and every gpuwarden name the rules and the dashboard use is one the exporter really exports.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from dataclasses import replace

from helpers.metrics_exposition import make_reading, make_snapshot

from helpers.paths import REPO
from gpuwarden.ops.metrics.collector import render
from gpuwarden.ops.metrics.reading import MetricsOptions
from gpuwarden.ops.foundation.model import GpuProcess, PodGpus
from helpers.metrics_rules import DASHBOARD, RULES

RULE_TESTS = REPO / "tests" / "prometheus" / "gpuwarden-rules.test.yml"
NAME = re.compile(r"\bgpuwarden(?:_[a-z0-9_]+|:[a-z0-9_:]+)")


def _promtool(*args: str, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run(["promtool", *args], capture_output=True, text=True, timeout=120, cwd=cwd)


def test_promtool_checks_the_rules():
    proc = _promtool("check", "rules", str(RULES))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout


def test_every_alert_has_unit_tests_that_pass_and_can_fail(tmp_path):
    alerts = set(re.findall(r"^\s+- alert: (\w+)$", RULES.read_text(), re.M))
    tests = RULE_TESTS.read_text()
    tested = set(re.findall(r"alertname: (\w+)", tests))
    assert alerts == tested, f"alerts without unit tests: {alerts - tested}"
    for alert in alerts:  # each one both silent (exp_alerts: []) and firing somewhere
        assert re.search(rf"alertname: {alert}\n\s+exp_alerts: \[\]", tests), f"{alert} never tested silent"
        assert re.search(rf"alertname: {alert}\n\s+exp_alerts:\n", tests), f"{alert} never tested firing"
    proc = _promtool("test", "rules", RULE_TESTS.name, cwd=RULE_TESTS.parent)
    assert proc.returncode == 0, proc.stdout + proc.stderr

    # The same tests against rules whose residual alert waits 1 minute instead of 5 must fail.
    (tmp_path / "deploy" / "prometheus").mkdir(parents=True)
    (tmp_path / "tests" / "prometheus").mkdir(parents=True)
    text = RULES.read_text()
    head, sep, tail = text.partition("alert: GpuwardenResidualVram")
    (tmp_path / "deploy" / "prometheus" / RULES.name).write_text(head + sep + tail.replace("for: 5m", "for: 1m", 1))
    shutil.copy(RULE_TESTS, tmp_path / "tests" / "prometheus")
    proc = _promtool("test", "rules", RULE_TESTS.name, cwd=tmp_path / "tests" / "prometheus")
    assert proc.returncode != 0 and "GpuwardenResidualVram" in proc.stdout + proc.stderr


def _exported_names() -> set[str]:
    """Every family name the exporter can produce (a reading with everything in it), with its sample suffixes."""
    procs = (GpuProcess(pid=7, start_time=1.0, user="u", command="x", state="sleeping", vram={0: 1}),)
    # Kubernetes mode: GPU 2's significant residual was last given to a deleted pod.
    snap = replace(make_snapshot(processes=procs), pods=(PodGpus("team-a", "trainer-0", "main", (2,), deleted_at=1.0),),
                   kubernetes={"condition": {"status": "True"}, "taint": "residual-vram", "problem": None})
    body = render(make_reading(snap), MetricsOptions(per_process=True)).decode()
    names = set(re.findall(r"^(gpuwarden_\w+)", body, re.M))
    names |= {"gpuwarden_engine_registration_seconds", "gpuwarden_engine_registration_wait_seconds",
              "gpuwarden_engine_registered_bytes", "gpuwarden_engine_registrations"}  # need registration records
    # needs a process's GPU load (test_metrics_exposition.py renders it from a process with one)
    names.add("gpuwarden_process_gpu_busy_percent")
    # need a GPU with sensors (tests/unit/ops/node/test_sensors.py renders them from the sim node's files)
    names |= {f"gpuwarden_gpu_{n}" for n in (
        "clock_hertz", "clock_max_hertz", "fan_rpm", "fan_ratio", "power_cap_watts", "memory_busy_ratio",
        "pcie_link_transfers_per_second", "pcie_link_width_lanes", "sensor_temperature_celsius", "ras_errors_total",
        "retired_pages", "pending_retired_pages", "bad_page_threshold", "throttled")}
    return names


def test_rules_and_dashboard_use_only_names_that_exist():
    exported = _exported_names()
    recorded = set(re.findall(r"^\s+- record: (\S+)$", RULES.read_text(), re.M))
    rule_names = set(NAME.findall(RULES.read_text())) - {"gpuwarden_"}
    assert rule_names - exported - recorded == set()
    dash = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    assert len(exprs) > 25
    used = {n for e in exprs for n in NAME.findall(e)}
    assert used - exported - recorded == set()
    # Every family the manual's table (docs/metrics.md) lists exists, and every exported family is in the table.
    readme = (REPO / "docs/metrics.md").read_text()
    table = set(re.findall(r"^\| `(gpuwarden_\w+)`", readme, re.M))
    families = {n for n in exported if not n.endswith("_created")}
    assert families - table == set(), "exported but not in docs/metrics.md's table"
    assert table - families == set(), "in docs/metrics.md's table but not exported"
    # The dashboard is one Grafana document: unique panel ids, the datasource a variable.
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    assert all(p["datasource"]["uid"] == "${datasource}" for p in dash["panels"] if p["type"] != "row")


FRAG_ALERTS = REPO / "deploy" / "prometheus" / "gpuwarden-fragmentation-alerts.yml"
FRAG_TESTS = REPO / "tests" / "prometheus" / "gpuwarden-fragmentation-alerts.test.yml"


def test_the_amd_fragmentation_contract_records_and_its_opt_in_alert_passes_and_can_fail(tmp_path):
    # amd_hbm_fragmentation_ratio is recorded by the shipped rules; its alert is a file of its own (opt-in).
    assert "record: amd_hbm_fragmentation_ratio" in RULES.read_text()
    assert "alert:" not in RULES.read_text().split("name: gpuwarden.amd-contract")[1].split("- name:")[0]
    proc = _promtool("check", "rules", str(FRAG_ALERTS))
    assert proc.returncode == 0 and "SUCCESS" in proc.stdout, proc.stdout + proc.stderr
    proc = _promtool("test", "rules", FRAG_TESTS.name, cwd=FRAG_TESTS.parent)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # The write-up's own threshold (0.25) fires on the healthy GPUs of the same tests: the tests must catch it.
    (tmp_path / "deploy" / "prometheus").mkdir(parents=True)
    (tmp_path / "tests" / "prometheus").mkdir(parents=True)
    shutil.copy(RULES, tmp_path / "deploy" / "prometheus")
    (tmp_path / "deploy" / "prometheus" / FRAG_ALERTS.name).write_text(
        FRAG_ALERTS.read_text().replace("amd_hbm_fragmentation_ratio > 0.95", "amd_hbm_fragmentation_ratio > 0.25"))
    shutil.copy(FRAG_TESTS, tmp_path / "tests" / "prometheus")
    proc = _promtool("test", "rules", FRAG_TESTS.name, cwd=tmp_path / "tests" / "prometheus")
    assert proc.returncode != 0 and 'gpu="3"' in proc.stdout + proc.stderr, proc.stdout + proc.stderr
