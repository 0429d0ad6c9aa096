"""Triage's two line parsers give the same results: the compiled one (native/triage/lines.c) and the Python one.

Every report of the corpus, the fixtures, the bench's storms and hostile input is compared byte for byte
(Markdown and --json) between the two paths, and so is every LogLine of thousands of generated lines built
from the prefixes logline.py knows. The fallback is tested in real subprocesses: forced by the environment
variable, and with the extension hidden.
"""

from __future__ import annotations

import importlib.util
import json
import os
import random
import shlex
import shutil
import subprocess
import sys
from dataclasses import astuple
from pathlib import Path

import pytest

from helpers.paths import REPO

from gpuwarden.ops.triage import analyze_file, lineparse
from gpuwarden.ops.triage.logline import MAX_LINE, LineParser
from gpuwarden.ops.triage.render import as_document, markdown

CORPUS = REPO / "tests" / "triage_corpus"
PATHS = ("compiled", "pure")
# Prefixes every format logline.py knows starts with, and near misses of each: the generated lines mix them.
PREFIXES = (
    "", "[    1.000000] ", "[12.5]", "[\t7.25]\t", "[  12.345678]  ", "[1.]", "[ 12]", "[Tue Mar  5 10:00:00 2024] ",
    "[Tue Mar  5 10:00:00 2024]", "[Wed Jun 18 01:02:03 2025] [  3.5] ", "[Tue Mar 15 10:00:00 2024] ",
    "[Tue Mar 123 10:00:00 2024] ", "[Tue mar  5 10:00:00 2024] ", "[May19 19:57] ", "[  +0.000127] ", "[ \t+1.5] ",
    "[Mon x] ", "kernel: ", "kernel:", "kernel:\t[ 5.0] ", "kernel: [  1.5] ", "kernel: kern: warning: [2026-04-22T21:27:51Z]: ",
    "192.168.11.119: kern: warning: [2026-04-22T21:27:51.29Z]: ", "host: user: err: [x]: ", "kern  :err   : ",
    "kern :warn  : [  2.0] ", "user:info: ", "local7 : debug: ", "Jan  2 03:04:05 host kernel: ", "Jan 02 21:35:19  kernel: ",
    "Sept. 9 12:00:01.123456 node-1 kernel: [ 9.5] ", "Apr  9 12:59:18 host sudo[123]: ", "Apr 9 12:59:18 a b[12]:x",
    "Mar 3 1:02:03 host kernel: ", "Marchx 3 10:02:03 host kernel: ", "2024-01-02T03:04:05.123456+00:00 host kernel: ",
    "2024-01-02T03:04:05Z ", "2024-01-0 ", "14:16:27.894416 pop-os kernel: ", "14:16:27 kernel: ", "1:2 ",
    "/var/log/syslog:Apr  9 12:59:18 host kernel: ", "/var/log/kern.log.1:", "/x ", "_x: ", ".a: ", "-a: ", ":a ",
    "  ", "\t", " [ 1.0] ", "[12345678901.1234567] ", "Jan  2 03:04:05 host kernel: [12345678901.123456] ",
    "kernel: [0.00000000000000000001] ", "[Tue Mar  5 10:00:00 2024] [99999999999.99999] ", "*", "<6>", "kfd kfd: ", "authpriv: ", "kernel : ", "amdgpu: ", "NVRM: ",
)
BODIES = (
    "amdgpu 0000:c3:00.0: amdgpu: GPU reset begin!", "NVRM: Xid (PCI:0000:b3:00): 79, GPU has fallen off the bus.",
    "[drm:amdgpu_job_timedout [amdgpu]] *ERROR* ring gfx timeout", "", "x", " indented", "ends with blank ",
    "kern: warning: [2026-01-01T00:00:00Z]: inner", "a: b: [c]", "segfault at 0 ip 00007f sp 0 error 4 in libc.so.6",
)
ODD = ("\xa0", "\u3000", "\x1c", "\x0b", "\r", "\x00", "é", "\ufffd", "\t", " ")


