"""The shape of a regular expression, read by gpuwarden itself: the literal every match must contain (triage's
cheap pre-test) and whether a repeat nests inside a repeat (the node config's guard against catastrophic backtracking).

CPython's own parser (re._parser) is private and changes between versions; this reads only what those two
questions need, and answers "don't know" (None / the safe side) for anything it does not model.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

UNBOUNDED = 1 << 16  # a repeat bounded this high is as good as unbounded for backtracking


@dataclass
class Node:
    """One item of a sequence: a literal character, a group of alternatives, a repeat of one item, or other."""
    kind: str  # "lit" | "group" | "repeat" | "other"
    char: str = ""
    alternatives: list[list[Node]] = field(default_factory=list)
    low: int = 1
    high: int = 1


class _Reader:
    def __init__(self, pattern: str, verbose: bool):
        self.s, self.i, self.verbose = pattern, 0, verbose

    def peek(self, n: int = 1) -> str:
        return self.s[self.i:self.i + n]

    def take(self, n: int = 1) -> str:
        out = self.s[self.i:self.i + n]
        self.i += n
        return out

    def skip_verbose(self) -> None:
        while self.verbose and self.i < len(self.s):
            if self.s[self.i].isspace():
                self.i += 1
            elif self.s[self.i] == "#":
                end = self.s.find("\n", self.i)
                self.i = len(self.s) if end < 0 else end + 1
            else:
                return

    def alternatives(self, closing: str | None) -> list[list[Node]]:
        alts: list[list[Node]] = [[]]
        while True:
            self.skip_verbose()
            c = self.peek()
            if not c:
                if closing:
                    raise ValueError("missing )")
                return alts
            if c == closing:
                self.take()
                return alts
            if c == "|":
                self.take()
                alts.append([])
                continue
            item = self.atom()
            if item is None:
                continue
            self.skip_verbose()
            alts[-1].append(self.quantified(item))

    def quantified(self, item: Node) -> Node:
        c = self.peek()
        bounds: tuple[int, int] | None = None
        if c in ("*", "+", "?"):
            self.take()
            bounds = {"*": (0, UNBOUNDED), "+": (1, UNBOUNDED), "?": (0, 1)}[c]
        elif c == "{":
            m = re.match(r"\{(\d*)(,?)(\d*)\}", self.s[self.i:])
            if m and (m.group(1) or m.group(3)):
                self.i += m.end()
                low = int(m.group(1) or 0)
                high = int(m.group(3)) if m.group(3) else (UNBOUNDED if m.group(2) else low)
                bounds = (low, min(high, UNBOUNDED))
        if bounds is None:
            return item
        if self.peek() in ("?", "+"):  # lazy or possessive: the same repeat for both questions
            self.take()
        return Node("repeat", alternatives=[[item]], low=bounds[0], high=bounds[1])

    def atom(self) -> Node | None:
        c = self.take()
        if c == "\\":
            e = self.take()
            if e and not e.isalnum():
                return Node("lit", char=e)
            return Node("other")  # \d, \w, \1, \n, \x41 ...: not modelled as a literal
        if c == "[":
            self.char_class()
            return Node("other")
        if c == "(":
            return self.group()
        if c in ".^$":
            return Node("other")
        return Node("lit", char=c)

    def char_class(self) -> None:
        if self.peek() == "^":
            self.take()
        if self.peek() == "]":
            self.take()
        while True:
            c = self.take()
            if not c:
                raise ValueError("missing ]")
            if c == "\\":
                self.take()
            elif c == "]":
                return

    def group(self) -> Node | None:
        if self.peek() != "?":
            return Node("group", alternatives=self.alternatives(")"))
        self.take()
        c = self.peek()
        if c == "#":
            end = self.s.find(")", self.i)
            self.i = len(self.s) if end < 0 else end + 1
            return None
        if c == ":" or c == ">":
            self.take()
        elif c in ("=", "!"):  # a lookahead: matches nothing of its own
            self.take()
            return Node("other", alternatives=self.alternatives(")"))
        elif self.peek(2) in ("<=", "<!"):
            self.take(2)
            return Node("other", alternatives=self.alternatives(")"))
        elif self.peek(2) == "P<" or c == "<":
            self.i = self.s.index(">", self.i) + 1
        elif self.peek(2) == "P=":
            self.i = self.s.index(")", self.i) + 1
            return Node("other")
        elif c == "(":  # (?(1)yes|no)
            self.i = self.s.index(")", self.i) + 1
            return Node("other", alternatives=self.alternatives(")"))
        else:  # inline flags: (?i) alone, or (?i:...) scoped
            m = re.match(r"[aiLmsux-]*", self.s[self.i:])
            flags = m.group(0) if m else ""
            self.i += len(flags)
            if "x" in flags.split("-")[0]:
                self.verbose = True
            if self.take() == ")":
                return None
        return Node("group", alternatives=self.alternatives(")"))


def parse(pattern: str, flags: int = 0) -> list[list[Node]] | None:
    """The pattern's top-level alternatives, or None when it does not read as a regular expression."""
    try:
        return _Reader(pattern, bool(flags & re.VERBOSE)).alternatives(None)
    except (ValueError, IndexError):
        return None


def required_literal(pattern: str, flags: int = 0, shortest: int = 3) -> str | None:
    """The longest run of literal characters at the top level of a pattern with one alternative (lower-case, so
    every match holds it case-insensitively); None when there is none of `shortest` characters or it can't tell."""
    if flags & re.VERBOSE or "(?x" in pattern:
        return None
    alts = parse(pattern, flags)
    if alts is None or len(alts) != 1:
        return None
    best, run = "", ""
    for node in alts[0] + [Node("other")]:
        if node.kind == "lit":
            run += node.char
            continue
        if node.kind == "repeat" and node.low >= 1:
            inner = node.alternatives[0][0]
            if inner.kind == "lit":  # a+ : the first a is certain, what follows it is not
                run += inner.char
        best = max(best, run, key=len)
        run = ""
    return best.lower() if len(best) >= shortest else None


def nested_repeat(pattern: str, flags: int = 0) -> bool | None:
    """True when an unbounded repeat (or one of more than 100) holds an unbounded repeat; None when unreadable."""
    alts = parse(pattern, flags)
    if alts is None:
        return None
    return any(_nested(seq, False) for seq in alts)


def _nested(seq: list[Node], outer: bool) -> bool:
    for node in seq:
        if node.kind == "repeat":
            unbounded = node.high >= UNBOUNDED
            if unbounded and outer:
                return True
            if any(_nested(s, outer or unbounded or node.high > 100) for s in node.alternatives):
                return True
        elif any(_nested(s, outer) for s in node.alternatives):
            return True
    return False
