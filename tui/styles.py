"""Named styles the panels use, in one place; each keeps a non-colour cue (bold, reverse) for NO_COLOR terminals.

Textual drops colours when NO_COLOR is set, so a highlight must not depend on colour alone.
"""

STYLES = {
    "bar.used": "green",
    "bar.residual": "bold red",
    "bar.free": "bright_black",
    "residual": "bold reverse red",
    "drained": "bold reverse yellow",
    "trend": "cyan",
    "phase.good": "green",
    "phase.bad": "bold red",
    "phase.busy": "yellow",
    "header.brand": "bold reverse",
    "header.node": "bold",
    "header.sim": "bold reverse magenta",
    "header.ro": "bold reverse blue",
    "header.stale": "bold reverse red",
    "header.warn": "bold yellow",
    "stale": "bold reverse red",
    "key": "bold reverse",
    "table.header": "bold underline",
    "cursor.focus": "reverse",
    "cursor": "bold",
    "dim": "dim",
    "bold": "bold",
    "": "",
}
