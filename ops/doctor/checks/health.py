"""GPU health checks: firmware equal across GPUs of one model, XGMI hives complete, RAS error counters at zero.

Formats: amdgpu_ucode.c exposes device/fw_version/<block>_fw_version (one value per file); amdgpu_ras.c
device/ras/<block>_err_count reads "ue: N\\nce: N\\n" (UMC adds "de: N", deferred) or "Query currently inaccessible";
KFD topology: properties hive_id, io_links/N/properties "type 11" = CRAT_IOLINK_TYPE_XGMI (kfd_crat.h), node_to.
"""

from __future__ import annotations

from collections import defaultdict

from gpuwarden.ops.doctor.model import Result, fail, passed, skip, unknown, warn
from gpuwarden.ops.doctor.node import AmdGpu, amd_gpus, device_model, nvidia_present
from gpuwarden.ops.doctor.probe import CheckIO
from gpuwarden.ops.doctor.checks.nvidia import nvidia_facts

XGMI = 11


def _amd_firmware(io: CheckIO, gpu: AmdGpu) -> dict[str, str]:
    out = {}
    for name in io.listdir("gpu", f"{gpu.dev}/fw_version"):
        value = io.line("gpu", f"{gpu.dev}/fw_version/{name}")
        if value is not None:
            out[name] = value
    vbios = io.line("gpu", f"{gpu.dev}/vbios_version")
    if vbios:
        out["vbios_version"] = vbios
    return out


def check_firmware(io: CheckIO) -> Result:
    models: dict[str, dict[str, dict[str, str]]] = defaultdict(dict)  # model -> GPU label -> {block: version}
    for gpu in amd_gpus(io):
        if gpu.dev:
            fw = _amd_firmware(io, gpu)
            if fw:
                models[device_model(io, gpu)][f"GPU {gpu.index}"] = fw
    if nvidia_present(io):
        facts = nvidia_facts(io)
        for g in facts.get("gpus", []):
            if g.get("vbios"):
                models[g.get("name") or "NVIDIA GPU"][f"GPU {g['index']}"] = {"vbios": g["vbios"]}
    if not models:
        return skip("no firmware versions readable (no amdgpu fw_version files, no NVIDIA VBIOS)")
    differ = []
    for model, gpus in models.items():
        if len(gpus) < 2:
            continue
        blocks = sorted({b for fw in gpus.values() for b in fw})
        for block in blocks:
            values = {label: fw.get(block, "-") for label, fw in gpus.items()}
            if len(set(values.values())) > 1:
                counts = defaultdict(list)
                for label, v in values.items():
                    counts[v].append(label)
                shown = "; ".join(f"{v} on {', '.join(labels)}" for v, labels in counts.items())
                differ.append(f"{model}: {block} differs ({shown})")
    details = {"models": {m: g for m, g in models.items()}}
    if differ:
        return warn("firmware differs between GPUs of one model: " + " | ".join(differ) + ". Mixed firmware "
                    "behaves differently under the same driver (resets, RAS, XGMI) and is a common cause of one "
                    "GPU misbehaving", "update every GPU to one firmware package (the vendor's IFWI/VBIOS bundle), "
                    "then reboot", **details)
    n = sum(len(g) for g in models.values())
    return passed(f"firmware equal across the GPUs of each model ({n} GPU(s), {len(models)} model(s))", **details)


def _xgmi_peers(io: CheckIO, node: int) -> list[int]:
    base = f"class/kfd/kfd/topology/nodes/{node}/io_links"
    peers = []
    for link in io.listdir("gpu", base):
        props = {}
        for line in (io.text("gpu", f"{base}/{link}/properties") or "").splitlines():
            parts = line.split()
            if len(parts) == 2 and parts[1].lstrip("-").isdigit():
                props[parts[0]] = int(parts[1])
        if props.get("type") == XGMI and "node_to" in props:
            peers.append(props["node_to"])
    return peers


