"""Fuzz every input gpuwarden parses: node configs, arena headers, bundles, every state file, kernel logs.

Hypothesis generates the cases from a fixed seed (derandomize), so a run is repeatable; the default
run is small (CI), GPUWARDEN_FUZZ_EXAMPLES=N makes every target run N cases, and
GPUWARDEN_FUZZ_REPORT=FILE appends what each target ran to FILE (tests/bench/RESULTS.md quotes it).
The properties: no exception but gpuwarden's own one-line errors (exit 2), no hang (a case over
CASE_LIMIT_S fails), and nothing from the input reaches the terminal as an escape sequence.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import random
import re
import tarfile
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from helpers.bundles import real_bundle  # noqa: F401  (a fixture: the tests below take it by name)
from hypothesis import strategies as st

from gpuwarden.ops.foundation.errors import GpuwardenError

EXAMPLES = int(os.environ.get("GPUWARDEN_FUZZ_EXAMPLES") or 0)
CASE_LIMIT_S = 10.0
_TALLY: dict[str, dict] = {}


def fuzz(default: int):
    return settings(max_examples=EXAMPLES or default, derandomize=True, deadline=None, database=None,
                    suppress_health_check=list(HealthCheck), print_blob=True)


@contextlib.contextmanager
def case(target: str, outcome: dict | None = None):
    """Time one case and count it under `target`; a case slower than CASE_LIMIT_S is a hang."""
    t0 = time.monotonic()
    tally = _TALLY.setdefault(target, {"cases": 0, "ok": 0, "refused": 0, "max_s": 0.0})
    result = outcome if outcome is not None else {}
    yield result
    took = time.monotonic() - t0
    tally["cases"] += 1
    tally["refused" if result.get("refused") else "ok"] += 1
    tally["max_s"] = round(max(tally["max_s"], took), 3)
    assert took < CASE_LIMIT_S, f"{target}: one case took {took:.1f}s (a hang)"


@pytest.fixture(scope="module", autouse=True)
def report():
    yield
    path = os.environ.get("GPUWARDEN_FUZZ_REPORT")
    if path:
        with open(path, "a") as f:
            for target, tally in sorted(_TALLY.items()):
                f.write(json.dumps({"target": target, **tally}) + "\n")


def no_escapes(text: str) -> None:
    assert "\x1b" not in text and "\x9b" not in text, text[:300]


def one_line_error(exc: GpuwardenError) -> None:
    assert "\n" not in exc.message and (exc.hint is None or "\n" not in exc.hint), exc.message
    no_escapes(exc.message)


def run_cli(*args: str) -> tuple[int, str, str]:
    """The real CLI, in this process (a subprocess per case would cost more than the case)."""
    from gpuwarden.playbooks.cli import root as cli
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(list(args))
    return code, out.getvalue(), err.getvalue()


def cli_outcome(code: int, out: str, err: str) -> bool:
    """Check the CLI's side of the contract; True when it refused (exit 2)."""
    assert code in (0, 1, 2), (code, err)
    assert "Traceback" not in err, err
    no_escapes(out + err)
    if code == 2:
        lines = err.strip().splitlines()
        assert lines and lines[0].startswith("gpuwarden: error: "), err
        assert all(ln.startswith(("gpuwarden: error: ", "  hint: ")) for ln in lines), err
    return code == 2


# --- strategies ----------------------------------------------------------------------------------

TRICKY_TOML = [
    "nan", "inf", "-inf", "1e20", "1e400", "99999999999999999999999", "-1", "0", "true", "[]", '["x"]', "{}",
    "{a = 1}", '"x\\u0000y"', '"a\\nb"', '"A=B"', '"(a+)+$"', '"(((((((((("', '"a{99999999999}"', '"\\u001b[2J"',
    "'''multi\nline'''", "1979-05-27T07:32:00Z", '"🙂"', '""', '"' + "x" * 3000 + '"', "[" * 40 + "]" * 40,
    "{ x = { y = { z = 1 } } }", '["a", 1]', "[[1, 2], [3]]", "3.5", '"64GiB"', '"-5GiB"', '"1e9TiB"',
]
KEYS = ["name", "argv", "gpu", "env", "slots", "size", "path", "stop_grace", "log_max", "progress", "restart",
        "registered_pattern", "ready_pattern", "stop_signal", "state_dir", "engines", "defaults", "x.y", '"a b"']
