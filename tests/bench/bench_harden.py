"""Issue 19's adversarial classes, run against this tree and a peer (the code before, `git archive REF`).

Each case is a real CLI run (a subprocess in the tree's directory, so it imports that tree's code) on
files made to be hostile: special files, planted symlinks, corrupt state, damaged bundles, bad config
values, planted secrets, signals. Outcomes: held, traceback, hang (past the timeout), multi-line error,
clobbered (a file outside the state dir changed), leaked (a planted secret printed or stored),
accepted (a bad config passed `config check`), left-behind (a signal left a partial file or a child).

    python tests/bench/bench_harden.py [--peer main] [--timeout 20]

Prints a table per class and tree. Memory is capped per case (RLIMIT_AS) so /dev/zero cannot eat the host.
"""

from __future__ import annotations

import argparse
import collections
import gzip
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import benchlib

REPO = Path(__file__).resolve().parents[2]
SECRET = "Planted-Secret-4711"


class Tree:
    def __init__(self, name: str, root: Path, timeout: float):
        self.name, self.root, self.timeout = name, root, timeout

    def run(self, work: Path, *args: str, stdin: str = "", env: dict | None = None) -> tuple[str, int, str, str]:
        """(outcome so far, exit code, stdout, stderr) of `gpuwarden --state-dir work/state ARGS`."""
        def limits() -> None:
            resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))
            for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
                signal.signal(sig, signal.SIG_DFL)
        try:
            p = subprocess.run([sys.executable, "-m", "gpuwarden.playbooks.cli.root", "--state-dir", str(work / "state"), *args],
                               cwd=self.root, capture_output=True, text=True, timeout=self.timeout, input=stdin,
                               preexec_fn=limits, env={**os.environ, **(env or {}), "PYTHONPATH": str(self.root)},
                               start_new_session=True)
        except subprocess.TimeoutExpired as exc:
            return "hang", -1, str(exc.stdout or ""), str(exc.stderr or "")
        return judge(p.returncode, p.stdout, p.stderr), p.returncode, p.stdout, p.stderr


def judge(code: int, out: str, err: str) -> str:
    if "Traceback" in err or "Traceback" in out:
        return "traceback"
    if code < 0:
        return "killed by a signal"
    if code == 2:
        lines = [ln for ln in err.strip().splitlines() if ln.strip()]
        if not lines or not all(ln.startswith(("gpuwarden: error: ", "  hint: ")) for ln in lines) or \
                sum(ln.startswith("gpuwarden: error: ") for ln in lines) > 8:
            return "multi-line error"
    return "held"


# --- the cases: (class, name, fn(tree, work) -> outcome) -----------------------------------------

def special(args_for):
    def case(tree: Tree, work: Path) -> str:
        fifo = work / "fifo"
        os.mkfifo(fifo)
        return tree.run(work, *args_for(str(fifo), work))[0]
    return case


def dev_zero(args_for):
    def case(tree: Tree, work: Path) -> str:
        return tree.run(work, *args_for("/dev/zero", work))[0]
    return case


SPECIAL = [
    ("config check", lambda p, w: ("--config", p, "config", "check")),
    ("status (config)", lambda p, w: ("--backend", "sim", "--config", p, "status")),
    ("arena budget (config)", lambda p, w: ("--config", p, "arena", "budget")),
    ("launch --dry-run (config)", lambda p, w: ("--config", p, "launch", "--dry-run")),
    ("arena verify", lambda p, w: ("arena", "verify", p)),
    ("arena inspect", lambda p, w: ("arena", "inspect", p)),
    ("status --bundle", lambda p, w: ("status", "--bundle", p)),
    ("arena create --from", lambda p, w: ("arena", "create", str(w / "a.arena"), "--from", p)),
]


def symlinked(rel: str, *args: str, setup=None):
    def case(tree: Tree, work: Path) -> str:
        victim = work / "victim"
        victim.write_text("precious\n")
        tree.run(work, "sim", "init", "--gpus", "2")
        if setup:
            setup(tree, work)
        link = work / "state" / rel
        link.parent.mkdir(parents=True, exist_ok=True)
        if link.exists() or link.is_symlink():
            link.unlink()
        link.symlink_to(victim)
        outcome = tree.run(work, "--backend", "sim", *args)[0]
        return "clobbered" if victim.read_text() != "precious\n" else outcome
    return case


