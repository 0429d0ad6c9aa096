"""Small file-tree builders for tests that lay out a fake debugfs, sysfs or state directory under tmp_path."""

from __future__ import annotations

from pathlib import Path


def tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return root
