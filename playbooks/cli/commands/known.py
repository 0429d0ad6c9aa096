"""CLI: `gpuwarden known [QUERY]` — the catalog of known issues: list it, search it, or show one entry in full.

Exit 0 when something matched, 1 when nothing did (like grep), 2 on bad input.
"""

from __future__ import annotations

import sys
from typing import List, Optional

import typer

from gpuwarden.ops.foundation.jsondoc import dumps


def register(app: typer.Typer) -> None:
    @app.command("known")
    def known_cmd(
        words: Optional[List[str]] = typer.Argument(None, metavar="[ID|WORDS...]",
                                              help="An entry id (shown in full), or words every listed entry must "
                                                   "contain (any case); nothing lists the whole catalog."),
        json_out: bool = typer.Option(False, "--json", help="Print a gpuwarden.known/1 document."),
        topic: Optional[str] = typer.Option(None, "--topic", help="Only entries of this topic (e.g. arena)."),
    ) -> None:
        """Known GPU-node issues from public trackers (ROCm, amdgpu, NVIDIA, vLLM, PyTorch...): signature, meaning,
        upstream link, what maintainers said, workaround, fixed-in; and the alternatives for sharing one host buffer.

        `triage`, `doctor` and `report` cite the entries a finding matches; this command reads the catalog itself.
        """
        query = " ".join(words) if words else None
        # deferred: the CLI imports every command module at start; this code loads only when the command runs
        from gpuwarden.ops.knowledge import load
        from gpuwarden.ops.knowledge.render import as_document, entry_text, listing
        cat = load()
        exact = cat.get(query) if query else None
        entries = [exact] if exact is not None else cat.search(query)
        if topic:
            entries = [e for e in entries if topic in e.topics]
        if json_out:
            sys.stdout.write(dumps(as_document(query, entries, len(cat)), indent=2) + "\n")
        elif not entries:
            sys.stderr.write(f"no known issue matches {query!r}" + (f" in topic {topic!r}" if topic else "")
                             + ": `gpuwarden known` lists them all\n")
        elif exact is not None:
            sys.stdout.write(entry_text(exact))
        else:
            sys.stdout.write(listing(entries))
            sys.stdout.write(f"({len(entries)} of {len(cat)}; `gpuwarden known ID` shows one in full)\n")
        raise typer.Exit(0 if entries else 1)
