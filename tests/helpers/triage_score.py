"""Score triage against the corpus: found / partly / missed per expected finding, false findings, headlines.

Used by tests/unit/ops/triage/test_triage_corpus.py (CI) and runnable alone: `python tests/helpers/triage_score.py [-v]`.
"""

from __future__ import annotations

import os
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CORPUS = ROOT / "tests" / "triage_corpus"
SHARED = ROOT / "tests" / "fixtures" / "dmesg"
COUNTED = ("critical", "error", "warning")


@dataclass
class CaseScore:
    name: str
    found: list[str] = field(default_factory=list)
    partly: list[str] = field(default_factory=list)
    missed: list[str] = field(default_factory=list)
    false: list[str] = field(default_factory=list)
    reported: int = 0  # findings at warning or worse
    headline_ok: bool | None = None
    headline: str = ""
    exit_ok: bool | None = None


def _facts_hold(f, want: dict) -> list[str]:
    """The facts of `want` that finding `f` does not carry."""
    bad = []
    blob = (f.title + " " + repr(f.details)).lower()
    for key, value in want.items():
        if key in ("rule",):
            continue
        if key == "device":
            ok = value in f.devices or value in f.title
        elif key == "process":
            ok = any(v.get("process") == value for v in f.victims) or value in f.title
        elif key == "pid":
            ok = any(v.get("pid") == value for v in f.victims) or f" {value}" in f.title
        elif key == "xid":
            ok = f.details.get("xid") == value
        elif key == "library":
            lib = f.details.get("library") or ""
            ok = os.path.basename(lib) == value
        elif key == "offset":
            ok = f.details.get("offset") == value
        elif key == "severity":
            ok = f.severity == value
        elif key == "text":
            ok = str(value).lower() in blob
        else:
            ok = False
        if not ok:
            bad.append(f"{key}={value!r}")
    return bad


def score_case(name: str, expect: dict, report) -> CaseScore:
    s = CaseScore(name)
    findings = report.findings
    rules_expected = {w["rule"] for w in expect.get("find", [])}
    allowed = rules_expected | set(expect.get("ok", []))
    for want in expect.get("find", []):
        label = want["rule"] + "".join(f" {k}={v}" for k, v in want.items() if k != "rule")
        same = [f for f in findings if f.rule == want["rule"]]
        if any(not _facts_hold(f, want) for f in same):
            s.found.append(label)
        elif same:
            gaps = min((_facts_hold(f, want) for f in same), key=len)
            s.partly.append(f"{label}  (lacks {', '.join(gaps)})")
        else:
            s.missed.append(label)
    counted = [f for f in findings if f.severity in COUNTED]
    s.reported = len(counted)
    s.false = [f"{f.rule}: {f.title}" for f in counted if f.rule not in allowed]
    if "headline" in expect:
        top = next((f for f in report.ordered() if f.severity != "info"), None)
        s.headline = f"{top.rule}: {top.title}" if top else ""
        want = expect["headline"]
        s.headline_ok = (top is None) if not want else (
            top is not None and top.rule == want
            and expect.get("headline_text", "").lower() in top.title.lower())
    if "exit" in expect:
        counts = report.counts()
        code = 1 if counts.get("critical") or counts.get("error") else 0
        s.exit_ok = code == expect["exit"]
    return s


def corpus_cases(folder: Path = CORPUS, prefix: str = "") -> list[tuple[str, Path, dict]]:
    out = []
    for log in sorted(folder.glob("*.log")):
        exp = log.with_suffix(".expect")
        out.append((prefix + log.stem, log, tomllib.loads(exp.read_text())))
    return out


def holdout_cases() -> list[tuple[str, Path, dict]]:
    """Excerpts collected after the rules were written (tests/triage_corpus/holdout): the blind test."""
    return corpus_cases(CORPUS / "holdout", "holdout/")


def shared_cases() -> list[tuple[str, Path, dict]]:
    """The captured fixtures (tests/fixtures/dmesg), with the rule sets test_triage.py expects of them (rules only, no facts)."""
    if not SHARED.is_dir():
        raise FileNotFoundError(f"the captured fixtures are missing ({SHARED}): the checkout is incomplete")
    sys.path.insert(0, str(ROOT / "tests"))
    from helpers.triage import EXPECTED  # one list of expectations for those fixtures
    return [(f"shared/{n}", SHARED / n, {"find": [{"rule": r} for r in sorted(rules)]})
            for n, rules in sorted(EXPECTED.items()) if (SHARED / n).exists()]


def run(verbose: bool = False, out=sys.stdout) -> dict:
    from gpuwarden.ops.triage import analyze_file
    scores = []
    for name, path, expect in corpus_cases() + holdout_cases() + shared_cases():
        scores.append(score_case(name, expect, analyze_file(path)))
    total = sum(len(s.found) + len(s.partly) + len(s.missed) for s in scores)
    found = sum(len(s.found) for s in scores)
    partly = sum(len(s.partly) for s in scores)
    missed = sum(len(s.missed) for s in scores)
    reported = sum(s.reported for s in scores if not s.name.startswith("shared/"))
    false = sum(len(s.false) for s in scores if not s.name.startswith("shared/"))
    heads = [s for s in scores if s.headline_ok is not None]
    exits = [s for s in scores if s.exit_ok is not None]
    result = {
        "excerpts": len(scores), "expected": total, "found": found, "partly": partly, "missed": missed,
        "recall": found / total if total else 1.0, "reported": reported, "false": false,
        "false_rate": false / reported if reported else 0.0,
        "headlines": sum(s.headline_ok for s in heads), "headline_cases": len(heads),
        "exits": sum(s.exit_ok for s in exits), "exit_cases": len(exits), "scores": scores,
    }
    for s in scores:
        bad = s.partly or s.missed or s.false or s.headline_ok is False or s.exit_ok is False
        if not (verbose or bad):
            continue
        print(f"{s.name}: found {len(s.found)} partly {len(s.partly)} missed {len(s.missed)} "
              f"false {len(s.false)}", file=out)
        for p in s.partly:
            print(f"    partly: {p}", file=out)
        for m in s.missed:
            print(f"    missed: {m}", file=out)
        for x in s.false:
            print(f"    false:  {x}", file=out)
        if s.headline_ok is False:
            print(f"    headline: {s.headline or '(none)'}", file=out)
        if s.exit_ok is False:
            print("    exit status differs", file=out)
    held = [x for x in scores if x.name.startswith("holdout/")]
    if held:
        h_total = sum(len(x.found) + len(x.partly) + len(x.missed) for x in held)
        h_found = sum(len(x.found) for x in held)
        h_false = sum(len(x.false) for x in held)
        h_rep = sum(x.reported for x in held)
        print(f"held-out: {len(held)} excerpts, {h_total} expected findings: found {h_found}, partly "
              f"{sum(len(x.partly) for x in held)}, missed {sum(len(x.missed) for x in held)}; false findings "
              f"{h_false} of {h_rep}; headline right {sum(bool(x.headline_ok) for x in held)}/{len(held)}", file=out)
    print(f"corpus: {result['excerpts']} excerpts, {total} expected findings: found {found}, partly {partly}, "
          f"missed {missed}; recall {result['recall']:.1%}; false findings {false} of {reported} reported "
          f"({result['false_rate']:.1%}); headline right {result['headlines']}/{result['headline_cases']}; "
          f"exit status right {result['exits']}/{result['exit_cases']}", file=out)
    return result


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    run(verbose="-v" in sys.argv)
