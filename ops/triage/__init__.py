"""Kernel- and engine-log triage: a pattern library for GPU nodes, findings ordered by cause, reports.

Analyzer (analyze.py) takes one line at a time; analyze_text()/analyze_file() wrap it, stream.py feeds
big files in bounded memory (a storm's lines split and parsed a block at a time by lineparse: compiled where
built, pure Python otherwise), live.py serves a kernel-log watch; render shows a Report as text or JSON.
"""

from gpuwarden.ops.triage.analyze import Analyzer, analyze_text
from gpuwarden.ops.triage.stream import analyze_file
from gpuwarden.ops.triage.findings import Finding, Report

__all__ = ["Analyzer", "analyze_text", "analyze_file", "Finding", "Report"]
