"""NVIDIA checks: persistence mode and nvidia-persistenced, MIG mode, ECC mode and errors, retired/remapped pages.

Read once per run through NVML (nvidia-ml-py: nvmlDeviceGetPersistenceMode, GetMigMode, GetEccMode,
GetTotalEccErrors, GetRetiredPagesPendingStatus, GetRemappedRows, GetVbiosVersion), or, for a bundle, from the
`nvidia-smi -q -x` report it holds (persistence_mode, mig_mode, ecc_mode, retired_pages, remapped_rows).
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from typing import Any

from gpuwarden.ops.node.backends.nvml import bus_id
from gpuwarden.ops.doctor.model import Result, fail, passed, skip, unknown, warn
from gpuwarden.ops.doctor.node import nvidia_present
from gpuwarden.ops.doctor.probe import CheckIO


def _nvml_gpus(nv: Any) -> list[dict[str, Any]]:
    errors = tuple(e for e in (getattr(nv, "NVMLError", None),) if e) or (Exception,)

    def ask(fn: str, *args: Any) -> Any:
        f = getattr(nv, fn, None)
        if f is None:
            return None
        try:
            value = f(*args)
        except errors:
            return None  # not supported on this GPU or driver
        return value.decode() if isinstance(value, bytes) else value

    enabled = getattr(nv, "NVML_FEATURE_ENABLED", 1)
    gpus = []
    nv.nvmlInit()
    try:
        for i in range(nv.nvmlDeviceGetCount()):
            try:
                h = nv.nvmlDeviceGetHandleByIndex(i)
            except errors as exc:
                gpus.append({"index": i, "error": str(exc)})
                continue
            pci = ask("nvmlDeviceGetPciInfo", h)
            raw_bus = getattr(pci, "busId", None) if pci is not None else None
            persistence = ask("nvmlDeviceGetPersistenceMode", h)
            mig = ask("nvmlDeviceGetMigMode", h)
            ecc = ask("nvmlDeviceGetEccMode", h)
            retired = ask("nvmlDeviceGetRetiredPagesPendingStatus", h)
            remapped = ask("nvmlDeviceGetRemappedRows", h)
            unc = ask("nvmlDeviceGetTotalEccErrors", h, getattr(nv, "NVML_MEMORY_ERROR_TYPE_UNCORRECTED", 1),
                      getattr(nv, "NVML_VOLATILE_ECC", 0))
            gpus.append({
                "index": i, "name": ask("nvmlDeviceGetName", h),
                "bus": bus_id(raw_bus.decode() if isinstance(raw_bus, bytes) else raw_bus),
                "persistence": None if persistence is None else persistence == enabled,
                "mig": None if mig is None else [m == 1 for m in mig],
                "ecc": None if ecc is None else [e == enabled for e in ecc],
                "ecc_uncorrected_volatile": unc,
                "retired_pending": None if retired is None else retired == enabled,
                "remapped": None if remapped is None else {"correctable": remapped[0], "uncorrectable": remapped[1],
                                                           "pending": bool(remapped[2]), "failure": bool(remapped[3])},
                "vbios": ask("nvmlDeviceGetVbiosVersion", h),
            })
    finally:
        try:
            nv.nvmlShutdown()
        except errors:
            pass
    return gpus


def _flag(text: str | None) -> bool | None:
    t = (text or "").strip().lower()
    return True if t in ("enabled", "yes") else False if t in ("disabled", "no") else None


def _int(text: str | None) -> int | None:
    t = (text or "").strip()
    return int(t) if t.isdigit() else None


def parse_smi_xml(text: str) -> list[dict[str, Any]]:
    """`nvidia-smi -q -x` -> the same per-GPU facts NVML gives."""
    root = ET.fromstring(text.strip())
    gpus = []
    for i, g in enumerate(root.findall("gpu")):
        def get(path: str, g: ET.Element = g) -> str | None:
            node = g.find(path)
            return node.text if node is not None else None
        cur_mig, pend_mig = _flag(get("mig_mode/current_mig")), _flag(get("mig_mode/pending_mig"))
        cur_ecc, pend_ecc = _flag(get("ecc_mode/current_ecc")), _flag(get("ecc_mode/pending_ecc"))
        pending = _flag(get("retired_pages/pending_retirement")) or _flag(get("retired_pages/pending_blacklist"))
        rows = g.find("remapped_rows")
        remapped = None
        if rows is not None and rows.find("remapped_row_pending") is not None:
            remapped = {"correctable": _int(get("remapped_rows/remapped_row_corr")),
                        "uncorrectable": _int(get("remapped_rows/remapped_row_unc")),
                        "pending": bool(_flag(get("remapped_rows/remapped_row_pending"))),
                        "failure": bool(_flag(get("remapped_rows/remapped_row_failure")))}
        gpus.append({
            "index": i, "name": get("product_name"), "bus": bus_id(g.get("id")),
            "persistence": _flag(get("persistence_mode")),
            "mig": None if cur_mig is None else [cur_mig, bool(pend_mig)],
            "ecc": None if cur_ecc is None else [cur_ecc, bool(pend_ecc)],
            "ecc_uncorrected_volatile": _int(get("ecc_errors/volatile/dram_uncorrectable"))
            or _int(get("ecc_errors/volatile/double_bit/total")),
            "retired_pending": pending,
            "remapped": remapped,
            "vbios": get("vbios_version"),
        })
    return gpus


def nvidia_facts(io: CheckIO) -> dict[str, Any]:
    """{"source", "gpus": [...]} or {"error"}: NVML on the live node, the bundle's nvidia-smi report otherwise."""
    xml_path = io.probe.extra.get("nvidia_smi_xml")
    if xml_path:
        io.note("nvidia-smi -q -x (in the bundle)")
    elif io.live:
        io.note("NVML (nvidia-ml-py)")

    def collect() -> dict[str, Any]:
        if xml_path:
            try:
                with open(xml_path, encoding="utf-8", errors="replace") as f:
                    return {"source": "nvidia-smi -q -x", "gpus": parse_smi_xml(f.read())}
            except (OSError, ET.ParseError) as exc:
                return {"error": f"the bundle's nvidia-smi report does not parse ({exc})"}
        if not io.live:
            return {"error": "not in this tree (NVML answers only on the live node; a bundle keeps nvidia-smi -q -x)"}
        nv = io.probe.extra.get("pynvml")
        if nv is None:
            try:
                # only a check of a live NVIDIA node asks NVML
                # deferred: vendor library (nvidia-ml-py), imported where used as libload imports its own
                import pynvml as nv  # type: ignore[no-redef]
            except ImportError:
                return {"error": "nvidia-ml-py (pynvml) is not installed"}
        try:
            return {"source": "NVML", "gpus": _nvml_gpus(nv)}
        except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded, ... all mean: cannot ask
            return {"error": f"NVML: {exc}"}
    return io.shared("nvidia_facts", collect)


