"""MI300 partitions in `status`: on a real CPX sim node (two physical devices of eight logical GPUs), the text
report and `status --json` map each logical GPU to its physical device, keep VRAM and residual per partition and
say that a reset acts on the device; a node without partitions prints and carries what it did before.
"""

from __future__ import annotations

import json

from gpuwarden.ops.foundation import jsondoc
from gpuwarden.ops.foundation.model import snapshot_from_dict

SIM_NODE = {"gpus": 16, "vram": "24GiB", "partition": "CPX"}


def test_status_groups_cpx_partitions_under_their_physical_device(sim_cli):
    sim_cli("sim", "leak", "--gpu", "9", "--size", "2GiB", check=True)
    text = sim_cli("status", env={"COLUMNS": "120"}).stdout
    lines = text.splitlines()
    devs = [i for i, line in enumerate(lines) if line.startswith("dev  ")]
    assert len(devs) == 2, text
    first, second = lines[devs[0]], lines[devs[1]]
    assert "0000:10:00.0 CPX/NPS4" in first and "8 partitions" in first and "reset: all 8" in first
    assert "on 1 of 8" in second and "-" in first.split("8 partitions")[1].split("reset")[0]
    # The eight partitions follow their device's row, each with its own VRAM and residual.
    rows = lines[devs[1] + 1:devs[1] + 9]
    assert [r.split()[0] for r in rows] == [str(i) for i in range(8, 16)]
    assert "└ CPX 1" in rows[1] and "2.0 GiB" in rows[1] and "RESIDUAL!" in rows[1]
    assert "RESIDUAL!" not in "".join(rows[:1] + rows[2:])
    assert ("device 0000:11:00.0: GPUs 8-15 are its 8 CPX partitions, memory NPS4; VRAM and residual are per "
            "partition; a reset acts on the physical device: all 8 together") in text


def test_status_json_maps_each_logical_gpu_to_its_physical_device(sim_cli):
    sim_cli("sim", "leak", "--gpu", "9", "--size", "2GiB", check=True)
    proc = sim_cli("status", "--json")
    doc = json.loads(proc.stdout)
    jsondoc.validate(doc)  # the snapshot schema, physical_device included
    gpus = {g["index"]: g for g in doc["gpus"]}
    assert len(gpus) == 16
    nine = gpus[9]["physical_device"]
    assert nine == {"bus_id": gpus[9]["bus_id"], "partition": 1, "gpus": list(range(8, 16)), "reset_scope": "device"}
    assert gpus[0]["physical_device"]["gpus"] == list(range(8)) and gpus[0]["bus_id"] != gpus[9]["bus_id"]
    assert {gpus[i]["bus_id"] for i in range(8, 16)} == {nine["bus_id"]}
    residual = {r["gpu_index"]: r for r in doc["residual"]}
    assert residual[9]["residual"] == 2 << 30 and residual[9]["significant"] and not residual[8]["significant"]
    assert gpus[9]["vram_total"] == 24 << 30 and gpus[9]["vram_used"] >= 2 << 30  # per partition, not summed
    # An old reader (and a bundle replay) reads the document as before: the field is derived, not stored.
    again = snapshot_from_dict(doc)
    assert json.loads(again.to_json())["gpus"][9]["physical_device"] == nine


def test_a_node_without_partitions_shows_no_device_rows(cli):
    cli("sim", "init", "--gpus", "2", "--force", check=True)
    text = cli("--backend", "sim", "status").stdout
    assert not [line for line in text.splitlines() if line.startswith(("dev  ", "device "))] and "└" not in text
    doc = json.loads(cli("--backend", "sim", "status", "--json").stdout)
    assert all("physical_device" not in g for g in doc["gpus"])
