"""`gpuwarden launch` of unmodified engines under progress = "preload": the interposer staggers them.

Four engines of each kind (linked, dlopen + dlsym, ctypes) against a stand-in runtime that faults when three
registrations overlap: --stagger 1 never overlaps and all serve; --stagger 4 crashes and the launch says SIGSEGV.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from engines.harness import records, supervised  # noqa: F401
from engines.preload_harness import SIZE, calls, engine_argv


def write_config(path: Path, standins: Path, mode: str, *, count: int = 4, register_ms: int = 200,
                 engine_keys: str = "", gather: bool = True, env_extra: dict | None = None) -> Path:
    """Engines that all call register at the same moment (STANDIN_GATHER), however slowly they were started."""
    work = path.parent / "standin"
    work.mkdir(exist_ok=True)
    env = {"STANDIN_DIR": str(work), "STANDIN_REGISTER_MS": str(register_ms), "STANDIN_FAULT_AT": "3"}
    if gather:
        env["STANDIN_GATHER"] = str(count)
    env.update(env_extra or {})
    lines = ["[stagger]", "slots = 4", "registration_timeout = 30", "",
             "[defaults]", 'progress = "preload"', "stop_grace = 3",
             "env = { " + ", ".join(f"{k} = {json.dumps(v)}" for k, v in env.items()) + " }", engine_keys, ""]
    for i in range(count):
        lines += ["[[engines]]", f'name = "{mode}{i}"', f"gpu = {i}",
                  f"argv = {json.dumps(engine_argv(standins, mode))}", ""]
    path.write_text("\n".join(lines))
    return path


def _windows(served: list[dict]) -> list[tuple[float, float]]:
    return [(c["start"], c["end"]) for c in served]


@pytest.mark.parametrize("mode", ["linked", "dlopen", "ctypes"])
def test_stagger_1_never_overlaps_and_all_serve(mode, standins, supervised, cli, tmp_path):
    cfg = write_config(tmp_path / "node.toml", standins, mode)
    proc = cli("--config", str(cfg), "launch", "--stagger", "1")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    recs = records(supervised)
    assert len(recs) == 4 and all(r["phase"] == "serving" for r in recs.values()), recs
    # The stand-in's own account: four calls, one at a time.
    served = calls(tmp_path / "standin")
    assert len(served) == 4 and all(c["most"] == 1 for c in served), served
    for a, b in itertools.combinations(_windows(served), 2):
        assert a[1] <= b[0] or b[1] <= a[0], f"{a} overlaps {b}"
    # Each engine's state records its registration: how much, how long, how long it waited.
    listed = json.loads(cli("engines", "list", "--json").stdout)
    listed = listed["engines"] if isinstance(listed, dict) else listed
    for engine in listed:
        (reg,) = [r for r in engine["registrations"] if r["kind"] == "register"]
        assert reg["outcome"] == "registered" and reg["bytes"] == SIZE and reg["result"] == 0
        assert reg["call"] == "hipHostRegister" and reg["via"] == ("symbol" if mode == "linked" else "dlsym")
        assert 0.15 < reg["seconds"] < 10
    # All four called at once: three of them waited at the gate.
    assert sum(r["wait_s"] > 0.1 for e in listed for r in e["registrations"]) >= 3, listed
    table = cli("engines", "list").stdout
    assert "REGISTERED" in table and table.count("512.0 MiB in") >= 4, table


@pytest.mark.parametrize("mode", ["linked", "dlopen", "ctypes"])
def test_stagger_4_crashes_and_the_launch_names_sigsegv(mode, standins, supervised, cli, tmp_path):
    cfg = write_config(tmp_path / "node.toml", standins, mode, register_ms=1000)
    proc = cli("--config", str(cfg), "launch", "--stagger", "4")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert "killed by SIGSEGV while registering" in out, out
    assert "Traceback" not in out
    crashed = [r for r in records(supervised).values() if r.get("signal") == "SIGSEGV"]
    assert crashed
    # The registration it died in is on record.
    assert any(reg["outcome"] == "died" for r in crashed for reg in r["registrations"]), crashed


def test_gate_release_ready_holds_until_the_engine_serves(standins, supervised, cli, tmp_path):
    # The engine prints "serving" right after registering; with gate_release = "ready" the next engine's
    # registration may only start once the shim has seen that line.
    cfg = write_config(tmp_path / "node.toml", standins, "dlopen", count=2,
                       engine_keys='ready_pattern = "^serving"\ngate_release = "ready"')
    proc = cli("--config", str(cfg), "launch", "--stagger", "1")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    recs = records(supervised)
    first, second = sorted(recs.values(), key=lambda r: r["registrations"][0]["started_at"])
    assert second["registrations"][0]["started_at"] >= first["phases"]["serving"]
    assert (supervised / "engines" / first["name"] / "gate-ready").exists()


def test_a_hung_registration_is_recorded_and_the_others_go_on(standins, supervised, cli, tmp_path):
    from gpuwarden.ops.engines import control
    from gpuwarden.ops.config.nodeconfig import EngineConfig
    from gpuwarden.ops.foundation.settings import Settings
    from helpers.simnode import wait_for
    (tmp_path / "standin").mkdir()
    settings = Settings(state_dir=supervised)
    env = {"STANDIN_DIR": str(tmp_path / "standin"), "STANDIN_FAULT_AT": "0"}
    stuck = EngineConfig(name="stuck", argv=tuple(engine_argv(standins, "linked")), gpu=0, progress="preload",
                         env={**env, "STANDIN_REGISTER_MS": "60000"}, stop_grace=1)
    fine = EngineConfig(name="fine", argv=tuple(engine_argv(standins, "dlopen")), gpu=1, progress="preload",
                        env={**env, "STANDIN_REGISTER_MS": "50"}, stop_grace=1)
    control.start(settings, stuck, gate_slots=1, registration_timeout=0.5, workdir=None)
    wait_for(lambda: records(supervised).get("stuck", {}).get("registrations"), 20, "stuck to start registering")
    control.start(settings, fine, gate_slots=1, registration_timeout=0.5, workdir=None)
    wait_for(lambda: records(supervised).get("fine", {}).get("phase") == "serving", 20, "fine to serve past the hung one")
    stuck_record = records(supervised)["stuck"]
    assert stuck_record["registrations"][-1]["outcome"] == "hung", stuck_record
    assert "hung" in stuck_record["detail"] and "gate slot was let go" in stuck_record["detail"]
    assert '"action": "engine-register-hung"' in (supervised / "journal.log").read_text()
    listing = cli("engines", "list").stdout
    assert "HUNG" in listing and "stuck: hipHostRegister 512.0 MiB HUNG" in listing, listing


def test_an_engine_the_interposer_cannot_reach_is_named(standins, supervised, cli, tmp_path):
    cfg = tmp_path / "node.toml"
    cfg.write_text('[[engines]]\nname = "static"\nprogress = "preload"\nready_pattern = "^serving"\n'
                   f'argv = ["{standins / "engine_static"}"]\n')
    proc = cli("--config", str(cfg), "launch")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    listing = cli("engines", "list").stdout
    assert "static: the interposer did not load in this engine" in listing, listing


def test_gate_release_seconds_for_log_engines_holds_the_shims_slot(supervised, cli, tmp_path):
    from engines.harness import write_config as write_fake_config
    cfg = write_fake_config(tmp_path / "node.toml", 2, register_s=0.1, log_only=True, engine_keys='gate_release = "1s"')
    proc = cli("--config", str(cfg), "launch", "--stagger", "1")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    first, second = sorted(records(supervised).values(), key=lambda r: r["started_at"])
    # The second engine was started only once the first's slot came back, 1 s after it registered.
    assert second["started_at"] >= first["phases"]["registered"] + 1.0


@pytest.mark.parametrize("ready", [False, True], ids=["no-ready-pattern", "ready-pattern"])
def test_a_failed_registration_fails_the_launch_at_once(ready, standins, supervised, cli, tmp_path):
    # The stand-in returns hipErrorOutOfMemory; the engine ignores it, prints "serving" and serves. The launch must
    # not wait out its timeout (30 s x 2 + 60 here) nor call the engines serving.
    import time
    assert cli("sim", "init", "--gpus", "2", "--vram", "8GiB").returncode == 0
    keys = 'ready_pattern = "^serving"' if ready else ""
    cfg = write_config(tmp_path / "node.toml", standins, "linked", count=2, register_ms=50, engine_keys=keys,
                       gather=False, env_extra={"STANDIN_FAULT_AT": "0", "STANDIN_RESULT": "2"})
    t0 = time.monotonic()
    proc = cli("--config", str(cfg), "launch", "--stagger", "1")
    took = time.monotonic() - t0
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert took < 20, f"the launch took {took:.1f}s"
    assert "hipHostRegister of 512.0 MiB returned hipErrorOutOfMemory (2)" in out, out
    assert "engine(s) serving" not in out and "Traceback" not in out
    failed = [n for n, r in records(supervised).items() if r.get("phase") == "failed-registration"]
    named = [n for n in failed if f"engine {n}: hipHostRegister" in out]
    assert named, (failed, out)
    table = cli("engines", "list").stdout
    assert "failed-registration" in table and "512.0 MiB FAILED" in table, table
    assert f"{named[0]}: hipHostRegister of 512.0 MiB returned hipErrorOutOfMemory (2)" in table, table
    status = cli("--backend", "sim", "status")
    assert status.returncode == 1 and "status: NEEDS ATTENTION" in status.stdout, status.stdout
    assert f"engine {named[0]}: hipHostRegister of 512.0 MiB returned hipErrorOutOfMemory (2)" in status.stdout
    doc = json.loads(cli("--backend", "sim", "status", "--json").stdout)
    assert doc["needs_attention"] is True
    assert {e["name"]: e["phase"] for e in doc["engines"]}[named[0]] == "failed-registration"
    # Stopped, it no longer needs attention.
    assert cli("engines", "stop", "--all", "--yes").returncode == 0
    status = cli("--backend", "sim", "status")
    assert status.returncode == 0 and "status: healthy" in status.stdout, status.stdout
