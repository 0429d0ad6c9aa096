"""`gpuwarden journal`: every playbook step and signal is there, oldest first, as text or JSON lines."""

from __future__ import annotations

import json


def test_journal_shows_the_playbook_steps(cli):
    assert "journal is empty" in cli("journal").stdout
    cli("--backend", "sim", "sim", "init", "--gpus", "2", check=True)
    cli("--backend", "sim", "drain", "1", "--yes", "--timeout", "1", check=True)
    cli("--backend", "sim", "undrain", "1", check=True)
    lines = [json.loads(line) for line in cli("journal", "--json", "--tail", "0").stdout.splitlines()]
    assert [(e["action"], e["result"]) for e in lines] == [
        ("drain", "started"), ("drain:mark", "ok"), ("drain:stop-engines", "skipped"),
        ("drain:wait-idle", "ok"), ("drain", "ok"),
        ("undrain", "started"), ("undrain:unmark", "ok"), ("undrain", "ok")]
    assert all(e["who"] and e["host"] and e["time"] for e in lines)
    text = cli("journal", "--tail", "2").stdout.splitlines()
    assert len(text) == 2 and "undrain:unmark" in text[0] and "GPU 1 is back in service" in text[0]
