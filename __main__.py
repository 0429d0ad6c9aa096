"""`python -m gpuwarden`: the same program as the `gpuwarden` command (gpuwarden.tui.main).

Installed as gpuwarden/__main__.py (pyproject's package-dir maps the gpuwarden namespace onto this folder).
"""

import sys

from gpuwarden.tui.main import main

sys.exit(main())
