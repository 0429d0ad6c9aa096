"""What a kernel-log message's text decides on its own, worked out once per distinct message.

A storm repeats a few messages thousands of times; the analyzer keeps one Plan per message (the device it
names, which rules' literals it holds, every regex result on it) so a repeat runs no regex at all.
"""

from __future__ import annotations

import re
from typing import Any, Callable

from gpuwarden.ops.triage.dispatch import Dispatch
from gpuwarden.ops.triage.findings import Finding
from gpuwarden.ops.triage.patterns import Rule

DEVICE = re.compile(r"\b(?:PCI:)?([0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-9a-fA-F])?)\b")
GPU_DRIVER_LINE = re.compile(r"^(?:amdgpu|nvidia|drmn?\d*|\[drm)|NVRM")
MISS = object()  # "not computed yet" (None is a result)
_NONE: frozenset[str] = frozenset()
HOW_BAD = {"critical": 0, "error": 1, "warning": 2, "info": 3}


def device_of(message: str) -> str | None:
    """The PCI device a message names, if any."""
    if ":" not in message:
        return None
    m = DEVICE.search(message)
    return m.group(1) if m else None


class Hit:
    """One rule's match on a message, with what recording it needs precomputed (groups, signature tail...)."""

    __slots__ = ("rule", "groups", "device", "tail", "severity", "how_bad", "details", "victim", "keys", "seen")

    def __init__(self, rule: Rule, m: re.Match[str], dev: str | None) -> None:
        groups = {k: v for k, v in m.groupdict().items() if v is not None}
        self.rule = rule
        self.groups = groups  # shared by every repeat: read, never changed
        self.device = dev or groups.get("dev1") or groups.get("dev2") or groups.get("dev3")
        self.tail = "".join("|" + groups.get(k, "") for k in rule.key)  # the signature after the device
        self.severity = (rule.adjust(groups) if rule.adjust else None) or rule.severity
        self.how_bad = HOW_BAD.get(self.severity, 3)
        self.details = tuple((k, v) for k, v in groups.items()
                             if k not in rule.key and k not in rule.victim and not k.startswith("dev") and k != "tid")
        victim = None
        if rule.victim and (groups.get("pid") not in (None, "0") or groups.get("proc", "").strip()):
            victim = {("process" if k == "proc" else "pid" if k == "rpid" else k):
                      (int(v) if k.endswith("pid") else v.strip()) for k, v in groups.items()
                      if k in rule.victim and v and v.strip()} or None
        self.victim = victim  # copied before a finding keeps it
        self.keys: dict[str | None, tuple[str, str]] = {}  # device -> finding key (rule id, signature)
        # finding key -> the Finding this hit's details and victim went into: a finding's detail values and
        # victims only ever grow, so adding the same ones again to the same Finding changes nothing
        self.seen: dict[tuple[str, str], Finding] = {}


class Plan:
    """The text-only facts about one message; regex results are filled in the first time they are asked."""

    __slots__ = ("message", "low", "dev", "gpu_line", "traceback", "error_word", "candidates", "specials", "hits",
                 "found")

    def __init__(self, message: str, dispatch: Dispatch) -> None:
        self.message = message
        self.low = message.lower()
        self.dev = dev = device_of(message)
        self.gpu_line = dev is not None and GPU_DRIVER_LINE.search(message) is not None
        self.traceback = "Traceback" in message
        self.error_word = "*ERROR*" in message
        candidates, specials = dispatch(message, self.low)
        self.candidates = tuple(candidates)
        self.specials = frozenset(specials) if specials else _NONE  # most messages: none, one shared empty set
        self.hits: list[Hit] | None = None  # the candidate rules that match, once the analyzer asks
        self.found: dict[Any, Any] = {}  # id(regex) or a name -> its result on this message

    def search(self, regex: re.Pattern[str]) -> re.Match[str] | None:
        """regex.search(message), remembered (keyed by the pattern's identity: hashing a Pattern is slow)."""
        found = self.found
        m = found.get(id(regex), MISS)
        hit: re.Match[str] | None  # what found holds under id(regex): that regex's search result
        if m is MISS:
            hit = found[id(regex)] = regex.search(self.message)
        else:
            hit = m
        return hit

    def once(self, key: Any, compute: Callable[..., Any], *args: Any) -> Any:
        """compute(*args), remembered under key (for results that are not one regex search of the message)."""
        found = self.found
        v = found.get(key, MISS)
        if v is MISS:
            v = found[key] = compute(*args)
        return v