def check_xgmi(io: CheckIO) -> Result:
    hives: dict[int, list[AmdGpu]] = defaultdict(list)
    for gpu in amd_gpus(io):
        if gpu.props.get("hive_id"):
            hives[gpu.props["hive_id"]].append(gpu)
    if not hives:
        return skip("no XGMI hive (no GPU with a hive_id: PCIe-connected GPUs)")
    problems, shown, details = [], [], {}
    present_nodes = {g.kfd_node for g in amd_gpus(io)}
    for hive_id, members in hives.items():
        links = {g.index: _xgmi_peers(io, g.kfd_node) for g in members if g.kfd_node is not None}
        expected = max((len(p) + 1 for p in links.values()), default=len(members))
        missing_peers = sorted({n for peers in links.values() for n in peers if n not in present_nodes})
        details[f"0x{hive_id:x}"] = {"members": [g.index for g in members], "expected": expected,
                                     "xgmi_links": links, "missing_peer_nodes": missing_peers}
        label = f"hive 0x{hive_id:x}"
        if len(members) < expected or missing_peers:
            problems.append(f"{label}: {len(members)} of {expected} GPUs present"
                            + (f" (links point at KFD nodes {missing_peers} that are not there)" if missing_peers else ""))
        elif len({len(p) for p in links.values()}) > 1:
            problems.append(f"{label}: GPUs see different numbers of XGMI peers "
                            f"({', '.join(f'GPU {i}: {len(p)}' for i, p in links.items())}): a link is down")
        else:
            shown.append(f"{label}: {len(members)} GPUs" + ("" if links else " (links not in this tree)"))
    if problems:
        return fail("XGMI hive incomplete: " + "; ".join(problems) + ". A GPU missing from its hive did not "
                    "initialize (or fell off the bus); collectives across the hive fail or fall back to PCIe",
                    "look for the missing GPU in `dmesg | grep -i -e xgmi -e amdgpu` and `lspci -d 1002:`; a cold "
                    "reboot usually brings it back, otherwise it is a hardware case", **details)
    return passed("; ".join(shown), **details)


def parse_ras(text: str) -> dict[str, int] | None:
    """'ue: 0\\nce: 3\\n' -> {'ue': 0, 'ce': 3}; None for 'Query currently inaccessible' or anything else."""
    out = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and value.strip().isdigit():
            out[key.strip()] = int(value)
    return out or None


def check_ras(io: CheckIO) -> Result:
    counts: dict[str, dict[str, dict[str, int]]] = {}
    inaccessible, bad_pages = [], {}
    any_ras = False
    for gpu in amd_gpus(io):
        if not gpu.dev:
            continue
        names = io.listdir("gpu", f"{gpu.dev}/ras")
        any_ras = any_ras or bool(names)
        for name in names:
            if name.endswith("_err_count"):
                text = io.text("gpu", f"{gpu.dev}/ras/{name}")
                parsed = parse_ras(text or "")
                if parsed is None:
                    inaccessible.append(f"GPU {gpu.index} {name}")
                else:
                    counts.setdefault(f"GPU {gpu.index}", {})[name[:-len("_err_count")]] = parsed
        pages = io.text("gpu", f"{gpu.dev}/ras/gpu_vram_bad_pages")
        if pages is not None:
            bad_pages[f"GPU {gpu.index}"] = sum(1 for line in pages.splitlines() if line.strip())
    if not any_ras:
        return skip("no RAS counters (a GPU without RAS/ECC, or RAS turned off with amdgpu.ras_enable=0)")
    ue = [f"{g} {block} ue={c['ue']}" for g, blocks in counts.items() for block, c in blocks.items() if c.get("ue")]
    ce = [f"{g} {block} ce={c['ce']}" for g, blocks in counts.items() for block, c in blocks.items() if c.get("ce")]
    de = [f"{g} {block} de={c['de']}" for g, blocks in counts.items() for block, c in blocks.items() if c.get("de")]
    details = {"counts": counts, "inaccessible": inaccessible, "bad_pages": bad_pages}
    if ue:
        return fail(f"uncorrectable errors: {', '.join(ue)}. Data on that GPU may have been corrupted and the driver "
                    "may reset it; this is hardware", "drain it (gpuwarden drain <gpu>), take a bundle "
                    "(gpuwarden bundle), and have it checked (amd-smi ras / your vendor); bad VRAM pages are "
                    "retired at the next driver load", **details)
    if ce or de:
        return warn(f"corrected errors: {', '.join(ce + de)}; the hardware fixed them, but a rising count "
                    "precedes uncorrectable ones", "watch the count (gpuwarden doctor --only ras); if it climbs, "
                    "drain the GPU and have it checked", **details)
    if inaccessible and not counts:
        return unknown(f"the RAS counters could not be queried: {', '.join(inaccessible)}", **details)
    blocks = sum(len(b) for b in counts.values())
    return passed(f"no RAS errors in {blocks} counter(s) on {len(counts)} GPU(s)", **details)
