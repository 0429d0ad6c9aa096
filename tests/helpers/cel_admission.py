"""A MutatingAdmissionPolicy evaluated as the API server does, outside one: cel-python runs the CEL, this
module supplies the Kubernetes CEL library calls the policy uses and applies the mutations.

Semantics from the Kubernetes docs (Mutating Admission Policy; CEL in Kubernetes): matchConditions all
true or the policy is skipped; variables evaluated in order, each seeing the earlier ones as `variables.X`;
`params` is the bound ConfigMap; a JSONPatch mutation's expression gives a list of JSONPatch{op, path,
value} applied as RFC 6902 to the object as the API server holds it (quantities serialised as strings).
Library calls: strings `split`/`trim`, lists `sum`, `jsonpatch.escapeKey` (RFC 6901 escaping).
"""

from __future__ import annotations

import copy
import json
import re
from typing import Any

import celpy
from celpy import celtypes

from standins.kube_apiserver import json_patch


class _Struct(celtypes.MessageType):
    """JSONPatch{...} and Object.<path>{...}: a typed object literal, a plain JSON object once converted."""


def _split(s, sep):
    return celtypes.ListType([celtypes.StringType(p) for p in str(s).split(str(sep))])


def _trim(s):
    return celtypes.StringType(str(s).strip())


def _sum(items):
    return celtypes.IntType(sum(int(x) for x in items))


def _escape_key(_namespace, key):
    return celtypes.StringType(str(key).replace("~", "~0").replace("/", "~1"))


TYPED = r"\b(Object(?:\.\w+)+)\s*\{"


def _flat(type_name: str) -> str:
    return type_name.replace(".", "__")


FUNCTIONS = {"split": _split, "trim": _trim, "sum": _sum, "escapeKey": _escape_key}


def to_json(value: Any) -> Any:
    if isinstance(value, celpy.CELEvalError):
        raise AssertionError(f"CEL error inside the result: {value}")
    if isinstance(value, (bool, celtypes.BoolType)):  # before int: both are ints to Python
        return bool(value)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, str):
        return str(value)
    if isinstance(value, dict):
        return {str(k): to_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_json(v) for v in value]
    if value is None:
        return None
    raise TypeError(f"not a JSON value: {value!r}")


def as_admitted(pod: dict) -> dict:
    """The pod as admission sees it: resource quantities are strings (the API's Quantity serialisation)."""
    pod = copy.deepcopy(pod)
    spec = pod.get("spec") or {}
    for c in (spec.get("containers") or []) + (spec.get("initContainers") or []):
        for part in ("limits", "requests"):
            got = (c.get("resources") or {}).get(part)
            if got:
                c["resources"][part] = {k: str(v) for k, v in got.items()}
    return pod


class Policy:
    """One MutatingAdmissionPolicy + binding + params ConfigMap, compiled once."""

    def __init__(self, policy: dict, binding: dict, params: dict):
        assert binding["spec"]["policyName"] == policy["metadata"]["name"]
        ref = binding["spec"]["paramRef"]
        assert (ref["name"], ref["namespace"]) == (params["metadata"]["name"], params["metadata"]["namespace"])
        assert policy["spec"]["paramKind"] == {"apiVersion": params["apiVersion"], "kind": params["kind"]}
        self.policy, self.binding, self.params = policy, binding, params
        spec = policy["spec"]
        # Typed literals (JSONPatch{...}, Object.spec.volumes{...}) resolve through the environment's
        # annotations. cel-python cannot hold a type name that is also the prefix of another
        # (Object.spec.volumes and Object.spec.volumes.hostPath), so _compile spells each one flat.
        names = {"JSONPatch"} | {_flat(n) for n in re.findall(TYPED, json.dumps(spec))}
        self.env = celpy.Environment(annotations={n: _Struct for n in names})
        self.conditions = [(c["name"], self._compile(c["expression"])) for c in spec.get("matchConditions", [])]
        self.variables = [(v["name"], self._compile(v["expression"])) for v in spec.get("variables", [])]
        self.mutations = []
        for m in spec["mutations"]:
            assert m["patchType"] == "JSONPatch", "this harness applies JSONPatch mutations"
            self.mutations.append(self._compile(m["jsonPatch"]["expression"]))

    def _compile(self, expr: str):
        expr = re.sub(TYPED, lambda m: _flat(m.group(1)) + "{", expr)
        return self.env.program(self.env.compile(expr), functions=FUNCTIONS)

    def binding_matches(self, namespace: str) -> bool:
        sel = (self.binding["spec"].get("matchResources") or {}).get("namespaceSelector") or {}
        for e in sel.get("matchExpressions", []):
            assert e["key"] == "kubernetes.io/metadata.name"
            inside = namespace in e["values"]
            if (e["operator"] == "NotIn" and inside) or (e["operator"] == "In" and not inside):
                return False
        return True

    def patches(self, pod: dict) -> list[dict] | None:
        """The JSON patch operations for this pod; None when the policy does not apply to it."""
        if not self.binding_matches(pod["metadata"].get("namespace", "default")):
            return None
        act: dict[str, Any] = {"object": celpy.json_to_cel(pod), "params": celpy.json_to_cel(self.params),
                               "jsonpatch": celtypes.MapType(), "variables": celtypes.MapType()}
        for name, prog in self.conditions:
            if not bool(self._eval(prog, act, f"matchCondition {name}")):
                return None
        for name, prog in self.variables:
            act["variables"][celtypes.StringType(name)] = self._eval(prog, act, f"variable {name}")
        out = []
        for prog in self.mutations:
            out += to_json(self._eval(prog, act, "mutation"))
        return out

    @staticmethod
    def _eval(prog, act, what):
        result = prog.evaluate(act)
        if isinstance(result, celpy.CELEvalError):
            raise AssertionError(f"{what}: {result}")
        return result

    def admit(self, pod: dict) -> dict:
        """The pod after this policy's mutations (unchanged when it does not apply)."""
        pod = as_admitted(pod)
        ops = self.patches(pod)
        return json_patch(pod, ops) if ops else pod