JSON = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-2**70, max_value=2**70) | st.floats(allow_nan=True)
    | st.text(max_size=30),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=12), inner, max_size=5),
    max_leaves=25)


@st.composite
def toml_texts(draw):
    from gpuwarden.playbooks.cli.commands.config import CANARY, FOUR_ENGINES
    base = draw(st.sampled_from([FOUR_ENGINES, CANARY, ""]))
    lines = base.splitlines()
    for _ in range(draw(st.integers(0, 6))):
        action = draw(st.sampled_from(["value", "key", "drop", "dup", "insert", "junk"]))
        at = draw(st.integers(0, max(0, len(lines) - 1))) if lines else 0
        if action == "value" and lines and "=" in lines[at]:
            key = lines[at].split("=", 1)[0]
            lines[at] = f"{key}= {draw(st.sampled_from(TRICKY_TOML))}"
        elif action == "key" and lines and "=" in lines[at]:
            lines[at] = f"{draw(st.sampled_from(KEYS))} = {lines[at].split('=', 1)[1]}"
        elif action == "drop" and lines:
            del lines[at]
        elif action == "dup" and lines:
            lines.insert(at, lines[at])
        elif action == "insert":
            lines.insert(at, f"{draw(st.sampled_from(KEYS))} = {draw(st.sampled_from(TRICKY_TOML))}")
        else:
            lines.insert(at, draw(st.text(max_size=40)))
    return "\n".join(lines) + "\n"


# --- node config --------------------------------------------------------------------------------

@fuzz(150)
@given(text=toml_texts())
def test_fuzz_node_config(text):
    from gpuwarden.ops.config import nodeconfig
    with case("node config (parse)") as result:
        try:
            cfg = nodeconfig.parse(text, Path("fuzz.toml"))
        except GpuwardenError as exc:
            result["refused"] = True
            for each in getattr(exc, "errors", None) or [exc]:
                one_line_error(each)
                assert each.message.startswith("fuzz.toml:"), each.message
            return
    # What passes the check is what the shim can run: no value left to break at run time.
    assert 1 <= cfg.stagger.slots <= nodeconfig.MAX_SLOTS
    for e in cfg.engines:
        assert nodeconfig.NAME_RE.fullmatch(e.name) and e.argv and all("\0" not in a for a in e.argv)
        assert all(nodeconfig.ENV_NAME_RE.fullmatch(k) and "\0" not in v for k, v in e.env.items())
        for seconds in (e.stop_grace, e.restart_backoff, e.restart_backoff_max, e.start_limit_interval):
            assert 0 <= seconds <= nodeconfig.MAX_SECONDS
        for pattern in (e.registered_pattern, e.ready_pattern):
            assert pattern is None or nodeconfig.regex_problem(pattern) is None


@fuzz(15)
@given(text=toml_texts())
def test_fuzz_config_check_cli(tmp_path_factory, text):
    d = tmp_path_factory.mktemp("cfg")
    (d / "node.toml").write_text(text, encoding="utf-8", errors="surrogateescape")
    with case("node config (config check CLI)") as result:
        result["refused"] = cli_outcome(*run_cli("--state-dir", str(d / "state"), "--config", str(d / "node.toml"),
                                                 "config", "check", "--no-node"))


