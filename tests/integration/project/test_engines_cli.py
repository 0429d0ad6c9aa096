"""`gpuwarden engines list|logs|stop|restart` against real shims."""

from __future__ import annotations

import json
import subprocess
import sys

from helpers.paths import REPO
from engines.harness import records, supervised, write_config  # noqa: F401
from helpers.simnode import cli_argv, on_terminal, wait_for


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
    # --all without a terminal and without --yes: refused like drain, nothing stopped.
    refused = cli("engines", "stop", "--all", check=False)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "needs confirmation" in refused.stderr and "--yes" in refused.stderr and "e0, e1" in refused.stderr
    assert all(r["phase"] == "serving" for r in records(supervised).values())
    # On a terminal it lists every process it would signal, then asks; "n" stops nothing.
    rc, out = on_terminal(cli_argv(supervised, "engines", "stop", "--all"), b"n\n")
    flat = " ".join(out.split())
    assert rc == 1 and "Proceed? [y/N]" in flat and "no engine was stopped" in flat, out
    assert "supervised engine e0)" in flat and "launcher of a supervised engine e1)" in flat, out
    assert all(r["phase"] == "serving" for r in records(supervised).values())
    proc = cli("engines", "stop", "--all", "--json", "--yes")
    assert proc.returncode == 0, proc.stderr
    assert sorted(r["name"] for r in json.loads(proc.stdout)["results"]) == ["e0", "e1"]
    out, _ = follower.communicate(timeout=15)
    assert "stopping" in out.splitlines()
    assert all(r["phase"] == "exited" for r in records(supervised).values())
    assert "no running engines" in cli("engines", "stop", "--all").stdout
    assert cli("engines", "stop").returncode == 2
