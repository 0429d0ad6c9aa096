"""Where each key of a TOML document sits: key path -> line, for error messages that name the right line.

tomllib gives values, not positions. This scanner walks the text once (tables, arrays of tables,
dotted keys, inline tables and arrays, every string form) and records the line of every key path,
e.g. ("engines", 1, "env", "NCCL_DEBUG") -> 42. It runs on text tomllib already accepted.
"""

from __future__ import annotations

Path_ = tuple[str | int, ...]  # a key path: str keys, int indexes of arrays


class _Scanner:
    def __init__(self, text: str):
        self.t = text
        self.i = 0
        self.line = 1
        self.where: dict[Path_, int] = {}
        self.arrays: dict[Path_, int] = {}  # array-of-tables path -> index of its last element

    # --- characters ------------------------------------------------------------------------
    def peek(self, n: int = 1) -> str:
        return self.t[self.i:self.i + n]

    def step(self, n: int = 1) -> None:
        self.line += self.t.count("\n", self.i, self.i + n)
        self.i += n

    def blank(self, newlines: bool) -> None:
        """Skip spaces (and newlines and comments when `newlines`)."""
        while self.i < len(self.t):
            c = self.t[self.i]
            if c in " \t\r" or (newlines and c == "\n"):
                self.step()
            elif c == "#":
                end = self.t.find("\n", self.i)
                self.step((len(self.t) if end < 0 else end) - self.i)
            else:
                return

    # --- tokens ----------------------------------------------------------------------------
    def string(self) -> str:
        for quote in ('"""', "'''"):
            if self.peek(3) == quote:
                end = self.i + 3
                while True:
                    end = self.t.find(quote, end)
                    if end < 0:
                        end = len(self.t)
                        break
                    if quote == '"""' and _escaped(self.t, end):
                        end += 1
                        continue
                    while self.t[end + 3:end + 4] == quote[0]:  # up to two quotes may end the content
                        end += 1
                    break
                body = self.t[self.i + 3:end]
                self.step(min(len(self.t), end + 3) - self.i)
                return body
        quote = self.peek()
        j = self.i + 1
        while j < len(self.t) and self.t[j] != quote and self.t[j] != "\n":
            j += 2 if quote == '"' and self.t[j] == "\\" else 1
        body = self.t[self.i + 1:j]
        self.step(min(len(self.t), j + 1) - self.i)
        return body.replace('\\"', '"') if quote == '"' else body

    def key(self) -> list[str]:
        """A dotted key: bare or quoted parts separated by dots."""
        parts: list[str] = []
        while self.i < len(self.t):
            self.blank(False)
            c = self.peek()
            if c in "\"'":
                parts.append(self.string())
            else:
                j = self.i
                while j < len(self.t) and (self.t[j].isalnum() or self.t[j] in "_-"):
                    j += 1
                if j == self.i:
                    break
                parts.append(self.t[self.i:j])
                self.step(j - self.i)
            self.blank(False)
            if self.peek() != ".":
                break
            self.step()
        return parts

    def value(self, path: Path_) -> None:
        self.blank(False)
        c = self.peek()
        if c in "\"'":
            self.string()
        elif c == "{":
            self.step()
            while self.i < len(self.t):
                self.blank(False)
                if self.peek() in ("}", ""):
                    self.step()
                    return
                if self.peek() == ",":
                    self.step()
                    continue
                self.pair(path)
        elif c == "[":
            self.step()
            index = 0
            while self.i < len(self.t):
                self.blank(True)
                if self.peek() in ("]", ""):
                    self.step()
                    return
                if self.peek() == ",":
                    self.step()
                    index += 1
                    continue
                self.where.setdefault(path + (index,), self.line)
                start = self.i
                self.value(path + (index,))
                if self.i == start:  # nothing this scanner understands: move on rather than loop
                    self.step()
        else:
            while self.i < len(self.t) and self.t[self.i] not in ",]}\n#":
                self.step()

    def pair(self, table: Path_) -> None:
        line = self.line
        keys = self.key()
        for n in range(1, len(keys) + 1):
            self.where.setdefault(table + tuple(keys[:n]), line)
        self.blank(False)
        if self.peek() == "=":
            self.step()
            self.value(table + tuple(keys))
        elif not keys:
            self.step()  # not a key: skip a character so the scan always moves

    def header(self) -> Path_:
        array = self.peek(2) == "[["
        self.step(2 if array else 1)
        line = self.line
        keys = self.key()
        self.step(2 if array else 1)
        path: Path_ = ()
        for n, k in enumerate(keys):
            path += (k,)
            last = n == len(keys) - 1
            if array and last:
                self.arrays[path] = self.arrays.get(path, -1) + 1
                self.where.setdefault(path, line)
                path += (self.arrays[path],)
            elif path in self.arrays:
                path += (self.arrays[path],)  # [a.b] under [[a]] belongs to a's last element
        self.where.setdefault(path, line)
        return path

    def document(self) -> dict[Path_, int]:
        table: Path_ = ()
        while self.i < len(self.t):
            self.blank(True)
            if self.i >= len(self.t):
                break
            start = self.i
            if self.peek() == "[":
                table = self.header()
            else:
                self.pair(table)
            if self.i == start:
                self.step()
        return self.where


def _escaped(text: str, at: int) -> bool:
    n = 0
    while at - n - 1 >= 0 and text[at - n - 1] == "\\":
        n += 1
    return n % 2 == 1


def locate(text: str) -> dict[Path_, int]:
    """Key path -> 1-based line of its first appearance (tables: their header line)."""
    try:
        return _Scanner(text).document()
    except (IndexError, RecursionError):  # text tomllib accepted should not get here; lines are a nicety
        return {}


def line_of(where: dict[Path_, int], path: Path_) -> int:
    """The line of `path`, else of its nearest ancestor that has one, else 1."""
    for n in range(len(path), 0, -1):
        line = where.get(tuple(path[:n]))
        if line is not None:
            return line
    return 1