@fuzz(40)
@given(raw=st.binary(max_size=400))
def test_fuzz_node_config_bytes(tmp_path_factory, raw):
    from gpuwarden.ops.config import nodeconfig
    from gpuwarden.ops.foundation.settings import Settings
    d = tmp_path_factory.mktemp("cfgb")
    (d / "node.toml").write_bytes(raw)
    with case("node config (raw bytes)") as result:
        try:
            nodeconfig.load(Settings(state_dir=d, config_path=d / "node.toml"))
        except GpuwardenError as exc:
            result["refused"] = True
            for each in getattr(exc, "errors", None) or [exc]:
                one_line_error(each)


# --- arena header -------------------------------------------------------------------------------

@st.composite
def arena_files(draw):
    from gpuwarden.ops.arena import format as fmt
    payload = draw(st.sampled_from([4096, 5000, 3 * 4096]))
    chunk = 4096
    data = bytes(random.Random(payload).randbytes(payload))
    import xxhash
    hashes = [xxhash.xxh3_64_intdigest(data[i:i + chunk]) for i in range(0, payload, chunk)]
    header = bytearray(fmt.build(payload, chunk, hashes, created_ns=1, host=draw(st.sampled_from(
        ["node1", "\x1b]0;owned\x07", "\x1b[2Jx", "é" * 30]))))
    body = bytearray(header + data)
    for _ in range(draw(st.integers(0, 4))):
        how = draw(st.sampled_from(["flip", "field", "truncate", "extend"]))
        if how == "flip" and body:
            at = draw(st.integers(0, len(body) - 1))
            body[at] ^= draw(st.integers(1, 255))
        elif how == "field":
            offset, width = draw(st.sampled_from([(8, 4), (12, 4), (16, 8), (24, 8), (32, 8), (40, 4), (44, 4)]))
            value = draw(st.integers(0, 2 ** (8 * width) - 1))
            body[offset:offset + width] = value.to_bytes(width, "little")
        elif how == "truncate":
            del body[draw(st.integers(0, len(body))):]
        else:
            body += bytes(draw(st.integers(1, 9000)))
    return bytes(body)


def _arena_file(tmp_path_factory, body: bytes) -> Path:
    path = tmp_path_factory.mktemp("arena") / "a.arena"
    path.write_bytes(body)
    return path


@fuzz(100)
@given(body=arena_files())
def test_fuzz_arena_header(tmp_path_factory, body):
    from gpuwarden.ops.arena import format as fmt
    from gpuwarden.ops.arena.verify import verify
    path = _arena_file(tmp_path_factory, body)
    with case("arena header (load + verify)") as result:
        state, header = fmt.header_state(path)
        assert state in fmt.STATES
        if header is None:
            result["refused"] = True
            return
        no_escapes(header.host)
        try:
            verify(path, workers=1)
        except fmt.ArenaError as exc:
            one_line_error(exc)
            result["refused"] = True


@fuzz(6)
@given(body=arena_files())
def test_fuzz_arena_cli(tmp_path_factory, body):
    path = _arena_file(tmp_path_factory, body)
    with case("arena header (inspect/verify CLI)") as result:
        result["refused"] = cli_outcome(*run_cli("--state-dir", str(path.parent / "s"), "arena", "inspect", str(path)))
        cli_outcome(*run_cli("--state-dir", str(path.parent / "s"), "arena", "verify", str(path), "--method", "mmap"))


# --- bundles ------------------------------------------------------------------------------------


def _members(raw: bytes) -> list[tuple[tarfile.TarInfo, bytes | None]]:
    with tarfile.open(fileobj=io.BytesIO(raw), mode="r:gz") as tar:
        return [(m, tar.extractfile(m).read() if m.isfile() else None) for m in tar.getmembers()]


