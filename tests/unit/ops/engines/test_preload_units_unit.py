"""The unit half of tests/integration/ops/engines/test_preload_units.py (its tests that need no process, socket or server); the pair's subject:
The interposer's Python side without engines: config keys, registration records, the build's one-line error."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuwarden.ops.engines import preload
from gpuwarden.ops.engines.registrations import RegistrationLog, describe, latest
from gpuwarden.ops.engines.state import registrations_of
from gpuwarden.ops.foundation.errors import ConfigError
from gpuwarden.ops.config.nodeconfig import parse
from gpuwarden.ops.foundation.status_protocol import parse_line

ENGINE = '[[engines]]\nname = "e0"\nargv = ["serve"]\n'


@pytest.mark.parametrize("keys, release, threshold", [
    ('progress = "preload"\n', "registered", 256 << 20),
    ('progress = "preload"\ngate_release = "ready"\nready_pattern = "^up"\n', "ready", 256 << 20),
    ('progress = "preload"\ngate_release = "45s"\nregister_threshold = "1GiB"\n', "45s", 1 << 30),
    ('progress = "log"\nregistered_pattern = "x"\ngate_release = "2.5s"\n', "2.5s", 256 << 20),
])
def test_preload_config_keys(keys, release, threshold):
    engine = parse(ENGINE + keys, Path("n.toml")).engines[0]
    assert (engine.gate_release, engine.register_threshold) == (release, threshold)


@pytest.mark.parametrize("keys, line, words", [
    ('progress = "preload"\ngate_release = "ready"\n', 5, ["gate_release", "needs ready_pattern"]),
    ('gate_release = "30s"\n', 4, ["gate_release", '"preload" or "log"']),
    ('progress = "preload"\ngate_release = "later"\n', 5, ["must be", "later"]),
    ('progress = "preload"\nregister_threshold = "lots"\n', 5, ["register_threshold", "lots"]),
    ('progress = "preloaded"\n', 4, ["progress", "preload"]),
])
def test_preload_config_errors_name_line_and_key(keys, line, words):
    with pytest.raises(ConfigError) as err:
        parse(ENGINE + keys, Path("n.toml"))
    assert err.value.message.startswith(f"n.toml:{line}: engines[0].")
    assert all(w in err.value.message for w in words), err.value.message


def _feed(log: RegistrationLog, *lines: str) -> None:
    for line in lines:
        log.on_event(parse_line(line))


def test_registration_records_follow_the_events():
    log = RegistrationLog()
    _feed(log,
          '{"phase":"registering","ts":100.0,"pid":7,"source":"preload","call":"hipHostRegister","bytes":1024,'
          '"slot":0,"wait_s":2.5,"via":"dlsym"}',
          '{"phase":"register-hung","ts":160.0,"pid":7,"source":"preload","call":"hipHostRegister","seconds":60.0}')
    (rec,) = log.records
    assert rec["outcome"] == "hung" and rec["wait_s"] == 2.5 and log.running() == [rec]
    _feed(log, '{"phase":"registered","ts":170.0,"pid":7,"source":"preload","call":"hipHostRegister","bytes":1024,'
               '"seconds":70.0,"result":0,"late":true}')
    assert rec["outcome"] == "registered" and rec["seconds"] == 70.0 and rec["late"] and log.running() == []
    _feed(log, '{"phase":"registering","ts":200.0,"pid":8,"source":"preload","call":"cudaHostRegister","bytes":5}')
    assert log.died(203.0) and log.records[-1]["outcome"] == "died" and log.records[-1]["seconds"] == 3.0
    # An engine that only says "registered" (the canary) still gets a record.
    _feed(log, '{"phase":"registered","ts":300.0,"pid":9,"bytes":64,"seconds":4.0}')
    assert log.records[-1]["outcome"] == "registered" and log.records[-1]["started_at"] == 296.0
    regs = registrations_of({"registrations": log.records})
    assert [r.outcome for r in regs] == ["registered", "died", "registered"]
    assert describe(regs[0]) == "1.0 KiB in 70.0s, waited 2.5s"
    assert describe(regs[1]) == "5 B died in call after 3.0s"
    assert latest(regs).pid == 9


def test_records_are_capped():
    log = RegistrationLog()
    for i in range(50):
        _feed(log, f'{{"phase":"registering","ts":{i},"pid":{i},"bytes":1}}')
    assert len(log.records) == 32 and log.records[0]["pid"] == 18


def test_engine_env_puts_the_interposer_first():
    from gpuwarden.ops.config.nodeconfig import EngineConfig
    engine = EngineConfig(name="e", argv=("x",), progress="preload", gate_release="ready")
    env = preload.engine_env(engine, {"LD_PRELOAD": "/opt/libjemalloc.so"}, Path("/run/e/gate-ready"), 90)
    assert env["LD_PRELOAD"] == f"{preload.LIBRARY} /opt/libjemalloc.so"
    assert env["GPUWARDEN_GATE_RELEASE"] == "ready" and env["GPUWARDEN_REGISTRATION_TIMEOUT"] == "90"
    assert env["GPUWARDEN_PRELOAD_THRESHOLD"] == str(256 << 20)


def test_the_arena_panel_shows_who_registered_how_much_how_fast(settings):
    import asyncio
    import dataclasses

    from helpers.tui_support import GIB, TAKEN_AT, fixed_snapshot, make_app, screen_text, wait_for

    from gpuwarden.ops.foundation.model import Registration
    base = fixed_snapshot()
    done = Registration(kind="register", call="hipHostRegister", bytes=64 * GIB, outcome="registered",
                        started_at=TAKEN_AT - 60, seconds=12.3, wait_s=3.1, result=0, pid=5000, via="dlsym")
    hung = dataclasses.replace(done, outcome="hung", seconds=600.0, pid=5002)
    engines = (dataclasses.replace(base.engines[0], registrations=(done,)),
               dataclasses.replace(base.engines[2], registrations=(hung,)), *base.engines[1:2])
    snap = dataclasses.replace(base, engines=engines)

    async def go():
        app = make_app(settings, source=lambda: snap, read_only=True)
        async with app.run_test(size=(160, 40)) as pilot:
            await wait_for(pilot, lambda: "dp0 GPU0" in screen_text(app), what="the engines drawn")
            text = screen_text(app)
            assert "dp0 GPU0 64.0 GiB in 12.3s, waited 3.1s" in text, text
            assert "dp2 GPU2 64.0 GiB HUNG 600s" in text, text
    asyncio.run(go())


def test_registrations_survive_the_snapshot_json_round_trip():
    import dataclasses

    from helpers.tui_support import fixed_snapshot

    from gpuwarden.ops.foundation.model import Registration, snapshot_from_dict
    reg = Registration(kind="register", call="cudaHostRegister", bytes=5, outcome="registered", started_at=1.0)
    snap = fixed_snapshot()
    snap = dataclasses.replace(snap, engines=(dataclasses.replace(snap.engines[0], registrations=(reg,)),))
    assert snapshot_from_dict(snap.to_dict()) == snap
