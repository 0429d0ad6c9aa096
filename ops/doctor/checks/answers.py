"""Does every GPU answer its driver's reads in time: the readings `status` takes, each under the read deadline.

A wedged GPU (a hung SMU, a stuck ring) blocks sysfs, amdsmi and NVML reads in the kernel; this check names the GPU
and the file or call that did not answer, as `status` does (gpuwarden.ops.foundation.deadline).
"""

from __future__ import annotations

from gpuwarden.ops.foundation.errors import BackendUnavailable, GpuwardenError
from gpuwarden.ops.node.backends.select import open_backend
from gpuwarden.ops.foundation.model import snapshot_from_dict
from gpuwarden.ops.doctor.model import Result, fail, passed, skip
from gpuwarden.ops.doctor.probe import CheckIO
from gpuwarden.ops.foundation import jsondoc

# The check's own limit (doctor cuts checks at theirs): the read deadline inside it is kept below.
TIMEOUT_S = 8.0


def _captured(io: CheckIO) -> tuple[list[str], list[int], int, float] | None:
    """What the bundle's own snapshot said (its GPUs, the stale ones); None without one."""
    path = io.settings.state_dir / "gpuwarden" / "snapshot.json"
    io.note("the bundle's gpuwarden/snapshot.json")
    try:
        snap = snapshot_from_dict(jsondoc.loads(path.read_bytes()))  # a bundle's: nesting bounded
    except (OSError, ValueError, TypeError, KeyError):
        return None
    stale = [(g.index, g.stale) for g in snap.gpus if g.stale is not None]
    late = [s.message for _, s in stale] + [w.message for w in snap.warnings if w.code == "stale" and w.gpu is None]
    deadline = stale[0][1].deadline_s if stale else io.settings.read_timeout_s
    return late, [i for i, _ in stale], len(snap.gpus), deadline


def check_answers(io: CheckIO) -> Result:
    if io.settings.replay is not None:
        captured = _captured(io)
        if captured is None:
            return skip("the bundle has no snapshot of its GPUs")
        late, stale, count, deadline = captured
        return _verdict(late, stale, count, deadline, "when the bundle was taken")
    if not io.live:
        return skip("not the live node: a captured tree has no driver to ask")
    settings = io.settings
    deadline = min(settings.read_timeout_s, TIMEOUT_S - 2.0)
    settings = settings.with_(read_timeout_s=deadline, **({"backend": "sim"} if io.roots.simulated else {}))
    try:
        backend = open_backend(settings)
    except BackendUnavailable as exc:
        return skip(f"no GPU backend works here ({exc.message})")
    except GpuwardenError as exc:
        return skip(exc.message)
    try:
        io.note(f"every GPU's readings through the {backend.name} backend (VRAM, busy, temperature, power)")
        gpus = backend.gpus()
        backend.process_usage()
        late = [g.stale.message for g in gpus if g.stale is not None]
        late += [r.message for r in getattr(backend, "late", ())]
        stale = [g.index for g in gpus if g.stale is not None]
    finally:
        backend.close()
    return _verdict(late, stale, len(gpus), deadline, f"({backend.name})")


def _verdict(late: list[str], stale: list[int], count: int, deadline: float, where: str) -> Result:
    if late:
        first = stale[0] if stale else None
        how = (f"drain it and reset it once you know what runs there: `gpuwarden drain {first}`, then "
               f"`gpuwarden reset {first} --force`" if first is not None else "reload the driver or reboot the node")
        return fail("; ".join(late),
                    "look for amdgpu (or NVRM) errors in `dmesg`: ring timeouts, SMU not responding; " + how,
                    stale_gpus=stale, deadline_s=deadline)
    return passed(f"{count} GPU(s) answered every read within {deadline:g} s {where}", deadline_s=deadline)
