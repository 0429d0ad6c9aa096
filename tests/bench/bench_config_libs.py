"""What a validation library would cost gpuwarden's start-up, against ops/config's own table and schema (issue 37).

Each candidate runs in fresh processes (--runs, median): the library's import, declaring the node config's
[stagger], [agent] and [[engines]] sections as its models, and validating one parsed node config (tomllib included);
then the same file with three wrong keys, counting the errors it reports. "own" is gpuwarden.ops.config (keys and
schema, the validator `config check` runs); "own, status path" is what `status --json` imports of it (the loader and
the table). Candidates missing from --python are skipped: use a venv with msgspec, pydantic, attrs and cattrs.

    python tests/bench/bench_config_libs.py [--python /tmp/libbench/bin/python] [--runs 15]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

TOML = '''
[stagger]
slots = 1
registration_timeout = 600
[agent]
interval = 1.0
deep_scan_interval = 30.0
kmsg = "auto"
events_max = 16777216
bundle_on = ["crash"]
purge_dead_holders = false
[[engines]]
name = "dp0"
argv = ["/opt/engine/bin/serve", "--port", "8000"]
gpu = 0
progress = "preload"
stop_signal = "SIGINT"
stop_grace = 60.0
restart = "on-failure"
start_limit_burst = 3
[[engines]]
name = "dp1"
argv = ["/opt/engine/bin/serve", "--port", "8001"]
gpu = 1
progress = "preload"
stop_signal = "SIGINT"
stop_grace = 60.0
restart = "on-failure"
start_limit_burst = 3
'''
BAD = TOML.replace("slots = 1", "slots = 0").replace("interval = 1.0", "interval = -1.0").replace(
    'progress = "preload"\nstop_signal = "SIGINT"\nstop_grace = 60.0\nrestart = "on-failure"\nstart_limit_burst = 3\n'
    '[[engines]]', 'progress = "tea"\nstop_signal = "SIGINT"\nstop_grace = 60.0\nrestart = "on-failure"\n'
    'start_limit_burst = 3\n[[engines]]', 1)

# Each candidate: (import, declare, validate(text) -> errors reported). Models carry the same fields and bounds.
CANDIDATES = {
    "msgspec": ("import msgspec", '''
from typing import Annotated, Literal
Secs = Annotated[float, msgspec.Meta(ge=0, le=1e7)]
class Stagger(msgspec.Struct, forbid_unknown_fields=True):
    slots: Annotated[int, msgspec.Meta(ge=1, le=1024)] = 1
    registration_timeout: Secs = 600.0
class Agent(msgspec.Struct, forbid_unknown_fields=True):
    interval: Annotated[float, msgspec.Meta(ge=0.25)] = 1.0
    deep_scan_interval: Annotated[float, msgspec.Meta(ge=1)] = 30.0
    kmsg: str = "auto"
    events_max: Annotated[int, msgspec.Meta(ge=65536)] = 16 << 20
    bundle_on: list[Literal["residual", "crash", "kernel-fault"]] = []
    purge_dead_holders: bool = False
class Engine(msgspec.Struct, forbid_unknown_fields=True):
    name: Annotated[str, msgspec.Meta(pattern="^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")]
    argv: Annotated[list[str], msgspec.Meta(min_length=1)]
    gpu: Annotated[int, msgspec.Meta(ge=0, le=1023)] | None = None
    progress: Literal["status", "log", "preload"] = "status"
    stop_signal: str = "SIGTERM"
    stop_grace: Secs = 30.0
    restart: Literal["no", "on-failure"] = "no"
    start_limit_burst: Annotated[int, msgspec.Meta(ge=1, le=1000)] = 5
class Node(msgspec.Struct, forbid_unknown_fields=True):
    stagger: Stagger = msgspec.field(default_factory=Stagger)
    agent: Agent = msgspec.field(default_factory=Agent)
    engines: list[Engine] = []
''', '''
def validate(text):
    try:
        msgspec.toml.decode(text.encode(), type=Node)
        return 0
    except msgspec.ValidationError:
        return 1  # msgspec stops at the first error, with a path but no line
'''),
    "pydantic": ("import pydantic", '''
from typing import Annotated, Literal
from pydantic import BaseModel, ConfigDict, Field
class M(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
class Stagger(M):
    slots: Annotated[int, Field(ge=1, le=1024)] = 1
    registration_timeout: Annotated[float, Field(ge=0, le=1e7)] = 600.0
class Agent(M):
    interval: Annotated[float, Field(ge=0.25)] = 1.0
    deep_scan_interval: Annotated[float, Field(ge=1)] = 30.0
    kmsg: str = "auto"
    events_max: Annotated[int, Field(ge=65536)] = 16 << 20
    bundle_on: list[Literal["residual", "crash", "kernel-fault"]] = []
    purge_dead_holders: bool = False
class Engine(M):
    name: Annotated[str, Field(pattern="^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")]
    argv: Annotated[list[str], Field(min_length=1)]
    gpu: Annotated[int, Field(ge=0, le=1023)] | None = None
    progress: Literal["status", "log", "preload"] = "status"
    stop_signal: str = "SIGTERM"
    stop_grace: Annotated[float, Field(ge=0, le=1e7)] = 30.0
    restart: Literal["no", "on-failure"] = "no"
    start_limit_burst: Annotated[int, Field(ge=1, le=1000)] = 5
class Node(M):
    stagger: Stagger = Stagger()
    agent: Agent = Agent()
    engines: list[Engine] = []
''', '''
import tomllib
def validate(text):
    try:
        Node.model_validate(tomllib.loads(text))
        return 0
    except pydantic.ValidationError as exc:
        return exc.error_count()  # every error, with a path but no line
'''),
    "attrs+cattrs": ("import attrs, cattrs", '''
from typing import Literal
v = attrs.validators
def rng(lo, hi=None):
    return v.and_(v.ge(lo), v.le(hi)) if hi is not None else v.ge(lo)
@attrs.frozen
class Stagger:
    slots: int = attrs.field(default=1, validator=rng(1, 1024))
    registration_timeout: float = attrs.field(default=600.0, validator=rng(0, 1e7))
@attrs.frozen
class Agent:
    interval: float = attrs.field(default=1.0, validator=rng(0.25))
    deep_scan_interval: float = attrs.field(default=30.0, validator=rng(1))
    kmsg: str = "auto"
    events_max: int = attrs.field(default=16 << 20, validator=rng(65536))
    bundle_on: list[Literal["residual", "crash", "kernel-fault"]] = attrs.field(factory=list)
    purge_dead_holders: bool = False
@attrs.frozen
class Engine:
    name: str = attrs.field(validator=v.matches_re("[A-Za-z0-9][A-Za-z0-9_.-]{0,62}"))
    argv: list[str] = attrs.field(validator=v.min_len(1))
    gpu: int | None = attrs.field(default=None, validator=v.optional(rng(0, 1023)))
    progress: str = attrs.field(default="status", validator=v.in_(("status", "log", "preload")))
    stop_signal: str = "SIGTERM"
    stop_grace: float = attrs.field(default=30.0, validator=rng(0, 1e7))
    restart: str = attrs.field(default="no", validator=v.in_(("no", "on-failure")))
    start_limit_burst: int = attrs.field(default=5, validator=rng(1, 1000))
@attrs.frozen
class Node:
    stagger: Stagger = Stagger()
    agent: Agent = Agent()
    engines: list[Engine] = attrs.field(factory=list)
conv = cattrs.Converter(forbid_extra_keys=True, detailed_validation=True)
''', '''
import tomllib
def validate(text):
    try:
        conv.structure(tomllib.loads(text), Node)
        return 0
    except Exception as exc:  # an ExceptionGroup per class; validators of one class stop at its first error
        def count(e):
            return sum(count(x) for x in e.exceptions) if isinstance(e, BaseExceptionGroup) else 1
        return count(exc)
'''),
    "own": ("from gpuwarden.ops.config import nodeconfig", "from pathlib import Path", '''
from gpuwarden.ops.foundation.errors import ConfigError
def validate(text):
    try:
        nodeconfig.parse(text, Path("node.toml"))
        return 0
    except ConfigError as exc:
        return len(getattr(exc, "errors", [exc]))  # every error, each with file:line
'''),
    "own, status path": ("from gpuwarden.ops.config import loader", "", '''
def validate(text):
    return 0  # status --json resolves its state dir only: loader.state_dir, no validator
'''),
}

PROBE = '''
import json, sys, time  # CPU time of this process: a busy machine inflates it far less than wall time
t0 = time.process_time()
exec(sys.argv[1])
t1 = time.process_time()
exec(sys.argv[2])
t2 = time.process_time()
exec(sys.argv[3])
good = validate(sys.argv[4])
t3 = time.process_time()
bad = validate(sys.argv[5])
print(json.dumps({"import": (t1 - t0) * 1e3, "declare": (t2 - t1) * 1e3, "validate": (t3 - t2) * 1e3,
                  "good": good, "errors": bad}))
'''


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--python", default=sys.executable, help="interpreter with the candidates installed")
    ap.add_argument("--runs", type=int, default=15)
    args = ap.parse_args()
    import tempfile
    top = Path(tempfile.mkdtemp(prefix="gw-libs-"))
    (top / "gpuwarden").symlink_to(REPO)  # this tree as the package, for any interpreter
    env = {"PYTHONPATH": str(top), "PATH": "/usr/bin:/bin"}
    print(f"{'candidate':<18} {'import ms':>10} {'declare ms':>11} {'validate ms':>12} {'total ms':>9}  errors of 3 (CPU)")
    for name, (imp, declare, validate) in CANDIDATES.items():
        rows = []
        for _ in range(args.runs):
            proc = subprocess.run([args.python, "-c", PROBE, imp, declare, validate, TOML, BAD], env=env,
                                  capture_output=True, text=True, cwd="/")
            if proc.returncode != 0:
                break
            rows.append(json.loads(proc.stdout))
        if not rows:
            print(f"{name:<18} skipped: {proc.stderr.strip().splitlines()[-1][:80]}")
            continue
        med = {k: statistics.median(r[k] for r in rows) for k in ("import", "declare", "validate")}
        print(f"{name:<18} {med['import']:>10.1f} {med['declare']:>11.1f} {med['validate']:>12.1f} "
              f"{sum(med.values()):>9.1f}  {rows[0]['errors']} (good file: {rows[0]['good']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
