"""Regular expressions compiled at their first use, so that importing a module that defines many costs nothing.

`gpuwarden status` loads the redaction and text-safety rules (~3 ms to compile) but applies them only when it
has a command line to show; an idle node's status never compiles them.
"""

from __future__ import annotations

import re

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (this module is on the `status` path)
if TYPE_CHECKING:
    from typing import Any, Callable, Iterator

# What callers use of a compiled pattern; after the first use each is an attribute of the LazyRegex itself.
_METHODS = ("search", "match", "fullmatch", "sub", "subn", "finditer", "findall", "split")


class LazyRegex:
    """re.compile(pattern, flags), deferred: `pattern` and `flags` are there at once, the rest on first use."""

    def __init__(self, pattern: str, flags: int = 0):
        self.pattern, self.flags = pattern, flags

    if TYPE_CHECKING:  # what _METHODS become: re.Pattern[str]'s own signatures (typeshed's, for str patterns)
        def search(self, string: str, pos: int = 0, endpos: int = ...) -> re.Match[str] | None: ...
        def match(self, string: str, pos: int = 0, endpos: int = ...) -> re.Match[str] | None: ...
        def fullmatch(self, string: str, pos: int = 0, endpos: int = ...) -> re.Match[str] | None: ...
        def sub(self, repl: str | Callable[[re.Match[str]], str], string: str, count: int = 0) -> str: ...
        def subn(self, repl: str | Callable[[re.Match[str]], str], string: str,
                 count: int = 0) -> tuple[str, int]: ...
        def finditer(self, string: str, pos: int = 0, endpos: int = ...) -> Iterator[re.Match[str]]: ...
        def findall(self, string: str, pos: int = 0, endpos: int = ...) -> list[Any]: ...
        def split(self, string: str, maxsplit: int = 0) -> list[str | Any]: ...

    def __getattr__(self, name: str) -> object:
        if name.startswith("__"):  # copy, pickle and friends probing for hooks: none here
            raise AttributeError(name)
        compiled = re.compile(self.pattern, self.flags)
        for method in _METHODS:
            setattr(self, method, getattr(compiled, method))  # later calls find the bound method directly
        return getattr(compiled, name)

    def __repr__(self) -> str:
        return f"LazyRegex({self.pattern!r}, {self.flags!r})"
