

def test_the_tui_arena_panel_shows_each_engines_ledger():
    from gpuwarden.ops.model import snapshot_from_dict
    from gpuwarden.tui.widgets.arena import ArenaPanel
    from rich.text import Text
    GiB = 1 << 30
    engine = {"name": "dp2", "gpu": 2, "phase": "serving", "pid": 412, "stale": False,
              "registrations": [{"kind": "register", "call": "hipHostRegister", "bytes": 25 * GiB,
                                 "outcome": "registered", "started_at": 10.0, "seconds": 3.0, "result": 0, "pid": 412}],
              "host_ledger": {"pinned_bytes": 2 * GiB, "peak_bytes": 4 * GiB, "failed": 1, "processes": {"412": {}},
                              "failures": [{"kind": "alloc", "call": "hipHostMalloc", "bytes": 8 * GiB, "result": 2,
                                            "ts": 20.0, "flags": 0, "pid": 412, "via": "symbol"}]}}
    quiet = {"name": "dp3", "gpu": 3, "phase": "serving", "pid": 413, "stale": False}
    snap = snapshot_from_dict({"taken_at": 30.0, "hostname": "h", "backend": "sim", "simulated": True,
                               "engines": [engine, quiet]})
    t = Text()
    ArenaPanel()._ledger(t, snap)
    shown = t.plain
    assert "KFD ledger (registered + pinned)" in shown
    assert "dp2 GPU2 25.0 GiB + 2.0 GiB (peak 4.0 GiB)" in shown, shown
    assert "1 failed, last hipHostMalloc of 8.0 GiB: hipErrorOutOfMemory (2)" in shown, shown
    assert "dp3" not in shown  # nothing reported: no line