def _pack(members: list[tuple[tarfile.TarInfo, bytes | None]]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz", format=tarfile.PAX_FORMAT) as tar:
        for info, data in members:
            if data is not None:
                info.size = len(data)
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return out.getvalue()


def _absurd_member(raw_tar_gz: bytes, size: int) -> bytes:
    """A valid archive whose last member's header claims `size` bytes (ustar size field, octal)."""
    import gzip
    body = bytearray(gzip.decompress(raw_tar_gz))
    with tarfile.open(fileobj=io.BytesIO(bytes(body))) as tar:
        tar.getmembers()
        end = tar.offset  # the archive's end blocks start here; the record's zero padding follows them
    info = tarfile.TarInfo("top/huge.bin")
    info.size = 0
    block = bytearray(info.tobuf(format=tarfile.USTAR_FORMAT))
    block[124:136] = f"{size:011o}".encode() + b"\0" if size < 8 ** 11 else b"\x80" + size.to_bytes(11, "big")
    block[148:156] = b"        "
    block[148:156] = f"{sum(block):06o}\0 ".encode()
    body[end:end] = bytes(block) + bytes(512)
    return gzip.compress(bytes(body))


def bundle_variant(raw: bytes, draw) -> bytes:
    """A damaged or hostile variant of a real bundle; `draw` is hypothesis's (the bundle itself is no argument,
    so hypothesis never prints its bytes)."""
    how = draw(st.sampled_from(["truncate", "flip", "manifest", "snapshot", "absurd", "names", "both"]))
    if how == "truncate":
        return raw[:draw(st.integers(0, len(raw) - 1))]
    if how == "flip":
        body = bytearray(raw)
        for _ in range(draw(st.integers(1, 5))):
            at = draw(st.integers(10, len(body) - 1))
            body[at] ^= draw(st.integers(1, 255))
        return bytes(body)
    if how == "absurd":
        return _absurd_member(raw, draw(st.sampled_from([2**33, 2**62, 8**11 - 1, 2**80])))
    members = _members(raw)
    if how == "names":
        info = tarfile.TarInfo(draw(st.sampled_from(["../../escape", "/abs/path", "top/" + "d/" * 200 + "f",
                                                     "top/tree/sys/class", "top/\x1b[2J"])))
        kind = draw(st.sampled_from([tarfile.REGTYPE, tarfile.SYMTYPE, tarfile.DIRTYPE, tarfile.FIFOTYPE]))
        info.type = kind
        info.linkname = "/etc/passwd"
        members.append((info, b"x" if kind == tarfile.REGTYPE else None))
        return _pack(members)
    targets = {"manifest": ["manifest.json"], "snapshot": ["gpuwarden/snapshot.json"],
               "both": ["manifest.json", "gpuwarden/snapshot.json"]}[how]
    out = []
    for info, data in members:
        rel = info.name.split("/", 1)[-1]
        if rel in targets and data is not None:
            if draw(st.booleans()):
                data = json.dumps(draw(JSON), allow_nan=True).encode()
            else:  # the real document with one value swapped for something of another shape
                doc = json.loads(data)
                keys = list(doc) if isinstance(doc, dict) else []
                if keys:
                    doc[draw(st.sampled_from(keys))] = draw(JSON)
                data = json.dumps(doc, allow_nan=True).encode()
        out.append((info, data))
    return _pack(out)


@fuzz(15)
@given(data=st.data())
def test_fuzz_bundle_replay(tmp_path_factory, real_bundle, data):
    from gpuwarden.ops.bundle.replay import snapshot_from_bundle
    from gpuwarden.ops.foundation.settings import Settings
    from gpuwarden.playbooks.cli.status_text import render
    body = bundle_variant(real_bundle, data.draw)
    d = tmp_path_factory.mktemp("replay")
    path = d / "b.tar.gz"
    path.write_bytes(body)
    with case("bundle (status --bundle replay)") as result:
        try:
            snap = snapshot_from_bundle(path, Settings(state_dir=d / "state"))
        except GpuwardenError as exc:
            one_line_error(exc)
            result["refused"] = True
            return
        no_escapes(render(snap))
        snap.to_json()


@fuzz(4)
@given(data=st.data())
def test_fuzz_bundle_cli(tmp_path_factory, real_bundle, data):
    body = bundle_variant(real_bundle, data.draw)
    d = tmp_path_factory.mktemp("replaycli")
    (d / "b.tar.gz").write_bytes(body)
    with case("bundle (status --bundle CLI)") as result:
        result["refused"] = cli_outcome(*run_cli("--state-dir", str(d / "s"), "status", "--bundle", str(d / "b.tar.gz")))


# --- state files --------------------------------------------------------------------------------

STATE_FILES = ["baseline.json", "drained.json", "engines/e0/state.json", "engines/e0/spec.json", "journal.log",
               "locks/gpu-0.lock", "gate/slot-0.lock", "sim/allocs/1-1-0.json", "sim/registrations/1-0-1.json",
               "bundles/.auto.last", "sim/node.json"]


@st.composite
def state_contents(draw):
    kind = draw(st.sampled_from(["json", "bytes", "deep", "lines"]))
    if kind == "json":
        return json.dumps(draw(JSON), allow_nan=True).encode()
    if kind == "deep":
        n = draw(st.integers(100, 20000))
        return ("[" * n + "]" * n).encode()
    if kind == "lines":
        return b"\n".join(json.dumps(draw(JSON), allow_nan=True).encode() for _ in range(draw(st.integers(1, 4))))
    return draw(st.binary(max_size=300))


@pytest.fixture(scope="module")
def sim_state(tmp_path_factory) -> Path:
    from gpuwarden.ops.node.sim.node import SimNode
    state = tmp_path_factory.mktemp("fuzz-state") / "state"
    state.mkdir()
    SimNode(state).init(gpus=2, vram=4 << 30)
    return state


@contextlib.contextmanager
def planted(path: Path, content: bytes):
    """`content` at `path` for the duration; what was there before comes back."""
    backup = path.read_bytes() if path.exists() else None
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content)
    try:
        yield
    finally:
        if backup is None:
            path.unlink()
        else:
            path.write_bytes(backup)


