"""amdgpu/KFD debugfs, read safely: an allow-list of read-only files, each parsed from the kernel's print format.

allowlist.py says which files may ever be opened (and names the ones that act when read, never opened);
reader.py opens only those, root only, bounded in bytes and time; parse.py turns each into numbers.
"""

from gpuwarden.ops.node.debugfs.allowlist import ALLOWED, TRIGGERS
from gpuwarden.ops.node.debugfs.reader import DebugfsReader, ReadResult

__all__ = ["ALLOWED", "TRIGGERS", "DebugfsReader", "ReadResult"]
