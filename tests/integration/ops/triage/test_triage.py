"""Triage on the captured kernel logs: every fixture yields the findings it contains, signatures group.

Logs come from tests/fixtures/dmesg (real pastes, see SOURCES.md); the CLI runs as a subprocess.
"""

from __future__ import annotations

import json




def test_cli_triage_logfile_json_and_exit_code(cli, fixtures):
    proc = cli("triage", str(fixtures / "dmesg/rocm1886_mi50_ras_athub_uncorrectable_gpu_reset_smu_failures.log"),
               "--json")
    assert proc.returncode == 1, proc.stderr
    data = json.loads(proc.stdout)
    assert data["findings"][0]["rule"] == "ras.uncorrectable_event"
    assert data["counts"]["critical"] >= 1


def test_cli_triage_markdown_stdin_and_clean_log(cli, fixtures):
    text = (fixtures / "dmesg/rocm343_comment3_kfd_evicting_pasid_sdma_oversubscription.log").read_text()
    proc = cli("triage", "-", input=text)
    assert proc.returncode == 0  # warnings and infos only
    assert "## Summary" in proc.stdout and "SDMA queue over-subscription refused (x4)" in proc.stdout


def test_cli_triage_missing_file_is_one_line(cli, tmp_path):
    proc = cli("triage", str(tmp_path / "nope.log"))
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr and "no such file" in proc.stderr