def symlinked_dir(sub: str, *args: str):
    def case(tree: Tree, work: Path) -> str:
        elsewhere = work / "elsewhere"
        elsewhere.mkdir()
        tree.run(work, "sim", "init", "--gpus", "2")
        shutil.rmtree(work / "state" / sub, ignore_errors=True)
        (work / "state" / sub).symlink_to(elsewhere)
        outcome = tree.run(work, "--backend", "sim", *args)[0]
        return "clobbered" if os.listdir(elsewhere) else outcome
    return case


def corrupt(rel: str, content: bytes, *args: str):
    def case(tree: Tree, work: Path) -> str:
        tree.run(work, "sim", "init", "--gpus", "2")
        path = work / "state" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)
        return tree.run(work, "--backend", "sim", *args)[0]
    return case


CORRUPT_CONTENT = {"list": b"[1, 2]\n", "wrong types": b'{"gpus": {"0": {"vram_bytes": "x"}}, "0": 7, "pid": "x"}\n',
                   "not UTF-8": b"\xff\xfe\x00garbage\n", "deep": b"[" * 100000 + b"]" * 100000}
CORRUPT_FILES = [("baseline.json", ("status",)), ("drained.json", ("status",)),
                 ("engines/e0/state.json", ("engines", "list")), ("locks/gpu-1.lock", ("drain", "1", "--yes")),
                 ("journal.log", ("journal",)), ("engines/e0/spec.json", ("engines", "restart", "e0"))]


def bundle_case(mutate):
    def case(tree: Tree, work: Path) -> str:
        tree.run(work, "sim", "init", "--gpus", "2")
        tree.run(work, "--backend", "sim", "bundle", "--safe-mode", "--timeout", "5", "--output", str(work / "b.tar.gz"))
        good = work / "b.tar.gz"
        if not good.exists():
            return "no bundle to damage"
        bad = work / "bad.tar.gz"
        bad.write_bytes(mutate(good.read_bytes()))
        return tree.run(work, "status", "--bundle", str(bad))[0]
    return case


def _repack(raw: bytes, rel: str, data: bytes) -> bytes:
    import io
    out = io.BytesIO()
    with tarfile.open(fileobj=io.BytesIO(raw), mode="r:gz") as src, tarfile.open(fileobj=out, mode="w:gz") as dst:
        for m in src.getmembers():
            body = src.extractfile(m).read() if m.isfile() else None
            if m.name.split("/", 1)[-1] == rel:
                body = data
            if body is not None:
                m.size = len(body)
            dst.addfile(m, io.BytesIO(body) if body is not None else None)
    return out.getvalue()


def _absurd(raw: bytes) -> bytes:
    body = bytearray(gzip.decompress(raw))
    info = tarfile.TarInfo("x/huge")
    block = bytearray(info.tobuf(format=tarfile.USTAR_FORMAT))
    block[124:136] = b"\x80" + (2**62).to_bytes(11, "big")
    block[148:156] = b"        "
    block[148:156] = f"{sum(block):06o}\0 ".encode()
    body[len(body) - 1024:len(body) - 1024] = bytes(block) + bytes(512)
    return gzip.compress(bytes(body))


