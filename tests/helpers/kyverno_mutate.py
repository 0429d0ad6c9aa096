"""A Kyverno ClusterPolicy's mutate rules run outside Kyverno, as its docs describe them: rules in order,
each on the resource the earlier ones left; a rule's context (configMap, jmesPath variables with a default)
and preconditions (all) decide; `{{ }}` variables are JMESPath, innermost first (nested variables), a string
that is one variable takes its value, otherwise the text is interpolated; patchesJson6902 is RFC 6902;
foreach runs its patches once per element of its list, each on the result of the last.
JMESPath is the `jmespath` package plus the Kyverno functions the policy uses (split, trim, replace_all).
"""

from __future__ import annotations

import copy
import json
import re
from typing import Any

import jmespath
import yaml
from jmespath import functions

from standins.kube_apiserver import json_patch


class _KyvernoFunctions(functions.Functions):
    @functions.signature({"types": ["string"]}, {"types": ["string"]})
    def _func_split(self, s, sep):
        return s.split(sep)

    @functions.signature({"types": ["string"]}, {"types": ["string"]})
    def _func_trim(self, s, cutset):
        return s.strip(cutset)

    @functions.signature({"types": ["string"]}, {"types": ["string"]}, {"types": ["string"]})
    def _func_replace_all(self, s, old, new):
        return s.replace(old, new)


OPTIONS = jmespath.Options(custom_functions=_KyvernoFunctions())
INNERMOST = re.compile(r"\{\{((?:(?!\{\{|\}\}).)*)\}\}", re.S)


def substitute(text: str, data: dict) -> Any:
    while True:
        m = INNERMOST.search(text)
        if m is None:
            return text
        value = jmespath.search(m.group(1).strip(), data, options=OPTIONS)
        if m.span() == (0, len(text)):
            return value
        text = text[:m.start()] + (value if isinstance(value, str) else json.dumps(value)) + text[m.end():]


def _holds(cond: dict, data: dict) -> bool:
    key, value = substitute_any(cond["key"], data), substitute_any(cond["value"], data)
    op = cond["operator"]
    if op == "Equals":
        return key == value
    if op == "NotEquals":
        return key != value
    keys = key if isinstance(key, list) else [key]
    values = value if isinstance(value, list) else [value]
    if op == "AnyIn":
        return any(k in values for k in keys)
    if op == "AnyNotIn":
        return any(k not in values for k in keys)
    raise AssertionError(f"operator {op} is not in this harness")


def substitute_any(value: Any, data: dict) -> Any:
    return substitute(value, data) if isinstance(value, str) else value


class ClusterPolicy:
    def __init__(self, policy: dict, configmaps: dict[tuple[str, str], dict]):
        self.policy, self.configmaps = policy, configmaps

    def _matches(self, rule: dict, pod: dict, operation: str) -> bool:
        namespace = pod["metadata"].get("namespace", "default")

        def fits(res: dict) -> bool:  # a filter's fields all hold; one it leaves out holds for anything
            return ("Pod" in res.get("kinds", ["Pod"]) and operation in res.get("operations", [operation])
                    and namespace in res.get("namespaces", [namespace]))
        if not any(fits(f["resources"]) for f in rule["match"]["any"]):
            return False
        return not any(fits(f["resources"]) for f in (rule.get("exclude") or {}).get("any", []))

    def _context(self, rule: dict, pod: dict) -> dict:
        data: dict[str, Any] = {"request": {"object": pod, "operation": "CREATE"}}
        for entry in rule.get("context", []):
            if "configMap" in entry:
                ref = entry["configMap"]
                data[entry["name"]] = {"data": self.configmaps[(ref["namespace"], ref["name"])]["data"]}
            else:
                value = jmespath.search(entry["variable"]["jmesPath"], data, options=OPTIONS)
                data[entry["name"]] = entry["variable"].get("default") if value is None else value
        return data

    def admit(self, pod: dict) -> dict:
        pod = copy.deepcopy(pod)
        for rule in self.policy["spec"]["rules"]:
            if not self._matches(rule, pod, "CREATE"):
                continue
            data = self._context(rule, pod)
            if not all(_holds(c, data) for c in (rule.get("preconditions") or {}).get("all", [])):
                continue
            mutate = rule["mutate"]
            if "patchesJson6902" in mutate:
                pod = json_patch(pod, yaml.safe_load(substitute(mutate["patchesJson6902"], data)))
            for each in mutate.get("foreach", []):
                for element in jmespath.search(each["list"], data, options=OPTIONS) or []:
                    data = {**self._context(rule, pod), "element": element}
                    if all(_holds(c, data) for c in (each.get("preconditions") or {}).get("all", [])):
                        pod = json_patch(pod, yaml.safe_load(substitute(each["patchesJson6902"], data)))
        return pod
