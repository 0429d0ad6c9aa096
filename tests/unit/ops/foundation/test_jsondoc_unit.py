"""The unit half of tests/integration/ops/foundation/test_jsondoc.py (its tests that need no process, socket or server); the pair's subject:
The JSON contract: documents name their schema, the published schemas load, errors under --json are JSON."""

from __future__ import annotations

import json

import pytest

from gpuwarden.ops.foundation import jsondoc


def test_every_published_schema_is_a_valid_json_schema():
    import jsonschema
    files = sorted(jsondoc.SCHEMA_DIR.glob("*.v*.json"))
    assert files, "no schemas published in ops/schemas"
    for f in files:
        schema = json.loads(f.read_text())
        jsonschema.validators.validator_for(schema).check_schema(schema)
        name, version = f.name[:-len(".json")].rsplit(".v", 1)
        assert schema["$id"] == jsondoc.schema_id(name, int(version)), f


def test_validate_names_the_place_that_breaks_the_schema():
    jsondoc.validate(jsondoc.error_document("disk full", None, 2))
    bad = jsondoc.error_document("disk full", None, 2)
    bad["exit_code"] = "two"
    with pytest.raises(ValueError, match="exit_code"):
        jsondoc.validate(bad)
    with pytest.raises(ValueError, match="unknown schema"):
        jsondoc.validate({"schema": "gpuwarden.nosuch/9"})


def test_iso_is_utc_with_milliseconds():
    assert jsondoc.iso(0) == "1970-01-01T00:00:00.000Z"
    assert jsondoc.iso(None) is None
