"""The JSON contract: documents name their schema, the published schemas load, errors under --json are JSON."""

from __future__ import annotations

import json


from gpuwarden.ops.foundation import jsondoc


def test_an_error_under_json_is_a_json_document_on_stdout(cli):
    proc = cli("--backend", "nope", "status", "--json")
    assert proc.returncode == 2
    doc = json.loads(proc.stdout)
    jsondoc.validate(doc)
    assert doc["error"] == "unknown backend 'nope'" and doc["exit_code"] == 2
    assert "gpuwarden: error: unknown backend" in proc.stderr
