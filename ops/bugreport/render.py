"""The report as Markdown, in the order ROCm's and NVIDIA's issue templates ask: environment, what happened,
how to reproduce, what was ruled out, known issues, attachments. The body is already redacted (build.py).
"""

from __future__ import annotations

from typing import Any

from gpuwarden.ops.foundation.units import fmt_bytes


def _v(value: Any) -> str:
    return "not recorded" if value in (None, "", {}, []) else str(value)


def _seconds(value: Any) -> str:
    """One format for the column (issue 36: 0.1234 beside 0.30000000000000004): milliseconds, 3 decimals."""
    return f"{value:.3f}" if isinstance(value, (int, float)) and not isinstance(value, bool) else _v(value)


def markdown(r: dict[str, Any]) -> str:
    env, what, rep = r["environment"], r["what_happened"], r["reproduction"]
    out = [f"# {r['title']}", "",
           f"_Written by `gpuwarden report` from `{r['bundle']}`; secrets redacted as in every gpuwarden sink._", "",
           "## Environment", ""]
    if env.get("simulated"):
        out += ["- **SIMULATED node** (gpuwarden's sim backend): not real GPUs", ""]
    out.append("| GPU | model | gfx target | bus | VRAM |")
    out.append("|---|---|---|---|---|")
    for g in env.get("gpus") or []:
        vram = fmt_bytes(g["vram_total"]) if isinstance(g.get("vram_total"), int) else "?"
        out.append(f"| {g.get('index')} | {_v(g.get('name'))} | {_v(g.get('gfx_target'))} | {_v(g.get('bus_id'))} "
                   f"| {vram} |")
    libs = ", ".join(f"{k} {v}" for k, v in sorted((env.get("gpu_libraries") or {}).items()))
    out += ["", f"- kernel: {_v(env.get('kernel'))} ({_v(env.get('machine'))}); {_v(env.get('platform'))}",
            f"- amdgpu driver: {_v(env.get('amdgpu_module'))}; NVIDIA driver: {_v(env.get('nvidia_driver'))}",
            f"- ROCm/CUDA user space (libraries the engines had mapped): {_v(libs)}",
            f"- kernel command line: `{_v(env.get('kernel_cmdline'))}`"]
    params = env.get("amdgpu_parameters") or {}
    if params:
        out.append("- amdgpu parameters: " + ", ".join(f"`{k}={v}`" for k, v in sorted(params.items())))
    fw = env.get("firmware") or {}
    if fw:
        first = sorted(fw)[0]
        same = all(fw[c] == fw[first] for c in fw)
        shown = fw[first] if same else None
        if shown is not None:
            out.append(f"- firmware (same on all {len(fw)} GPUs): " + ", ".join(f"{k} {v}" for k, v in sorted(shown.items())))
        else:
            out += [f"- firmware {c}: " + ", ".join(f"{k} {v}" for k, v in sorted(fw[c].items())) for c in sorted(fw)]
    out.append(f"- gpuwarden {_v(env.get('gpuwarden'))}")
    out += ["", "## What happened", "", f"**{_v(what.get('headline'))}**", ""]
    out += [f"- {s}" for s in what.get("summary") or []]
    if what.get("crashes"):
        out += ["", "Crash signatures (grouped by library + offset):", ""]
        for c in what["crashes"]:
            who = ", ".join(c["processes"][:8])
            out.append(f"- {c['title']}" + (f" — {who}" if who and who not in c["title"] else ""))
    if what.get("registrations"):
        out += ["", "Host-memory registrations (the interposer's record of each call):", "",
                "| engine | call | bytes | outcome | result | seconds |", "|---|---|---|---|---|---|"]
        for g in what["registrations"]:
            size = fmt_bytes(g["bytes"]) if isinstance(g.get("bytes"), int) else "?"
            out.append(f"| {g.get('engine')} | {_v(g.get('call'))} | {size} | {g.get('outcome')} "
                       f"| {_v(g.get('result'))} | {_seconds(g.get('seconds'))} |")
    out += ["", "## How to reproduce", ""]
    if rep.get("command"):
        out += ["```", rep["command"], "```", "", rep["why"]]
    else:
        out.append(rep["why"])
    if rep.get("probe_result"):
        out += ["", "The probe's result in this bundle:", "", "```json", str(rep["probe_result"])[:2000], "```"]
    out += ["", "## What was ruled out (`gpuwarden doctor` over the bundle)", ""]
    out += [f"- {c['check']}: {c['reason']}" for c in r["ruled_out"]] or ["- nothing could be checked"]
    if r.get("concerns"):
        out += ["", "Not ruled out:", ""]
        out += [f"- **{c['verdict'].upper()}** {c['check']}: {c['reason']}" + (f" (fix: {c['fix']})" if c.get("fix")
                                                                              else "") for c in r["concerns"]]
    out += ["", "## Known issues that match", ""]
    out += [f"- [{k['title']}]({k['url']}) — `gpuwarden known {k['id']}` (versions: {k['versions']})"
            for k in r["known_issues"]] or ["- none in gpuwarden's catalog"]
    out += ["", f"## Attachments ({r['attachments_total']} files, {fmt_bytes(r['attachments_bytes'])} in the bundle)",
            "", "| file | size | note |", "|---|---|---|"]
    for a in r["attachments"]:
        note = ", ".join(x for x in ("truncated" if a["truncated"] else "",
                                     f"{a['redactions']} redaction(s)" if a["redactions"] else "") if x)
        out.append(f"| `{a['path']}` | {fmt_bytes(a['bytes']) if isinstance(a.get('bytes'), int) else '?'} | {note} |")
    more = r["attachments_total"] - len(r["attachments"])
    if more > 0:
        out.append(f"| ... {more} more (manifest.json lists them) | | |")
    return "\n".join(out) + "\n"
