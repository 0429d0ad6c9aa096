"""Lists every import made inside a function in the package, and what hoisting it would cost a hot path.

For each: the module it is in, the target, the measured paths that load that module, what hoisting would add to
the dearest of them, and whether it must stay deferred whatever it costs. The paths (`python -X importtime` and
sys.modules at exit, on a sim node): `status` and `status --json` sampled here, read through the sysfs backend chosen as on a
node, with an engine running, and answered by the agent; `--help` (which loads every command module); each
command's own start (`gpuwarden <command> --help`: the lazy root imports only that command's module); the
console's and the agent's modules. Hoisting `from X import a` into module M adds, on a path that loads M, the
import time of the modules the statement loads that the path does not load already (each module's own time, the
least of three runs).

Must stay: an optional extra (pyproject's optional-dependencies, or what a package module loads at its top from
one), a vendor library (amdsmi, hip-python, nvidia-ml-py: imported where used, as libload does), an import that
would close a cycle among the package's module-level imports, or one that costs >= the threshold on some path.
Several cheap hoists into one module add up: compare the paths' module lists before and after
(tests/bench/RESULTS.md, issue 37).

    python tests/bench/audit_deferred.py [--threshold-ms 0.5] [--json]
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Iterable

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("ops", "playbooks", "tui", "deploy")
PATHS = {"status --json": ("--backend", "sim", "status", "--json"), "status": ("--backend", "sim", "status"),
         "--help": ("--help",)}
# Paths measured by importing their entry modules (the console needs a terminal, the agent runs until stopped).
MODULE_PATHS = {"console": "gpuwarden.tui.app, gpuwarden.tui.command",
                "agent": "gpuwarden.ops.services.agent_daemon"}
# Commands the console's entry point (tui/main.py build_cli) adds to playbooks/cli/root.py's COMMANDS.
CONSOLE_COMMANDS = {"tui": "gpuwarden.tui.command", "serve": "gpuwarden.tui.serve",
                    "fleet tui": "gpuwarden.tui.fleet.command"}
# Imported modules of the optional extras (pyproject.toml [project.optional-dependencies]; lightkube's own
# dependencies httpx2, yaml and msgspec come only with it) and of the vendor libraries libload imports lazily by
# the product owner's rule: never hoisted.
EXTRAS = {"lightkube": "kubernetes", "httpx2": "kubernetes", "yaml": "kubernetes", "msgspec": "kubernetes",
          "grpc": "kubernetes", "google.protobuf": "kubernetes", "asyncssh": "fleet", "ClusterShell": "fleet",
          "textual_serve": "serve", "aiohttp": "serve", "cuda": "cuda", "ziglang": "test"}
VENDOR = ("amdsmi", "hip", "pynvml")
RUNS = 3


def module_name(path: Path) -> str:
    return "gpuwarden." + ".".join(path.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")


def _targets(node: ast.Import | ast.ImportFrom, module: str, is_package: bool) -> list[str]:
    """The modules an import statement names (for `from X import a`: X, and X.a where that is a module)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    base = node.module or ""
    if node.level:
        parts = module.split(".")[:len(module.split(".")) - node.level + is_package]
        base = ".".join(parts + ([base] if base else []))
    return [base]


def function_imports() -> list[tuple[str, int, str, bool, tuple[str, ...]]]:
    """(module, line, target, has a '# deferred:' comment, what else it may load: X.a for `from X import a`) for
    each import inside a function."""
    found = []
    for pkg in PACKAGES:
        for path in sorted((REPO / pkg).rglob("*.py")):
            text = path.read_text()
            lines = text.splitlines()
            module = module_name(path)
            for fn in ast.walk(ast.parse(text)):
                if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    continue
                for node in ast.walk(fn):
                    if not isinstance(node, (ast.Import, ast.ImportFrom)):
                        continue
                    around = lines[node.lineno - 2:node.end_lineno or node.lineno]
                    commented = any("# deferred:" in line for line in around)
                    for t in _targets(node, module, path.name == "__init__.py"):
                        names = node.names if isinstance(node, ast.ImportFrom) else []
                        found.append((module, node.lineno, t, commented, tuple(f"{t}.{a.name}" for a in names)))
    return list(dict.fromkeys(found))


