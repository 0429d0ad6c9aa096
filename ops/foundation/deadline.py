"""Reads of GPU sources under a deadline: a read that does not answer in time is named (GPU, source, file), never waited out.

Why threads, and why few: a hung amdgpu blocks a sysfs read inside the kernel, where no signal or timeout reaches
it, so the read runs in a worker thread and the caller waits at most the deadline. Each worker belongs to a *lane*
(one per GPU and source, shared by the whole process, see LANES). A lane whose read overran stays busy with it:
later calls on that lane are answered at once with the same late read and no new thread is started, so a wedged
GPU costs one stuck thread per lane for as long as the kernel holds it, however many refreshes, samplers or
backends ask. When the read returns at last, its answer is dropped and the lane serves again.
Threads come from _thread, not threading (`status` must not pay for importing it); nothing joins them at exit. A
thread the kernel keeps in uninterruptible sleep (D state) still holds up the process's final exit until its read
returns, as it would for `cat` of that file: callers print and flush their report first.
"""

from __future__ import annotations

import _thread
import time

from gpuwarden.ops.foundation.errors import GpuwardenError

TYPE_CHECKING = False  # typing.TYPE_CHECKING without typing (~3 ms): every `status` reads through these lanes
if TYPE_CHECKING:
    from typing import Any, Callable, Sequence, TypeVar

    T = TypeVar("T")
    Mark = Callable[..., None]  # Lane.mark: what the job reads next (what, path, gpu)
    Job = Callable[[Mark], T]  # a read: called with the lane's mark, answers a value

DEFAULT_S = 3.0  # a healthy sysfs attribute or NVML call answers in well under 10 ms; a wedged SMU never does


class LateRead(Exception):
    """A read that did not answer within its deadline (or whose lane is still blocked in an earlier one)."""

    def __init__(self, source: str, what: str, path: str | None, gpu: int | None, deadline_s: float, since: float):
        self.source = source  # "sysfs", "kfd", "amdsmi", "nvml"
        self.what = what  # the file's name or the library call
        self.path = path
        self.gpu = gpu
        self.deadline_s = deadline_s
        self.since = since  # epoch seconds: when the read that does not answer began
        super().__init__(self.message)

    def again(self) -> "LateRead":
        """The same late read as a new exception (raising one object again and again would grow its traceback)."""
        return LateRead(self.source, self.what, self.path, self.gpu, self.deadline_s, self.since)

    @property
    def message(self) -> str:
        who = f"GPU {self.gpu}" if self.gpu is not None else "the driver"
        return (f"{who}: {self.source} read of {self.what} did not answer in {self.deadline_s:g} s: "
                + ("the GPU may be hung" if self.gpu is not None else "the driver may be hung"))


class Lane:
    """One worker thread (started at the first call) running one job at a time for its callers."""

    def __init__(self, key: object, source: str, gpu: int | None):
        self.key, self.source, self.gpu = key, source, gpu
        self._use = _thread.allocate_lock()  # one caller at a time
        self._go = _thread.allocate_lock()  # released: a job is waiting for the worker
        self._go.acquire()
        self._done = _thread.allocate_lock()  # released: the job's answer is in _answer
        self._done.acquire()
        self._job: Job[Any] | None = None
        self._answer: tuple[bool, Any] | None = None
        self._started = False
        self.what: str | None = None  # what the job in flight is reading now (the job says, through mark)
        self.path: str | None = None
        self.at_gpu: int | None = None
        self.late: LateRead | None = None  # set while a read that overran is still in the kernel

    def poll(self) -> LateRead | None:
        """The late read this lane is still blocked in; None when it is free (a late read that came back frees it)."""
        late = self.late
        if late is not None and self._done.acquire(False):
            self._answer = None
            self.late = late = None
        return late

    def mark(self, what: str, path: str | None = None, gpu: int | None = None) -> None:
        """Called by a job before each read, so a late answer can say which file or call it was (and, on a lane
        that reads several GPUs, whose)."""
        self.what, self.path, self.at_gpu = what, path, gpu

    def _loop(self) -> None:
        while True:
            self._go.acquire()
            job, self._job = self._job, None
            try:
                answer = (True, job(self.mark))  # type: ignore[misc]
            except BaseException as exc:  # handed to the caller, who re-raises it
                answer = (False, exc)
            self._answer = answer
            self._done.release()

    def run(self, job: Job[T], deadline_s: float) -> T:
        """job(mark)'s value, or LateRead when it takes longer than `deadline_s` (the job keeps running)."""
        began = self.begin(job, deadline_s)
        answer: T = self.end(time.monotonic() + deadline_s, began, deadline_s)
        return answer

    def begin(self, job: Job[Any], deadline_s: float) -> float:
        """Hand `job` to the worker (end() must follow); LateRead at once when the lane is still blocked."""
        if not self._use.acquire(timeout=deadline_s):
            # Another caller waits on this lane's job, which has been running all this while.
            raise self.late.again() if self.late is not None else self._late(deadline_s, time.time() - deadline_s)
        try:
            if self.late is not None:
                if not self._done.acquire(False):
                    raise self.late.again()  # still blocked: say so at once, start nothing
                self._answer = None  # the overrun read came back at last: its answer is too old to use
                self.late = None
            self.what = self.path = self.at_gpu = None
            self._job = job
            if not self._started:
                try:
                    _thread.start_new_thread(self._loop, ())
                except RuntimeError as exc:  # no thread left (RLIMIT_NPROC, memory): say so, do not read inline
                    raise GpuwardenError(f"cannot start a reader thread for {self.source} ({exc})",
                                         "raise the process/thread limit for gpuwarden (ulimit -u, TasksMax=)") from None
                self._started = True
            self._go.release()
            return time.time()
        except BaseException:
            self._use.release()
            raise

    def end(self, deadline_at: float, began: float, deadline_s: float) -> Any:
        """The job's value once it answers, by `deadline_at` (monotonic); else LateRead (the lane stays blocked)."""
        try:
            if self._done.acquire(timeout=max(0.0, deadline_at - time.monotonic())):
                ok, value = self._answer  # type: ignore[misc]
                self._answer = None
                if ok:
                    return value
                raise value
            self.late = self._late(deadline_s, began)
            raise self.late.again()
        finally:
            self._use.release()

    def _late(self, deadline_s: float, since: float) -> LateRead:
        gpu = self.at_gpu if self.at_gpu is not None else self.gpu
        return LateRead(self.source, self.what or "(starting)", self.path, gpu, deadline_s, since)


