"""Extracts the public amdsmi Python API (functions, parameters, returned dict keys, enums, exceptions)
from a copy of the package's source, so stand-ins are built from the real signatures.
"""

from __future__ import annotations

import ast
import json
import sys
from pathlib import Path


def _exported(init_src: str) -> set[str]:
    """Names the package's __init__ re-exports (the API callers reach as amdsmi.<name>)."""
    names = set()
    for node in ast.walk(ast.parse(init_src)):
        if isinstance(node, ast.ImportFrom):
            names.update(alias.asname or alias.name for alias in node.names)
    return names


def _params(fn: ast.FunctionDef) -> list[dict]:
    args = fn.args
    positional = args.posonlyargs + args.args
    first_default = len(positional) - len(args.defaults)
    out = []
    for i, a in enumerate(positional):
        out.append({"name": a.arg, "kind": "positional", "default": i >= first_default,
                    "annotation": ast.unparse(a.annotation) if a.annotation else None})
    if args.vararg:
        out.append({"name": args.vararg.arg, "kind": "var_positional", "default": True, "annotation": None})
    for a, d in zip(args.kwonlyargs, args.kw_defaults):
        out.append({"name": a.arg, "kind": "keyword_only", "default": d is not None,
                    "annotation": ast.unparse(a.annotation) if a.annotation else None})
    if args.kwarg:
        out.append({"name": args.kwarg.arg, "kind": "var_keyword", "default": True, "annotation": None})
    return out


def _dict_keys(fn: ast.FunctionDef) -> list[str]:
    """String keys of every dict literal in the function: the keys its result can carry."""
    keys = set()
    for node in ast.walk(fn):
        if isinstance(node, ast.Dict):
            keys.update(k.value for k in node.keys if isinstance(k, ast.Constant) and isinstance(k.value, str))
    return sorted(keys)


def _says_na(fn: ast.FunctionDef) -> bool:
    """True when the function turns unknown readings into "N/A" (6.2+) instead of raw sentinels (6.1)."""
    for node in ast.walk(fn):
        if isinstance(node, ast.Constant) and node.value == "N/A":
            return True
        if isinstance(node, ast.Name) and node.id == "_validate_if_max_uint":
            return True
    return False


def extract(pkg: Path, label: str) -> dict:
    exported = _exported((pkg / "__init__.py").read_text())
    interface = ast.parse((pkg / "amdsmi_interface.py").read_text())
    functions, enums = {}, {}
    for node in interface.body:
        if isinstance(node, ast.FunctionDef) and node.name in exported:
            functions[node.name] = {"params": _params(node), "returns_keys": _dict_keys(node),
                                    "says_na": _says_na(node)}
        elif isinstance(node, ast.ClassDef) and node.name in exported and any(
                ast.unparse(b).endswith("IntEnum") for b in node.bases):
            enums[node.name] = [t.id for stmt in node.body if isinstance(stmt, ast.Assign)
                                for t in stmt.targets if isinstance(t, ast.Name)]
    exceptions = {}
    for node in ast.parse((pkg / "amdsmi_exception.py").read_text()).body:
        if isinstance(node, ast.ClassDef) and node.name in exported:
            exceptions[node.name] = ast.unparse(node.bases[0]) if node.bases else "Exception"
    return {"label": label, "functions": dict(sorted(functions.items())), "enums": enums,
            "exceptions": exceptions}


# python tests/standins/extract_amdsmi_api.py <dir with __init__.py, amdsmi_interface.py,
#     amdsmi_exception.py> <label> > tests/standins/amdsmi_api/<label>.json
if __name__ == "__main__":
    json.dump(extract(Path(sys.argv[1]), sys.argv[2]), sys.stdout, indent=1, sort_keys=False)
    sys.stdout.write("\n")