def _gpus_or(io: CheckIO) -> list[dict[str, Any]] | Result:
    """The GPUs NVML (or the bundle's nvidia-smi report) describes; the check's answer when there are none to ask."""
    if not nvidia_present(io):
        return skip("no NVIDIA driver loaded")
    facts = nvidia_facts(io)
    if "error" in facts:
        return unknown(facts["error"], "install nvidia-ml-py, or run on the node itself")
    return [g for g in facts["gpus"] if "error" not in g]


def _label(g: dict[str, Any]) -> str:
    return f"GPU {g['index']}"


def check_persistence(io: CheckIO) -> Result:
    gpus = _gpus_or(io)
    if isinstance(gpus, Result):
        return gpus
    off = [_label(g) for g in gpus if g.get("persistence") is False]
    known = [g for g in gpus if g.get("persistence") is not None]
    details = {"persistence": {_label(g): g.get("persistence") for g in gpus}}
    if off:
        return warn(f"persistence mode off on {', '.join(off)}: the driver tears the GPU's state down whenever its "
                    "last client exits, so every engine start and every nvidia-smi call initializes it again "
                    "(seconds each) and settings made in between are lost",
                    "systemctl enable --now nvidia-persistenced  (NVIDIA's supported way; `nvidia-smi -pm 1` is the "
                    "legacy one)", **details)
    if not known:
        return unknown("persistence mode not reported for any GPU", **details)
    return passed(f"persistence mode on for all {len(known)} GPU(s)", **details)


def _persistenced_pids(io: CheckIO) -> list[int]:
    """PIDs whose command name is nvidia-persistenced (the kernel keeps 15 characters: nvidia-persiste)."""
    io.note("/proc/<pid>/stat")
    found = []
    for name in io.listdir("proc", ""):
        if not name.isdigit():
            continue
        try:  # not io.text: thousands of stat files would each be recorded as read
            with open(io.path("proc", f"{name}/stat", record=False), "rb") as f:
                stat = f.read(512).decode(errors="replace")
        except OSError:
            continue
        comm = stat[stat.find("(") + 1:stat.rfind(")")]
        if comm.startswith("nvidia-persiste"):
            found.append(int(name))
    return found


