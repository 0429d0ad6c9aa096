"""The knobs that really exist (knobs.toml): module parameters and runtime environment variables, with sources.

`doctor`'s module-options and runtime-env checks compare what a node sets against these lists and name the
catalog entry that explains an option or variable that does nothing.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

DATA = "knobs.toml"


@dataclass(frozen=True)
class Knobs:
    modules: dict[str, dict[str, Any]]  # name -> {source, version, params}
    noop: dict[tuple[str, str, str], dict[str, str]]  # (module, param, value) -> {why, entry}
    absent_modules: dict[str, dict[str, str]]  # module -> {why, entry}
    param_myths: dict[tuple[str, str], str]  # (module, param) -> entry
    runtimes: dict[str, dict[str, Any]]  # name -> {source, version, vars}
    prefixes: tuple[str, ...]
    env_myths: dict[str, str]  # variable -> entry
    not_judged: frozenset[str]
    not_judged_prefixes: tuple[str, ...]

    def module_params(self, module: str) -> frozenset[str] | None:
        m = self.modules.get(module)
        return frozenset(m["params"]) if m else None

    def reader_of(self, name: str) -> str | None:
        """The runtime that reads `name`, None when none of them does."""
        for runtime, r in self.runtimes.items():
            if name in r["vars"]:
                return runtime
        return None

    def judged(self, name: str) -> bool:
        """Whether `name` is in a namespace these runtimes own (and not a name other programs read)."""
        if name in self.not_judged or name.startswith(self.not_judged_prefixes):
            return False
        return name.startswith(self.prefixes)


def parse(text: str) -> Knobs:
    doc = tomllib.loads(text)
    nj = doc.get("not_judged", {})
    return Knobs(
        modules=dict(doc.get("modules", {})),
        noop={(n["module"], n["param"], n["value"]): {"why": n["why"], "entry": n["entry"]} for n in doc.get("noop", [])},
        absent_modules={a["module"]: {"why": a["why"], "entry": a["entry"]} for a in doc.get("absent_module", [])},
        param_myths={(m["module"], m["param"]): m["entry"] for m in doc.get("param_myth", [])},
        runtimes=dict(doc.get("runtimes", {})),
        prefixes=tuple(doc.get("namespaces", {}).get("prefixes", ())),
        env_myths={m["name"]: m["entry"] for m in doc.get("env_myth", [])},
        not_judged=frozenset(nj.get("names", ())),
        not_judged_prefixes=tuple(nj.get("prefixes", ())),
    )


@lru_cache(maxsize=1)
def load() -> Knobs:
    return parse((Path(__file__).parent / DATA).read_text(encoding="utf-8"))
