"""The playbook runner: preconditions, plan, dry-run, confirmation, GPU locks, journal, events.

A playbook only builds steps; `run` owns every safety rule so each playbook gets them all.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from gpuwarden.ops.foundation import journal
from gpuwarden.ops.foundation.errors import GpuwardenError, Refused
from gpuwarden.ops.foundation.gpulock import hold
from gpuwarden.ops.foundation.jsondoc import document, iso
from gpuwarden.ops.foundation.settings import Settings
from gpuwarden.playbooks.signalplan import SignalPlan

@dataclass(frozen=True)
class Event:
    kind: str  # planned, step_started, step_ok, step_failed, step_skipped, info, done
    playbook: str
    step: str | None = None
    message: str = ""
    data: dict[str, Any] = field(default_factory=dict)
    ts: float = field(default_factory=time.time)

    def to_dict(self) -> dict[str, Any]:
        """The gpuwarden.playbook-event/1 document: what `--json` prints, one per line."""
        return document("playbook-event", {
            "ts": round(self.ts, 3), "ts_iso": iso(self.ts), "kind": self.kind, "playbook": self.playbook,
            "step": self.step, "message": self.message, **({"data": self.data} if self.data else {})})


class SkipStep(Exception):
    """Raised by a step that finds nothing to do; the message says why."""


class StepFailed(GpuwardenError):
    """Raised by a step that could not do its job; stops the playbook unless the step allows going on."""


@dataclass
class Step:
    name: str
    description: str
    action: Callable[["RunContext"], str | None]
    destructive: bool = False
    continue_on_failure: bool = False


@dataclass
class RunContext:
    """What a step sees: settings, a way to report progress, a cancel flag, scratch shared by steps."""

    settings: Settings
    playbook: str
    sink: Callable[[Event], None]
    step: str | None = None
    cancelled: threading.Event = field(default_factory=threading.Event)
    scratch: dict[str, Any] = field(default_factory=dict)

    def info(self, message: str, **data: Any) -> None:
        self.sink(Event("info", self.playbook, self.step, message, data))


class Playbook:
    """Subclass and fill in: name, description, destructive, gpus, preconditions(), plan()."""

    name = "playbook"
    description = ""
    destructive = False
    # What else the run takes down, said in the confirmation ("resetting GPU 2 also resets ..."); set by
    # preconditions() or plan(), empty when there is nothing more to say.
    confirm_note = ""
    # Every process the run may signal (gpuwarden.playbooks.signalplan), set by preconditions() or plan(); None for a
    # playbook that signals nothing by its nature (bundle, undrain). Shown with the plan, journalled after the run.
    signal_plan: SignalPlan | None = None

    def gpus(self) -> tuple[int, ...]:
        """GPUs whose locks are held while the playbook runs."""
        return ()

    def preconditions(self, ctx: RunContext) -> list[str]:
        """Problems that forbid running; empty when all is well."""
        return []

    def plan(self, ctx: RunContext) -> list[Step]:
        raise NotImplementedError

    def summary(self) -> dict[str, Any]:
        """Arguments worth recording in the journal."""
        return {}


@dataclass
class Result:
    ok: bool
    events: list[Event]
    failed_step: str | None = None
    dry_run: bool = False
    refused: str | None = None
    data: dict[str, Any] = field(default_factory=dict)

    @property
    def exit_code(self) -> int:
        if self.ok:
            return 0
        return 1 if self.refused or self.failed_step else 2


def run(
    playbook: Playbook,
    settings: Settings,
    *,
    sink: Callable[[Event], None] = lambda e: None,
    dry_run: bool = False,
    assume_yes: bool = False,
    confirm: Callable[[str], bool] | None = None,
    lock_wait_s: float = 0.0,
    cancelled: threading.Event | None = None,
) -> Result:
    """Run a playbook with every safety rule. Never raises for expected failures: see Result.

    `confirm` is asked before a destructive playbook when `assume_yes` is False; without one
    (no terminal, no dialog) a destructive playbook is refused.
    """
    events: list[Event] = []

    def emit(event: Event) -> None:
        events.append(event)
        sink(event)

    ctx = RunContext(settings=settings, playbook=playbook.name, sink=emit,
                     cancelled=cancelled or threading.Event())

    def finish(ok: bool, message: str, **kw: Any) -> Result:
        emit(Event("done", playbook.name, None, message, {"ok": ok, **({"dry_run": True} if dry_run else {})}))
        return Result(ok=ok, events=events, dry_run=dry_run, data=ctx.scratch, **kw)

    try:
        problems = playbook.preconditions(ctx)
        steps = playbook.plan(ctx) if not problems else []
    except GpuwardenError as exc:
        problems, steps = [str(exc)], []
    if problems:
        for p in problems:
            emit(Event("info", playbook.name, None, f"precondition failed: {p}", {"precondition": p}))
        if not dry_run:
            journal.write(settings.state_dir, playbook.name, "refused", reasons=problems, **playbook.summary())
        return finish(False, "refused: " + "; ".join(problems), refused="; ".join(problems))

    signals = playbook.signal_plan
    emit(Event("planned", playbook.name, None, playbook.description,
               {"steps": [{"name": s.name, "description": s.description, "destructive": s.destructive}
                          for s in steps],
                **({"signals": signals.to_list()} if signals is not None else {})}))
    if dry_run:
        return finish(True, f"dry run: {len(steps)} step(s) planned, nothing changed")

    if playbook.destructive and not assume_yes:
        note = f" {playbook.confirm_note[:1].upper()}{playbook.confirm_note[1:]}." if playbook.confirm_note else ""
        named = "" if signals is None else (f" It may signal {len(signals.entries)} process(es), listed above."
                                            if signals.entries else " It signals no process.")
        question = f"{playbook.description} — {len(steps)} step(s).{note}{named} Proceed?"
        if confirm is None:
            reason = "destructive playbook needs confirmation: no terminal to ask on; pass --yes to run it from a script"
            journal.write(settings.state_dir, playbook.name, "refused", reasons=[reason], **playbook.summary())
            return finish(False, "refused: " + reason, refused=reason)
        if not confirm(question):
            journal.write(settings.state_dir, playbook.name, "cancelled", **playbook.summary())
            return finish(False, "cancelled by the operator", refused="cancelled")

    try:
        with hold(settings.state_dir, playbook.gpus(), playbook.name, wait_s=lock_wait_s):
            journal.write(settings.state_dir, playbook.name, "started", **playbook.summary(),
                          **({"signal_plan": signals.to_list()} if signals is not None else {}))
            try:
                failed = _run_steps(ctx, playbook, steps, emit)
            finally:
                if signals is not None and signals.entries:  # planned and really sent, even after Ctrl-C
                    journal.write(settings.state_dir, f"{playbook.name}:signals", "ok", processes=signals.to_list(),
                                  sent=sum(len(e.sent) for e in signals.entries))
    except Refused as exc:
        journal.write(settings.state_dir, playbook.name, "refused", reasons=[str(exc)], **playbook.summary())
        return finish(False, f"refused: {exc}", refused=str(exc))
    except KeyboardInterrupt:
        # Ctrl-C mid-run: the steps already done stay done; the journal must say where it stopped.
        journal.write(settings.state_dir, playbook.name, "interrupted", step=ctx.step, **playbook.summary())
        raise
    journal.write(settings.state_dir, playbook.name, "failed" if failed else "ok",
                  failed_step=failed, **playbook.summary())
    if failed:
        return finish(False, f"failed at step {failed}", failed_step=failed)
    # A playbook may sum up its own success (fix: "GPU 2 is clean and verified"); plain "done" otherwise.
    return finish(True, str(ctx.scratch.get("outcome") or "done"))


def _run_steps(ctx: RunContext, playbook: Playbook, steps: list[Step], emit: Callable[[Event], None]) -> str | None:
    failed: str | None = None
    for step in steps:
        if ctx.cancelled.is_set():
            emit(Event("step_skipped", playbook.name, step.name, "cancelled"))
            journal.write(ctx.settings.state_dir, f"{playbook.name}:{step.name}", "skipped", reason="cancelled")
            continue
        ctx.step = step.name
        emit(Event("step_started", playbook.name, step.name, step.description))
        t0 = time.monotonic()
        try:
            message = step.action(ctx) or "ok"
        except SkipStep as exc:
            emit(Event("step_skipped", playbook.name, step.name, str(exc)))
            journal.write(ctx.settings.state_dir, f"{playbook.name}:{step.name}", "skipped", reason=str(exc))
            continue
        except GpuwardenError as exc:
            _raise_if_interrupted(ctx, f"{playbook.name}:{step.name}", exc, str(exc))
            emit(Event("step_failed", playbook.name, step.name, str(exc),
                       {"seconds": round(time.monotonic() - t0, 3)}))
            journal.write(ctx.settings.state_dir, f"{playbook.name}:{step.name}", "failed", error=str(exc))
            if not step.continue_on_failure:
                return step.name
            failed = failed or step.name
            continue
        except Exception as exc:  # a bug in a step must still end the run cleanly and be journalled
            msg = f"{type(exc).__name__}: {exc}"
            _raise_if_interrupted(ctx, f"{playbook.name}:{step.name}", exc, msg)
            emit(Event("step_failed", playbook.name, step.name, msg, {"unexpected": True}))
            journal.write(ctx.settings.state_dir, f"{playbook.name}:{step.name}", "failed", error=msg,
                          where=_where(exc))
            return step.name
        emit(Event("step_ok", playbook.name, step.name, message, {"seconds": round(time.monotonic() - t0, 3)}))
        journal.write(ctx.settings.state_dir, f"{playbook.name}:{step.name}", "ok", message=message)
    ctx.step = None
    return failed


def _raise_if_interrupted(ctx: RunContext, action: str, exc: BaseException, error: str) -> None:
    """Raise the interrupt `exc` was raised while handling, once the error is journalled: a clean-up that failed
    while Ctrl-C (or SIGTERM) unwound a step must not turn the interruption into a step failure (exit 1 instead of
    130); the operator stopped it."""
    interrupt = _unwinding_from(exc)
    if interrupt is not None:
        journal.write(ctx.settings.state_dir, action, "failed", error=error, during="interrupt", where=_where(exc))
        raise interrupt from exc


def _unwinding_from(exc: BaseException) -> KeyboardInterrupt | None:
    """The interrupt `exc` was raised while handling (in a `finally` or `except` that ran because of it), if any."""
    seen: set[int] = set()
    context = exc.__context__
    while context is not None and id(context) not in seen:
        if isinstance(context, KeyboardInterrupt):
            return context
        seen.add(id(context))
        context = context.__context__
    return None


def _where(exc: BaseException) -> str:
    """file:line of the frame that raised `exc`, for the journal: an unexpected error is a bug to report."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    if tb is None:
        return ""
    code = tb.tb_frame.f_code
    return f"{code.co_filename}:{tb.tb_lineno} in {code.co_name}"
