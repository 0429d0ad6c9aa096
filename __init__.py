"""gpuwarden: an operations console for multi-GPU LLM inference nodes (AMD ROCm first, NVIDIA too).

Installed as the package gpuwarden (pyproject maps it onto this folder): gpuwarden.ops, .playbooks and .tui.
"""

from gpuwarden.ops import __version__

__all__ = ["__version__"]
