"""Which rules can match a line: every rule's required literals, looked up in one pass over the line.

With the google-re2 wheel one RE2 set search (C, linear) answers for all literals at once; without it a
plain substring test per literal does the same, slower.
"""

from __future__ import annotations

from typing import Protocol, Sequence

from gpuwarden.ops.triage.patterns import Rule


class _LiteralSet(Protocol):
    """What is used of a re2.Set (google-re2 ships no type information)."""

    def Add(self, pattern: str) -> int: ...

    def Compile(self) -> None: ...

    def Match(self, text: bytes) -> list[int] | None: ...  # the indices of the literals found, None for none


class Dispatch:
    """Maps a line to the indices of the rules whose literal it contains (rules without one always qualify)."""

    def __init__(self, rules: Sequence[Rule], specials: Sequence[str] = ()) -> None:
        self.always = [i for i, r in enumerate(rules) if r.hint is None]
        self.literals: list[str] = []
        self.owner: list[tuple[str, int]] = []  # literal index -> ("rule", rule index) or ("special", 0)
        for i, r in enumerate(rules):
            for lit in (r.hint,) if isinstance(r.hint, str) else (r.hint or ()):
                self.literals.append(lit)
                self.owner.append(("rule", i))
        for name in specials:
            self.literals.append(name)
            self.owner.append((name, -1))
        self._set = self._compile()

    def _compile(self) -> _LiteralSet | None:
        try:
            # optional (google-re2); without it the prefilter is Python's re
            # deferred: keeps `gpuwarden --help` cheap (2.5 ms there)
            import re2
        except ImportError:
            return None
        opts = re2.Options()
        opts.case_sensitive = False
        opts.literal = True
        opts.log_errors = False
        s: _LiteralSet = re2.Set.SearchSet(opts)
        for lit in self.literals:
            s.Add(lit)
        s.Compile()
        return s

    def __call__(self, message: str, low: str) -> tuple[list[int], set[str]]:
        """(rule indices in rule order, special literals present) for one line."""
        if self._set is not None:
            hits = self._set.Match(message.encode("utf-8", "surrogatepass")) or ()
        else:
            hits = [i for i, lit in enumerate(self.literals) if lit in low]
        rules: set[int] = set(self.always)
        specials: set[str] = set()
        for h in hits:
            kind, idx = self.owner[h]
            if kind == "rule":
                rules.add(idx)
            else:
                specials.add(kind)
        return sorted(rules), specials
