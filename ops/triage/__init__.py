"""Kernel-log triage: a pattern library for GPU nodes, grouped findings, markdown and JSON reports.

Entry points: analyze_text()/analyze_file() give a Report; render.markdown()/render.as_json() show it.
"""

from .analyze import analyze_file, analyze_text
from .findings import Finding, Report

__all__ = ["analyze_text", "analyze_file", "Finding", "Report"]
