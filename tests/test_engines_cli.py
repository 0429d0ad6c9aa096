"""`gpuwarden engines list|logs|stop|restart` against real shims."""

from __future__ import annotations

import json
import subprocess
import sys

from conftest import REPO
from engines.harness import records, supervised, write_config  # noqa: F401
from simnode import wait_for


def test_list_logs_stop_restart(tmp_path, supervised, cli):
    cfg = write_config(tmp_path / "node.toml", 2, slots=2, register_s=0.1)
    assert cli("--config", str(cfg), "launch").returncode == 0

    listed = json.loads(cli("engines", "list", "--json").stdout)["engines"]
    assert [(e["name"], e["gpu"], e["phase"]) for e in listed] == [("e0", 0, "serving"), ("e1", 1, "serving")]
    assert all(e["pid"] and e["shim_pid"] and "serving" in e["phases"] for e in listed)
    table = cli("engines", "list").stdout
    assert table.splitlines()[0].split()[:3] == ["NAME", "GPU", "PHASE"]

    logs = cli("engines", "logs", "e1", "-n", "2").stdout.splitlines()
    assert logs == ["session is up", "serving"]
    assert cli("engines", "logs", "nope").returncode == 2

    old_pid = records(supervised)["e0"]["pid"]
    proc = cli("engines", "restart", "e0")
    assert proc.returncode == 0, proc.stderr
    wait_for(lambda: records(supervised)["e0"].get("phase") == "serving", 10, "e0 serving again")
    assert records(supervised)["e0"]["pid"] != old_pid

    # Follow until the engine ends: the follower returns by itself once it has stopped.
    follower = subprocess.Popen([sys.executable, "-m", "gpuwarden.playbooks.cli.root", "--state-dir", str(supervised),
                                 "engines", "logs", "e1", "--follow", "-n", "1"],
                                cwd=REPO, stdout=subprocess.PIPE, text=True)
    proc = cli("engines", "stop", "--all", "--json")
    assert proc.returncode == 0, proc.stderr
    assert sorted(r["name"] for r in json.loads(proc.stdout)["results"]) == ["e0", "e1"]
    out, _ = follower.communicate(timeout=15)
    assert "stopping" in out.splitlines()
    assert all(r["phase"] == "exited" for r in records(supervised).values())
    assert "no running engines" in cli("engines", "stop", "--all").stdout
    assert cli("engines", "stop").returncode == 2