def _readers(state: Path) -> None:
    """Every in-process reader of the state files; each must answer or raise one GpuwardenError."""
    from gpuwarden.ops.foundation import gate, gpulock, journal
    from gpuwarden.ops.node import nodestate
    from gpuwarden.ops.engines import state as st_
    from gpuwarden.ops.foundation.settings import Settings
    from gpuwarden.ops.node.sim import registrations
    from gpuwarden.ops.node.sim.node import SimNode
    settings = Settings(state_dir=state)
    calls = [
        lambda: nodestate.drained_or_warning(state), lambda: nodestate.baseline_or_warning(state),
        lambda: st_.list_engines(settings), lambda: journal.read_checked(state),
        lambda: journal.read_checked(state, 5), lambda: gate.holders(state / "gate", 2),
        lambda: registrations.list_all(state), lambda: SimNode(state).describe(),
        lambda: st_.read_state(state, "e0"), lambda: st_.read_spec(state, "e0"),
        lambda: nodestate.drained(state),
    ]
    for call in calls:
        try:
            call()
        except GpuwardenError as exc:
            one_line_error(exc)
    with gpulock.hold(state, [0], "fuzz"):
        pass


@fuzz(80)
@given(rel=st.sampled_from(STATE_FILES), content=state_contents())
def test_fuzz_state_files(sim_state, rel, content):
    with planted(sim_state / rel, content), case("state files (every loader)"):
        _readers(sim_state)


@pytest.mark.parametrize("rel", STATE_FILES)
@pytest.mark.parametrize("content", [b'{"gpus": {"0": {"vram_bytes": "x"}}, "0": 7, "name": 5, "pid": "1"}',
                                     b"\xff\xfe[" * 3000],
                         ids=["wrong-types", "deep-not-utf8"])