def check_persistenced(io: CheckIO) -> Result:
    if not nvidia_present(io):
        return skip("no NVIDIA driver loaded")
    pids = _persistenced_pids(io)
    if pids:
        return passed(f"nvidia-persistenced runs (pid {', '.join(map(str, pids))}). It keeps the GPU device files "
                      "open, so `nvidia-smi -r` (and `gpuwarden reset` on NVIDIA) fails with \"In use by another "
                      "client\" until it is stopped: systemctl stop nvidia-persistenced, reset, then start it again",
                      pids=pids)
    gpus = _gpus_or(io)
    if not isinstance(gpus, Result) and gpus and all(g.get("persistence") for g in gpus):
        return passed("nvidia-persistenced is not running; persistence mode is on (legacy `nvidia-smi -pm 1`), "
                      "which NVIDIA replaced with the daemon", pids=[])
    return warn("nvidia-persistenced is not running", "systemctl enable --now nvidia-persistenced", pids=[])


def check_mig(io: CheckIO) -> Result:
    gpus = _gpus_or(io)
    if isinstance(gpus, Result):
        return gpus
    pending = [f"{_label(g)} ({'on' if g['mig'][0] else 'off'} -> {'on' if g['mig'][1] else 'off'})"
               for g in gpus if g.get("mig") and g["mig"][0] != g["mig"][1]]
    on = [_label(g) for g in gpus if g.get("mig") and g["mig"][0]]
    details = {"mig": {_label(g): g.get("mig") for g in gpus}}
    if pending:
        return warn(f"MIG mode change pending on {', '.join(pending)}: it takes effect only after a GPU reset",
                    "drain the GPU, then nvidia-smi -r -i <gpu> (stop nvidia-persistenced first) or reboot", **details)
    if on:
        return passed(f"MIG on for {', '.join(on)}: each instance is its own device; per-process VRAM inside an "
                      "instance is not visible to NVML, so gpuwarden shows it as unknown", **details)
    return passed("MIG off (or not supported) on every GPU", **details)


def check_ecc(io: CheckIO) -> Result:
    gpus = _gpus_or(io)
    if isinstance(gpus, Result):
        return gpus
    details = {"ecc": {_label(g): {"mode": g.get("ecc"), "uncorrected_volatile": g.get("ecc_uncorrected_volatile")}
                       for g in gpus}}
    errors = [f"{_label(g)} {g['ecc_uncorrected_volatile']}" for g in gpus if g.get("ecc_uncorrected_volatile")]
    if errors:
        return fail(f"uncorrected ECC errors since the driver loaded: {', '.join(errors)}",
                    "drain the GPU and reset it (nvidia-smi -r -i <gpu>); if they return, it needs service",
                    **details)
    pending = [_label(g) for g in gpus if g.get("ecc") and g["ecc"][0] != g["ecc"][1]]
    if pending:
        return warn(f"ECC mode change pending on {', '.join(pending)}: it takes effect after a reset or reboot",
                    "drain, then nvidia-smi -r -i <gpu>, or reboot", **details)
    off = [_label(g) for g in gpus if g.get("ecc") and not g["ecc"][0]]
    if off:
        return warn(f"ECC off on {', '.join(off)}: memory errors go undetected",
                    "nvidia-smi -e 1 -i <gpu>, then reset or reboot", **details)
    if not any(g.get("ecc") for g in gpus):
        return passed("ECC not supported on these GPUs", **details)
    return passed("ECC on, no pending change, no uncorrected errors", **details)


def check_pages(io: CheckIO) -> Result:
    gpus = _gpus_or(io)
    if isinstance(gpus, Result):
        return gpus
    failed, pending, unc = [], [], []
    for g in gpus:
        rows = g.get("remapped") or {}
        if rows.get("failure"):
            failed.append(_label(g))
        if rows.get("pending") or g.get("retired_pending"):
            pending.append(_label(g))
        if rows.get("uncorrectable"):
            unc.append(f"{_label(g)} {rows['uncorrectable']}")
    details = {"pages": {_label(g): {"remapped": g.get("remapped"), "retired_pending": g.get("retired_pending")}
                         for g in gpus}}
    if failed:
        return fail(f"row remapping failed on {', '.join(failed)}: no spare rows left; the GPU needs service",
                    "drain it and contact your vendor (RMA)", **details)
    if pending:
        return fail(f"memory pages waiting to be retired/remapped on {', '.join(pending)}: until a reset, the bad "
                    "rows stay in use", "drain the GPU, then nvidia-smi -r -i <gpu> (or reboot)", **details)
    if unc:
        return warn(f"rows remapped after uncorrectable errors: {', '.join(unc)}; the GPU is usable, but watch it",
                    **details)
    if not any(g.get("remapped") or g.get("retired_pending") is not None for g in gpus):
        return passed("no retired/remapped page counters reported (MIG on, or GPUs without them)", **details)
    return passed("no pages pending retirement or remapping", **details)