@pytest.fixture(params=PATHS)
def path(request, monkeypatch) -> str:
    """Which parser the stream uses for this test: the compiled one (skipped where it was not built) or Python's."""
    if request.param == "compiled":
        if not lineparse.COMPILED:
            pytest.skip("the compiled line parser is not built here (test_the_editable_install_built_it says why)")
    else:
        monkeypatch.setattr(lineparse, "_LINES", None)
    return str(request.param)


def _report(log: Path) -> tuple[str, str]:
    """The Markdown report and the --json document (less its generation time) of one log."""
    report = analyze_file(log)
    doc = as_document(report)
    doc.pop("generated", None)
    doc.pop("generated_iso", None)
    return markdown(report), json.dumps(doc, indent=2, sort_keys=True)


def _both(log: Path, monkeypatch) -> tuple[tuple[str, str], tuple[str, str]]:
    if not lineparse.COMPILED:
        pytest.skip("the compiled line parser is not built here")
    compiled = _report(log)
    with monkeypatch.context() as m:
        m.setattr(lineparse, "_LINES", None)
        pure = _report(log)
    return compiled, pure


def _logs(fixtures: Path) -> list[Path]:
    return sorted(CORPUS.glob("*.log")) + sorted((CORPUS / "heldout").glob("*.log")) + sorted(
        p for p in (fixtures / "dmesg").iterdir() if p.is_file())


def test_the_editable_install_built_it():
    # `pip install -e .` (tests/run-all.sh) builds the extension wherever a C compiler is: without this, the
    # comparisons below would compare the Python parser with itself and pass
    compiler = shlex.split(os.environ.get("CC") or "cc")[0]  # what setup.py looks for, the same way
    if shutil.which(compiler) is None:
        pytest.skip("no C compiler here: the install took the pure-Python parser, as it should")
    assert _built(), (
        "ops/triage/_lines*.so was not built: run `pip install -e .` (setup.py builds native/triage/lines.c)")


def _built() -> bool:
    """Whether the extension is there to import (whatever GPUWARDEN_TRIAGE_PURE says for this run)."""
    return importlib.util.find_spec("gpuwarden.ops.triage._lines") is not None


def test_corpus_and_fixture_reports_are_the_same_byte_for_byte(fixtures, monkeypatch):
    logs = _logs(fixtures)
    assert len(logs) > 60
    for log in logs:
        compiled, pure = _both(log, monkeypatch)
        assert compiled[0] == pure[0], f"{log.name}: the Markdown reports differ"
        assert compiled[1] == pure[1], f"{log.name}: the --json documents differ"


@pytest.mark.parametrize("kind", ["node", "storm", "storm-fresh"])
def test_bench_storms_give_the_same_report(kind, tmp_path, monkeypatch):
    sys.path.insert(0, str(REPO / "tests" / "bench"))
    try:
        import bench_triage
    finally:
        sys.path.remove(str(REPO / "tests" / "bench"))
    log = tmp_path / f"{kind}.log"
    bench_triage.build(log, 1, kind)
    compiled, pure = _both(log, monkeypatch)
    assert compiled == pure
    assert "## " in compiled[0] and json.loads(compiled[1])["lines"] > 10000


