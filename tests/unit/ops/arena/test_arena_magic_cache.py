"""ArenaWatch looks at a shared file's first bytes again only when the file changed (its stamp moved)."""

from __future__ import annotations

from gpuwarden.ops.arena import format as fmt
from gpuwarden.ops.arena import watch
from gpuwarden.ops.foundation.settings import Settings


def test_a_shared_file_is_opened_again_only_when_it_changed(state_dir, tmp_path, monkeypatch):
    w = watch.ArenaWatch(Settings(state_dir=state_dir))
    opened: list[str] = []
    real = fmt.has_magic
    monkeypatch.setattr(fmt, "has_magic", lambda p: (opened.append(str(p)), real(p))[1])
    f = tmp_path / "shm-file"
    f.write_bytes(b"\0" * 4096)
    assert w._is_arena(str(f)) is False
    assert w._is_arena(str(f)) is False and len(opened) == 1  # unchanged: a stat, no open
    f.write_bytes(fmt.MAGIC + b"\0" * 4000)  # rewritten as an arena starts: size and mtime move
    assert w._is_arena(str(f)) is True and len(opened) == 2
    f.unlink()
    assert w._is_arena(str(f)) is False