def test_fuzz_state_files_cli(sim_state, rel, content):
    with planted(sim_state / rel, content), case("state files (status, engines list, journal CLI)") as result:
        codes = []
        for args in (("--backend", "sim", "status"), ("engines", "list"), ("journal",)):
            code, out, err = run_cli("--state-dir", str(sim_state), *args)
            result["refused"] = cli_outcome(code, out, err) or result.get("refused")
            codes.append(code)
        if rel != "sim/node.json":  # a corrupt file of gpuwarden's own is a warning: the node still shows
            assert codes[0] in (0, 1), (rel, codes)


# --- kernel logs (the triage helper owns the analyzer; this only checks the CLI's contract) ----

@fuzz(8)
@given(raw=st.binary(max_size=2000) | st.text(max_size=2000).map(lambda t: t.encode()))
def test_fuzz_kernel_log_cli(tmp_path_factory, raw):
    d = tmp_path_factory.mktemp("klog")
    (d / "kern.log").write_bytes(b"[    1.000000] amdgpu 0000:03:00.0: " + raw)
    with case("kernel log (triage CLI)") as result:
        code, out, err = run_cli("--state-dir", str(d / "s"), "triage", str(d / "kern.log"))
        assert code in (0, 1, 2) and "Traceback" not in err, (code, err)
        result["refused"] = code == 2


# --- issue 39: arena options, bundle manifests, pipelined HTTP ---------------------------------------------

ARENA_SIZES = ["4KiB", "1MiB", "1.5MiB", "3MiB", "4097B", "0", "-1MiB", "", "1e9", "abc", "99999PiB", "１MiB"]
CHUNK_SIZES = ["4KiB", "64KiB", "1MiB", "4GiB", "1TiB", "2TiB", "99999PiB", "9999999999999999999999TiB", "0",
               "4095B", "-4KiB", "", "1.5KiB", "１MiB"]
WORKER_COUNTS = [None, "1", "2", "16", "0", "-1", "1024", "1025", "100000", " 2", "２", "x"]


@fuzz(25)
@given(size=st.sampled_from(ARENA_SIZES), chunk=st.sampled_from(CHUNK_SIZES), workers=st.sampled_from(WORKER_COUNTS))
def test_fuzz_arena_create_options(tmp_path_factory, size, chunk, workers):
    """Any mix of --size, --chunk-size and --workers: exit 0 with an arena that verifies, or exit 2 in one line;
    never a traceback (OverflowError, MemoryError) and never a partial file left behind."""
    d = tmp_path_factory.mktemp("arena-opts")
    path = d / "a.arena"
    args = ["--state-dir", str(d / "s"), "arena", "create", str(path), "--size", size, "--chunk-size", chunk, "-q"]
    args += ["--workers", workers] if workers is not None else []
    with case("arena create options (CLI)") as result:
        result["refused"] = cli_outcome(*run_cli(*args))
        if result["refused"]:
            assert not list(d.glob("*arena*")), list(d.iterdir())
        else:
            assert cli_outcome(*run_cli("--state-dir", str(d / "s"), "arena", "verify", str(path), "-q")) is False


MANIFEST_KEYS = ["schema", "format", "tool", "created", "host", "collectors", "items", "not_collected", "redaction",
                 "tree", "subject", "options", "collected_by", "duration_s", "created_at"]


def manifest_variant(raw: bytes, draw) -> bytes:
    """The real bundle with its manifest changed in one key: dropped, or given a value of any JSON shape."""
    out = []
    key = draw(st.sampled_from(MANIFEST_KEYS))
    drop = draw(st.booleans())
    replacement = None if drop else draw(JSON)
    for info, data in _members(raw):
        if info.name.endswith("/manifest.json") and info.name.count("/") == 1 and data is not None:
            doc = json.loads(data)
            if drop:
                doc.pop(key, None)
            else:
                doc[key] = replacement
            data = json.dumps(doc, allow_nan=True).encode()
        out.append((info, data))
    return _pack(out)