HOSTILE = {
    "invalid-utf8": b"[  1.0] amdgpu 0000:03:00.0: \xff\xfe bad \xc3( bytes GPU reset begin!\n\xe2\x82\n[\xff 2.0] x\n",
    "nul": b"[  1.0] amdgpu\x00 0000:03:00.0: amdgpu: GPU reset begin!\n\x00\n[\x00  2.0] x\nkernel:\x00 y\n",
    "mb-line": b"[  1.0] " + b"amdgpu 0000:03:00.0: GPU reset begin! " * 28000 + b"\n[  2.0] after\n",
    "mb-no-newline": b"[  1.0] first\n[  2.0] " + b"\xe9x" * (1 << 19),
    "cr-only": b"[  1.0] amdgpu 0000:03:00.0: amdgpu: GPU reset begin!\r[  2.0] again\r" * 50,
    "crlf": b"[  1.0] amdgpu 0000:03:00.0: amdgpu: GPU reset begin!\r\n[  2.0] x\r\n\r\n",
    "cut-multibyte": b"[  1.0] " + "é".encode() * MAX_LINE + b"\n",
    "unicode-blanks": "[  1.0]\xa0x\n[\u3000 2.0] y\nkernel:\u2003z\nJan\u00a0 2 03:04:05 h kernel: w\n[\u3000+1.0] v\n"
                      "kern\u00a0: err: u\n".encode(),
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_input_gives_the_same_report(name, tmp_path, monkeypatch):
    log = tmp_path / f"{name}.log"
    log.write_bytes(HOSTILE[name])
    compiled, pure = _both(log, monkeypatch)
    assert compiled == pure


def _lines_of(lines: list[str]) -> bytes:
    return "".join(line + "\n" for line in lines).encode("utf-8", "surrogateescape")


def _generated(seed: int, count: int) -> list[str]:
    rnd = random.Random(seed)
    out = []
    for _ in range(count):
        text = rnd.choice(PREFIXES) + rnd.choice(PREFIXES[:8] + ("",) * 4) + rnd.choice(BODIES)
        if rnd.random() < 0.3:  # an odd character somewhere: inside a prefix, after it, at the end
            at = rnd.randrange(len(text) + 1)
            text = text[:at] + rnd.choice(ODD) + text[at:]
        out.append(text.replace("\n", " "))
    return out


@pytest.mark.parametrize("seed", range(4))
def test_every_generated_line_parses_the_same(seed):
    if not lineparse.COMPILED:
        pytest.skip("the compiled line parser is not built here")
    block = _lines_of(_generated(seed, 5000))
    pure, pure_cut = lineparse.parse_block_pure(block, 7, LineParser())
    compiled, compiled_cut = lineparse.parse_block(block, 7, LineParser())
    assert compiled_cut == pure_cut and len(compiled) == len(pure) == 5000
    for a, b in zip(compiled, pure):
        assert astuple(a) == astuple(b), (a, b)
        assert [type(v) for v in astuple(a)] == [type(v) for v in astuple(b)], (a, b)


def test_the_stream_feeds_parsed_lines_through_parse_block(path, tmp_path):
    # the stream's whole-piece path goes through lineparse (where the switch is): a log whose every line is a
    # candidate gives one finding with every line counted, on either path
    log = tmp_path / "storm.log"
    log.write_text("".join(f"[{i:6d}.000000] amdgpu 0000:03:00.0: amdgpu: GPU reset begin!\n" for i in range(3000)))
    report = analyze_file(log)
    assert report.lines == 3000
    (f,) = report.findings
    assert f.count == 3000 and f.first_stamp == "0.000000" and f.last_time == 2999.0


_PROBE = ("import json, sys; from gpuwarden.ops.triage import lineparse, analyze_file; "
          "from gpuwarden.ops.triage.render import as_document; d = as_document(analyze_file(sys.argv[1])); "
          "d.pop('generated'); d.pop('generated_iso'); print(json.dumps([lineparse.COMPILED, d]))")
# A finder that refuses the extension, as an install without it (no compiler, or an interpreter that cannot
# load an abi3 module) would.
_HIDE = ("import sys\nclass Hide:\n    def find_spec(self, name, path=None, target=None):\n"
         "        if name == 'gpuwarden.ops.triage._lines':\n            raise ImportError('hidden by the test')\n"
         "sys.meta_path.insert(0, Hide())\n")


def _probe(log: Path, env: dict[str, str], prelude: str = "") -> tuple[bool, dict]:
    proc = subprocess.run([sys.executable, "-c", prelude + _PROBE, str(log)], env=env, capture_output=True, text=True,
                          timeout=120, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    compiled, doc = json.loads(proc.stdout)
    return compiled, doc


def test_the_fallback_is_taken_when_asked_or_when_the_extension_cannot_be_imported(tmp_path):
    log = tmp_path / "x.log"
    log.write_bytes((CORPUS / sorted(p.name for p in CORPUS.glob("*.log"))[0]).read_bytes())
    env = {k: v for k, v in os.environ.items() if k != lineparse.PURE_ENV}
    forced, forced_doc = _probe(log, {**env, lineparse.PURE_ENV: "1"})
    hidden, hidden_doc = _probe(log, env, _HIDE)
    default, default_doc = _probe(log, env)
    assert forced is False and hidden is False
    assert default is _built()
    assert forced_doc == hidden_doc == default_doc and forced_doc["findings"]
