"""An upstream bug report written from an incident bundle (`gpuwarden report BUNDLE`), Markdown or JSON.

environment.py reads what ROCm's and NVIDIA's issue templates ask for out of the bundle; build.py adds what
happened (triage), the reproduction (`arena probe`), what was ruled out (doctor over the bundle), the matching
known issues and the attachments; render.py writes the Markdown. Every string passes through redaction.
"""

from gpuwarden.ops.bugreport.build import build

__all__ = ["build"]