@fuzz(6)
@given(data=st.data())
def test_fuzz_bundle_manifest_one_judgement(tmp_path_factory, real_bundle, data):
    """Every command that opens a bundle judges its manifest alike: all refuse it (exit 2) or none does."""
    d = tmp_path_factory.mktemp("manifest")
    path = d / "b.tar.gz"
    path.write_bytes(manifest_variant(real_bundle, data.draw))
    with case("bundle manifest (status/triage/report/doctor CLI)") as result:
        verdicts = {}
        for words in (("status", "--bundle"), ("triage",), ("report", "--json"), ("doctor", "--bundle")):
            verdicts[words] = cli_outcome(*run_cli("--state-dir", str(d / "s"), *words, str(path)))
        assert len(set(verdicts.values())) == 1, verdicts
        result["refused"] = next(iter(verdicts.values()))


REQUESTS = [b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n", b"GET /v1/snapshot HTTP/1.1\r\n\r\n",
            b"GET /nope HTTP/1.1\r\n\r\n", b"POST /healthz HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc",
            b"GARBAGE\r\n\r\n", b"GET /healthz\r\n\r\n", b"GET /healthz HTTP/9.9\r\n\r\n",
            b"GET /healthz HTTP/1.1\r\nX: " + b"y" * 70000 + b"\r\n\r\n", b"\x16\x03\x01\x00\x05hello",
            b"GET /healthz?x=1 HTTP/1.1\r\n\r\n", b"GET /v1/history?gpu=\xef\xbc\x91 HTTP/1.1\r\n\r\n"]


class _FakeAgent:
    """What the API reads of an agent (api.Served), without the sampling: healthy, one tiny snapshot."""

    stopping = False
    metrics = None
    events = None
    history = None

    def health(self):
        return {"ok": True}

    def snapshot_document(self):
        return b"{}", False, False

    def backend_name(self):
        return "fake"

    def log(self, level, text):
        pass


@pytest.fixture(scope="module")
def api_server():
    import tempfile
    import threading

    from gpuwarden.ops.services.agent_api import Access, ApiServer
    d = Path(tempfile.mkdtemp(prefix="gwfz-"))
    server = ApiServer(d / "api.sock", _FakeAgent(), Access(None), max_clients=4)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield server, d / "api.sock"
    server.shutdown()
    server.server_close()


@fuzz(20)
@given(bursts=st.lists(st.lists(st.sampled_from(REQUESTS), min_size=1, max_size=60), min_size=1, max_size=8))
def test_fuzz_pipelined_http(api_server, bursts):
    """Connections that pipeline any mix of requests and never read (more of them than the server's 4 slots): a
    fresh /healthz is still answered 200, and what each burst gets back is whole HTTP answers, at most one per
    request."""
    import socket

    from gpuwarden.ops.agent.client import get
    _server, path = api_server
    socks = []
    with case("pipelined HTTP (agent API)"):
        try:
            for burst in bursts:
                s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                s.settimeout(2)
                s.connect(str(path))
                try:
                    s.sendall(b"".join(burst))
                except OSError:  # the server may close a connection whose request it refused
                    pass
                socks.append((s, len(burst)))
            reply = get(path, "/healthz", timeout=3)
            assert reply is not None and reply.status == 200, reply
            for s, sent in socks:
                s.settimeout(0.3)
                data = b""
                try:
                    while chunk := s.recv(1 << 16):
                        data += chunk
                except OSError:
                    pass
                # Status lines only: an error body may itself say "speak HTTP/1.x".
                answers = len(re.findall(rb"(?:^|\n)HTTP/1\.[01] \d{3} ", data))
                assert answers <= sent and (not data or re.match(rb"HTTP/1\.[01] \d{3} ", data)), data[:200]
        finally:
            for s, _ in socks:
                s.close()
