"""Every command's line in its group's `--help` list is a whole sentence (issue 36: Click cut each at the list's
width, "Show GPUs, their processes, residual VRAM with its holders,...")."""

from __future__ import annotations

import re

import pytest
from helpers.cli import gpuwarden

from gpuwarden.playbooks.cli.summaries import SUMMARIES

GROUPS = ((), ("engines",), ("arena",), ("config",), ("baseline",), ("sim",), ("fleet",))


def listed(args: tuple[str, ...], columns: int) -> dict[str, str]:
    """The Commands list of `gpuwarden ARGS --help` (plain or Rich-boxed), command -> its summary."""
    out = gpuwarden(*args, "--help", env={"COLUMNS": str(columns), "NO_COLOR": "1"}, check=True).stdout
    rows: dict[str, str] = {}
    inside, last = False, None
    for line in out.splitlines():
        plain = line.replace("│", " ").rstrip()
        if re.match(r"^(╭─ )?Commands", line.strip()):
            inside = True
            continue
        if not inside or line.strip().startswith("╰") or not plain.strip():
            inside = inside and not line.strip().startswith("╰")
            continue
        m = re.match(r"^\s{1,3}(\S+)\s{2,}(.*)$", plain)
        if m:
            last = m.group(1)
            rows[last] = m.group(2).strip()
        elif last is not None:
            rows[last] += " " + plain.strip()
    return rows


@pytest.mark.parametrize("columns", [80, 100])
@pytest.mark.parametrize("group", GROUPS, ids=lambda g: " ".join(g) or "root")
def test_every_summary_in_a_help_list_is_a_whole_sentence(group, columns):
    rows = listed(group, columns)
    assert rows, group
    for name, summary in rows.items():
        assert not summary.endswith("..."), (group, name, summary)
        assert summary[-1] in ".?)", (group, name, summary)


def test_the_summaries_name_real_commands_and_fit_the_root_list():
    root = listed((), 80)
    for key, text in SUMMARIES.items():
        assert len(text) <= 60, key
        group, _, name = key.rpartition(" ")
        assert name in (listed(tuple(group.split()), 80) if group else root), key