BUNDLES = [
    ("truncated at 10%", lambda b: b[:len(b) // 10]), ("truncated at 50%", lambda b: b[:len(b) // 2]),
    ("truncated at 99%", lambda b: b[:len(b) * 99 // 100]), ("absurd member size", _absurd),
    ("manifest a list", lambda b: _repack(b, "manifest.json", b"[1]")),
    ("manifest wrong types", lambda b: _repack(b, "manifest.json", b'{"tree": {"dev_roots": 5}, "items": "x"}')),
    ("snapshot a list", lambda b: _repack(b, "gpuwarden/snapshot.json", b"[]")),
    ("snapshot wrong types", lambda b: _repack(b, "gpuwarden/snapshot.json",
                                               b'{"gpus": [{"index": "x"}], "processes": 5, "taken_at": "now"}')),
    ("snapshot with escapes", lambda b: _repack(b, "gpuwarden/snapshot.json", json.dumps({
        "taken_at": 1, "hostname": "\x1b]0;owned\x07", "backend": "sim", "simulated": True, "gpus": [],
        "processes": [], "residual": []}).encode())),
]


def config_case(text: str):
    def case(tree: Tree, work: Path) -> str:
        cfg = work / "node.toml"
        cfg.write_text(text)
        tree.run(work, "sim", "init", "--gpus", "2")  # the node the GPU indexes are checked against
        outcome, code, out, err = tree.run(work, "--backend", "sim", "--config", str(cfg), "config", "check")
        if outcome == "held" and code == 0:
            return "accepted"
        if outcome == "held" and "\x1b" in out + err:
            return "escape printed"
        return outcome
    return case


ENGINE = '[[engines]]\nname = "e0"\ngpu = 0\nargv = ["/bin/true"]\n'
CONFIGS = [
    ("nested 5000 deep", "x = " + "[" * 5000 + "]" * 5000 + "\n"),
    ('engines = ["x"]', 'engines = ["x"]\n'),
    ("pattern that overflows", ENGINE + 'progress = "log"\nregistered_pattern = "a{99999999999}"\n'),
    ("pattern that backtracks", ENGINE + 'progress = "log"\nregistered_pattern = "(a+)+$"\n'),
    ("gpu 99 on a 2-GPU node", ENGINE.replace("gpu = 0", "gpu = 99")),
    ("nan duration", ENGINE + "stop_grace = nan\n"),
    ("inf duration", "[stagger]\nregistration_timeout = inf\n"),
    ("NUL in argv", ENGINE.replace('"/bin/true"', '"/bin/true", "a\\u0000b"')),
    ("= in an env name", ENGINE + 'env = { "A=B" = "1" }\n'),
    ("name with a newline", ENGINE.replace('"e0"', '"e0\\n"')),
    ("slots 10**9", "[stagger]\nslots = 1000000000\n"),
    ("escape in an error", ENGINE.replace('"e0"', '"\\u001b]0;owned\\u0007"')),
]


def secrets_case(tree: Tree, work: Path) -> str:
    tree.run(work, "sim", "init", "--gpus", "2")
    cfg = work / "node.toml"
    cfg.write_text(f'[[engines]]\nname = "e0"\ngpu = 0\ngated = false\nprogress = "log"\nregistered_pattern = "up"\n'
                   f'argv = ["sh", "-c", "echo up; sleep 60", "x", "--password", "{SECRET}", "-u", "u:{SECRET}"]\n')
    tree.run(work, "--config", str(cfg), "--backend", "sim", "launch", "--timeout", "20")
    try:
        seen = [tree.run(work, "--backend", "sim", *args) for args in (("journal",), ("journal", "--json"))]
    finally:
        tree.run(work, "engines", "stop", "--all")
    return "leaked" if any(SECRET in out + err for _, _, out, err in seen) else seen[0][0]


def sigterm_create(tree: Tree, work: Path) -> str:
    def limits() -> None:
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL)
    p = subprocess.Popen([sys.executable, "-m", "gpuwarden.playbooks.cli.root", "arena", "create", str(work / "a.arena"), "--size",
                          "2GiB", "--workers", "1"], cwd=tree.root, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, preexec_fn=limits, env={**os.environ, "PYTHONPATH": str(tree.root)})
    deadline = time.monotonic() + 30
    while not list(work.glob(".a.arena.partial-*")) and p.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    os.kill(p.pid, signal.SIGSTOP)
    os.kill(p.pid, signal.SIGTERM)
    os.kill(p.pid, signal.SIGCONT)
    _, err = p.communicate(timeout=60)
    left = list(work.glob(".a.arena.partial-*"))
    for f in left:
        f.unlink()
    return "left-behind" if left else judge(p.returncode, "", err)


def sh_engine_stop(tree: Tree, work: Path) -> str:
    tree.run(work, "sim", "init", "--gpus", "2")
    cfg = work / "node.toml"
    cfg.write_text('[[engines]]\nname = "e0"\ngpu = 0\ngated = false\nprogress = "log"\nregistered_pattern = "up"\n'
                   'argv = ["sh", "-c", "sleep 301 & sleep 301 & echo up; wait"]\nstop_grace = 3\n')
    tree.run(work, "--config", str(cfg), "--backend", "sim", "launch", "--timeout", "20")
    outcome = tree.run(work, "engines", "stop", "e0")[0]
    time.sleep(1.0)
    left = subprocess.run(["pgrep", "-f", "sleep 301"], capture_output=True, text=True).stdout.split()
    for pid in left:
        os.kill(int(pid), signal.SIGKILL)
    return "left-behind" if left else outcome


def escape_in_header(tree: Tree, work: Path) -> str:
    sys.path.insert(0, str(REPO))
    from gpuwarden.ops.arena import format as fmt  # this tree's builder: the bytes are the same for both
    body = fmt.build(4096, 4096, [0], host="\x1b]0;owned\x07")
    (work / "a.arena").write_bytes(body + bytes(4096))
    outcome, code, out, err = tree.run(work, "arena", "inspect", str(work / "a.arena"))
    return "escape printed" if "\x1b" in out + err else outcome


def cases():
    out = []
    for name, args in SPECIAL:
        out.append(("special files", f"FIFO: {name}", special(args)))
    for name, args in SPECIAL[:1] + SPECIAL[6:7]:
        out.append(("special files", f"/dev/zero: {name}", dev_zero(args)))
    out += [
        ("symlinks", "locks/gpu-1.lock <- drain", symlinked("locks/gpu-1.lock", "drain", "1", "--yes", "--timeout", "1")),
        ("symlinks", "drained.json <- drain", symlinked("drained.json", "drain", "1", "--yes", "--timeout", "1")),
        ("symlinks", "journal.log <- drain", symlinked("journal.log", "drain", "1", "--yes", "--timeout", "1")),
        ("symlinks", "baseline.json <- baseline record", symlinked("baseline.json", "baseline", "record", "--yes")),
        ("symlinks", "sim/node.json <- sim fault", symlinked("sim/node.json", "sim", "fault", "leak-on-kill", "on")),
        ("symlinks", "locks/ dir <- drain", symlinked_dir("locks", "drain", "1", "--yes", "--timeout", "1")),
        ("symlinks", "bundles/ dir <- bundle", symlinked_dir("bundles", "bundle", "--safe-mode", "--timeout", "3")),
    ]
    for rel, args in CORRUPT_FILES:
        for label, content in CORRUPT_CONTENT.items():
            out.append(("corrupt state", f"{rel} {label} <- {' '.join(args)}", corrupt(rel, content, *args)))
    for name, mutate in BUNDLES:
        out.append(("bundles", name, bundle_case(mutate)))
    for name, text in CONFIGS:
        out.append(("config values", name, config_case(text)))
    out += [("secrets", "argv secrets in the journal", secrets_case),
            ("signals", "SIGTERM during arena create", sigterm_create),
            ("signals", "engines stop of a sh -c engine", sh_engine_stop),
            ("escapes", "ESC in an arena header's host", escape_in_header)]
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--peer", default="main", help="git ref of the code to compare with (default main)")
    ap.add_argument("--timeout", type=float, default=20.0, help="seconds before a case counts as a hang")
    opts = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-harden-") as tmp:
        peer_root = benchlib.export_tree(REPO, opts.peer, Path(tmp))
        trees = [Tree("this tree", REPO, opts.timeout), Tree(f"peer ({opts.peer})", peer_root, opts.timeout)]
        results: dict[str, collections.Counter] = {t.name: collections.Counter() for t in trees}
        per_class: dict[tuple[str, str], collections.Counter] = collections.defaultdict(collections.Counter)
        failures: dict[str, list[str]] = {t.name: [] for t in trees}
        t0 = time.monotonic()
        all_cases = cases()
        for cls, name, fn in all_cases:
            for tree in trees:
                work = Path(tempfile.mkdtemp(prefix="case-", dir=tmp))
                try:
                    outcome = fn(tree, work)
                except Exception as exc:  # noqa: BLE001 - a broken case is reported, the run goes on
                    outcome = f"case error: {type(exc).__name__}"
                finally:
                    subprocess.run([sys.executable, "-m", "gpuwarden.playbooks.cli.root", "--state-dir", str(work / "state"),
                                    "engines", "stop", "--all"], cwd=tree.root, capture_output=True, timeout=60,
                                   env={**os.environ, "PYTHONPATH": str(tree.root)})
                    shutil.rmtree(work, ignore_errors=True)
                results[tree.name][outcome] += 1
                per_class[(cls, tree.name)][outcome] += 1
                if outcome != "held":
                    failures[tree.name].append(f"{cls}: {name}: {outcome}")
                print(f"{tree.name:<14} {cls:<14} {name:<48} {outcome}", flush=True)
        print(f"\n{len(all_cases)} cases x {len(trees)} trees in {time.monotonic() - t0:.0f}s\n")
        classes = sorted({c for c, _ in per_class}, key=lambda c: [x[0] for x in all_cases].index(c))
        print(f"| class | cases | {' | '.join(t.name for t in trees)} |")
        print("|---|---|" + "---|" * len(trees))
        for cls in classes:
            n = sum(per_class[(cls, trees[0].name)].values())
            cells = []
            for t in trees:
                c = per_class[(cls, t.name)]
                bad = ", ".join(f"{v} {k}" for k, v in sorted(c.items()) if k != "held")
                cells.append(f"{c['held']} held" + (f"; {bad}" if bad else ""))
            print(f"| {cls} | {n} | {' | '.join(cells)} |")
        for t in trees:
            print(f"\n{t.name}: {dict(results[t.name])}")
            for line in failures[t.name]:
                print(f"  {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