def _module_level(body: list[ast.stmt]) -> list[ast.Import | ast.ImportFrom]:
    """Imports that run when the module is imported: not in functions, not under `if TYPE_CHECKING`."""
    out: list[ast.Import | ast.ImportFrom] = []
    for node in body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            out.append(node)
        elif isinstance(node, ast.If):
            test = ast.unparse(node.test)
            out += _module_level(node.orelse) if "TYPE_CHECKING" in test else _module_level(node.body + node.orelse)
        elif isinstance(node, ast.Try):
            out += _module_level(node.body + node.orelse + node.finalbody + [s for h in node.handlers for s in h.body])
        elif isinstance(node, (ast.ClassDef, ast.With)):
            out += _module_level(node.body)
    return out


def import_graph() -> dict[str, set[str]]:
    """Module -> what its module-level imports load: the package's modules (X.a counted where `from X import a`
    names a module) and the outside modules named."""
    paths = {module_name(p): p for pkg in PACKAGES for p in (REPO / pkg).rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for module, path in paths.items():
        edges = set()
        for node in _module_level(ast.parse(path.read_text()).body):
            for target in _targets(node, module, path.name == "__init__.py"):
                edges.add(target)
                if isinstance(node, ast.ImportFrom):
                    edges.update(f"{target}.{a.name}" for a in node.names if f"{target}.{a.name}" in paths)
        graph[module] = edges
    return graph


def extra_behind(graph: dict[str, set[str]], target: str) -> str:
    """The optional extra's module that importing target loads at module level, if any ('' if none)."""
    seen: set[str] = set()
    todo = [target]
    while todo:
        name = todo.pop()
        if _within(name, EXTRAS):
            return name
        if name in seen or not name.startswith("gpuwarden."):
            continue
        seen.add(name)
        todo += [*graph.get(name, ()), *(".".join(name.split(".")[:i]) for i in range(2, name.count(".") + 1))]
    return ""


def closes_cycle(graph: dict[str, set[str]], module: str, target: str) -> bool:
    """Would a module-level `import target` in module close a cycle? Importing a module imports its packages
    first, except those of `module` itself (already in sys.modules when module's body runs)."""
    ancestors = {".".join(module.split(".")[:i]) for i in range(1, module.count(".") + 1)}
    seen: set[str] = set()
    todo = [target]
    while todo:
        name = todo.pop()
        if name == module:
            return True
        if name in seen:
            continue
        seen.add(name)
        parents = {".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1)} - ancestors
        todo += [*graph.get(name, ()), *(p for p in parents if p in graph)]
    return False


# -X importtime logs only imports made by the import statement: a module loaded by importlib.import_module (the
# lazy root's command modules) is missing from it, so each measured path also prints sys.modules as it exits.
_LISTED = ("import atexit, json, sys\n"
           "atexit.register(lambda: print('MODULES ' + json.dumps(sorted(sys.modules)), file=sys.stderr))\n")


def importtime(argv: list[str], env: dict[str, str]) -> dict[str, tuple[float, float]]:
    """Module -> (own, cumulative) import time in ms, as `python -X importtime` reports it for argv."""
    proc = subprocess.run([sys.executable, "-X", "importtime", *argv], env=env, capture_output=True, text=True,
                          timeout=120)
    out = {}
    for line in proc.stderr.splitlines():
        if line.startswith("import time:") and "|" in line and "cumulative" not in line:
            own, cumulative, name = line.removeprefix("import time:").split("|")
            out[name.strip()] = (int(own) / 1e3, int(cumulative) / 1e3)
        elif line.startswith("MODULES "):
            out.update({name: out.get(name, (0.0, 0.0)) for name in json.loads(line.removeprefix("MODULES "))})
    return out


def loaded_by(code: str, env: dict[str, str]) -> set[str]:
    """The modules a path loads: what importtime logs and what sys.modules holds at exit."""
    return set(importtime(["-c", _LISTED + code], env))


def cli(*args: str) -> str:
    """Code that runs the program as `python -m gpuwarden args` does."""
    return (f"import runpy\nsys.argv = ['gpuwarden', *{list(args)!r}]\n"
            "runpy.run_module('gpuwarden', run_name='__main__')\n")


def brought(code: str, env: dict[str, str]) -> dict[str, float]:
    """Module -> own import time in ms of what the import statement `code` loads, the least of RUNS runs."""
    out: dict[str, float] = {}
    for _ in range(RUNS):
        for name, (own, _) in importtime(["-c", code], env).items():
            out[name] = min(own, out.get(name, own))
    return out


def with_agent(env: dict[str, str]) -> set[str]:
    """What `status --json` loads when the agent answers it (its cheapest path): an agent on the sim node, started
    as systemd would (READY=1 on NOTIFY_SOCKET), stopped afterwards."""
    with tempfile.TemporaryDirectory(prefix="audit-notify-") as tmp:
        notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        notify.bind(f"{tmp}/notify.sock")
        notify.settimeout(60)
        agent = subprocess.Popen([sys.executable, "-m", "gpuwarden", "--backend", "sim", "agent", "--foreground"],
                                 env={**env, "NOTIFY_SOCKET": f"{tmp}/notify.sock"}, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
        try:
            while "READY=1" not in notify.recv(4096).decode().split("\n"):
                pass
            return loaded_by(cli(*PATHS["status --json"]), env)
        finally:
            notify.close()
            agent.terminate()
            agent.wait(timeout=60)


def with_engine(state: Path, env: dict[str, str]) -> set[str]:
    """What `status --json` loads on a node running an engine (its state, its shim alive, an arena registered):
    the engine's and the arena's readers load then (tests/integration/playbooks/cli/test_cli_imports.py)."""
    sys.path.insert(0, str(REPO.parent))
    from gpuwarden.ops.engines import state as engine_state
    from gpuwarden.ops.foundation import statedir
    from gpuwarden.ops.node import procs
    shim = subprocess.Popen(["sleep", "600"])
    try:
        ticks = procs.identity(shim.pid)
        where = engine_state.engine_dir(state, "e0")
        where.mkdir(parents=True)
        statedir.write_json(where / engine_state.STATE, {
            "name": "e0", "gpu": 0, "phase": "serving", "shim_pid": shim.pid, "shim_start": ticks, "pid": shim.pid,
            "pid_start": ticks, "restarts": 0, "registrations": [
                {"kind": "register", "outcome": "registered", "bytes": 1 << 30, "started_at": 1.0}]}, root=state)
        return loaded_by(cli(*PATHS["status --json"]), env)
    finally:
        shim.kill()
        shim.wait()


def commands() -> dict[str, str]:
    """Command line (`engines`, `fleet tui`) -> the module its start imports, one command per module."""
    sys.path.insert(0, str(REPO.parent))
    from gpuwarden.playbooks.cli.root import COMMANDS
    by_module: dict[str, str] = {}
    for name, (target, _) in COMMANDS.items():
        by_module.setdefault(target.split(":")[0], name)
    for name, target in CONSOLE_COMMANDS.items():
        by_module.setdefault(target, name)
    return {name: module for module, name in by_module.items()}


def _within(target: str, roots: Iterable[str]) -> bool:
    return any(target == r or target.startswith(r + ".") for r in roots)


def audit(threshold_ms: float) -> list[dict[str, object]]:
    env = dict(os.environ)
    with tempfile.TemporaryDirectory(prefix="audit-deferred-") as tmp:
        env["GPUWARDEN_STATE_DIR"] = tmp
        subprocess.run([sys.executable, "-m", "gpuwarden", "sim", "init", "--gpus", "2"], env=env,
                       capture_output=True, timeout=120)
        loaded = {name: loaded_by(cli(*argv), env) for name, argv in PATHS.items()}
        loaded.update({name: loaded_by(f"import {mods}", env) for name, mods in MODULE_PATHS.items()})
        loaded["status --json (agent)"] = with_agent(env)
        # a real backend's path: the sysfs backend chosen as on a node (no --backend) over the sim node's tree
        loaded["status --json (sysfs)"] = loaded_by(cli("--sysfs-root", f"{tmp}/sim/root/sys", "status", "--json"),
                                                    {k: v for k, v in env.items() if k != "GPUWARDEN_BACKEND"})
        for name, module in commands().items():  # in sequence: the box has two cores
            mods = loaded_by(cli("--backend", "sim", *name.split(), "--help"), env)
            if module not in mods:  # status answers --help from its fast path (playbooks/cli/fastcli.py)
                print(f"note: `gpuwarden {name} --help` does not load {module}", file=sys.stderr)
            loaded[f"{name} --help"] = mods
        loaded["status --json (engine)"] = with_engine(Path(tmp), env)  # last: the other paths see no engine
    graph = import_graph()
    alone: dict[str, dict[str, float]] = {}
    rows: list[dict[str, object]] = []
    for module, line, target, commented, subs in sorted(function_imports()):
        paths = [name for name, mods in loaded.items() if module in mods]
        # `from X import a` loads X.a too where that is a module, or what X's __getattr__ loads for a
        names = ", ".join(sub.rsplit(".", 1)[1] for sub in subs)
        code = f"from {target} import {names}" if subs else f"import {target}"
        if paths and code not in alone:
            alone[code] = brought(code, env)
        costs = {p: sum(own for name, own in alone[code].items() if name not in loaded[p]) for p in paths}
        dearest = max(costs, key=costs.__getitem__) if costs else ""
        cost = costs.get(dearest, 0.0)
        cycle = target.startswith("gpuwarden.") and closes_cycle(graph, module, target)
        extra = next(filter(None, (extra_behind(graph, t) for t in (target, *subs) if t == target or t in graph)), "")
        stay = ("extra" if extra else "vendor" if _within(target, VENDOR) else
                "cycle" if cycle else "costly" if cost >= threshold_ms else "")
        rows.append({"module": module, "line": line, "target": target, "paths": paths, "dearest": dearest,
                     "cost_ms": round(cost, 2), "stay": stay, "commented": commented,
                     "extra": EXTRAS[next(r for r in EXTRAS if _within(extra, (r,)))] if extra else ""})
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threshold-ms", type=float, default=0.5)
    ap.add_argument("--json", action="store_true", help="one JSON list of rows instead of the table")
    opts = ap.parse_args()
    rows = audit(opts.threshold_ms)
    if opts.json:
        print(json.dumps(rows, indent=1))
        return 0
    print("| module | line | target | paths that load the module | hoisting cost ms (dearest path) | must stay | "
          "# deferred: |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        paths = r["paths"]
        shown = ", ".join(paths[:3]) + (f" +{len(paths) - 3}" if len(paths) > 3 else "")  # type: ignore[arg-type]
        print(f"| {r['module']} | {r['line']} | {r['target']} | {shown or '-'} | {r['cost_ms']:.2f} "
              f"({r['dearest'] or '-'}) | {r['stay'] or '-'} | {'yes' if r['commented'] else 'no'} |")
    stay = [r for r in rows if r["stay"]]
    by = {k: sum(r["stay"] == k for r in rows) for k in ("extra", "vendor", "cycle", "costly")}
    print(f"\n{len(rows)} function-level imports, {sum(bool(r['commented']) for r in rows)} with '# deferred:', "
          f"{sum(bool(r['paths']) for r in rows)} in modules on a measured path; {len(stay)} must stay "
          f"({', '.join(f'{v} {k}' for k, v in by.items())}; costly: >= {opts.threshold_ms} ms), "
          f"{len(rows) - len(stay)} could move to their module's top")
    return 0


if __name__ == "__main__":
    sys.exit(main())