class Lanes:
    """The lanes of one process, by key; the keys name a GPU and a source, so their number stays bounded."""

    def __init__(self) -> None:
        self._lanes: dict[object, Lane] = {}
        self._lock = _thread.allocate_lock()

    def run(self, key: object, job: Job[T], deadline_s: float, *, source: str, gpu: int | None = None) -> T:
        """job(mark) on the lane `key` (made at first use) under `deadline_s`; LateRead when it does not answer."""
        return self._lane(key, source, gpu).run(job, deadline_s)

    def latest(self, key: object, job: Job[T], deadline_s: float, last: T, *, source: str,
               gpu: int | None = None) -> tuple[T, tuple[LateRead, ...]]:
        """(job's answer, ()) within the deadline; when it is late, (`last`, the previous complete answer, and
        the LateRead that names the read): a refresh shows what was last known rather than nothing."""
        try:
            return self.run(key, job, deadline_s, source=source, gpu=gpu), ()
        except LateRead as late:
            return last, (late,)

    def _lane(self, key: object, source: str, gpu: int | None) -> Lane:
        lane = self._lanes.get(key)
        if lane is None:
            with self._lock:
                lane = self._lanes.setdefault(key, Lane(key, source, gpu))
        return lane

    def run_all(self, jobs: Sequence[tuple[object, Job[Any], str, int | None]], deadline_s: float) -> list[Any]:
        """Each (key, job, source, gpu) started at once and waited for under one deadline: a refresh of eight hung
        GPUs costs one deadline, not eight. Returns, in order, each job's value or the exception it ended with
        (a LateRead when late)."""
        started: list[tuple[Lane, float, LateRead | None]] = []
        for key, job, source, gpu in jobs:
            lane = self._lane(key, source, gpu)
            try:
                started.append((lane, lane.begin(job, deadline_s), None))
            except LateRead as refused:
                started.append((lane, 0.0, refused))
        deadline_at = time.monotonic() + deadline_s
        out: list[Any] = []
        for lane, began, late in started:
            if late is not None:
                out.append(late)
                continue
            try:
                out.append(lane.end(deadline_at, began, deadline_s))
            except Exception as exc:
                out.append(exc)
        return out

    def poll(self, key: object) -> LateRead | None:
        """The late read the lane `key` is still blocked in, None when it is free or was never used."""
        lane = self._lanes.get(key)
        return None if lane is None else lane.poll()

    def blocked(self) -> list[LateRead]:
        """The reads still blocked past their deadline, one per lane (each holds one thread)."""
        return [lane.late for lane in list(self._lanes.values()) if lane.late is not None]

    def threads(self) -> int:
        """Worker threads started so far (idle or blocked): never more than one per lane."""
        return sum(1 for lane in list(self._lanes.values()) if lane._started)


LANES = Lanes()  # the process's lanes: a blocked kernel read belongs to the process, whoever asked for it


def check_seconds(value: float, what: str = "--read-timeout") -> float:
    """A deadline as given by an operator: a finite number of seconds, 0.05 to 600."""
    if not (0.05 <= value <= 600):  # also false for nan
        raise GpuwardenError(f"{what} must be between 0.05 and 600 seconds, not {value:g}",
                             "e.g. --read-timeout 3 (the default; GPUWARDEN_READ_TIMEOUT=3 in the environment)")
    return value
