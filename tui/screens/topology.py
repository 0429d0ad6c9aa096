"""The node's topology: which GPUs share an XGMI hive, a PCIe parent or a physical device (MI300 partitions), their
NUMA nodes, and what a reset of each GPU takes down with it (ops.topology, as `status --topology`).

The PCI tree is read in a worker thread, again only when the GPUs or the engines serving on them change.
"""

from __future__ import annotations

from pathlib import Path

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.screen import Screen
from textual.widgets import DataTable, Static

from gpuwarden.ops.foundation.model import NodeSnapshot
from gpuwarden.playbooks.cli.topologyview import COLUMNS, table_rows

from gpuwarden.tui.styles import STYLES as S
from gpuwarden.tui.widgets.keystrip import KeyStrip
from gpuwarden.ops.node.topology import reset_reach, topology
from gpuwarden.ops.node.sim.node import active_sim_root

# The CLI's columns, what an operator asks first leftmost: at 80 columns the PCIe ones scroll off, not these.
ORDER = (0, 7, 3, 4, 2, 1, 5, 6)


def blast_text(doc: dict) -> Text:
    """Each GPU's blast radius in words; one line for GPUs whose reset reaches nothing else."""
    t = Text("Blast radius of a reset\n", style="bold")
    alone = []
    for r in doc["gpus"]:
        reach = reset_reach(doc, r["index"])
        if reach is None:
            alone.append(r["index"])
        else:
            t.append(reach + "\n", style=S["residual"] if len(r["reset_scope"]) > 1 else "")
    if alone:
        t.append(f"GPU {', '.join(map(str, alone))}: a reset reaches that GPU alone, no engine serves there\n",
                 style="dim")
    if doc["gpus"] and all(r["pcie_parent"] is None for r in doc["gpus"]):
        t.append("PCIe parents n/a: this sysfs tree keeps no /sys/devices hierarchy (a captured or simulated node)",
                 style="dim")
    return t


REMOTE_ROOT = Path("/nonexistent/remote-node")  # no tree at all: every PCI field n/a


def sysfs_root(settings) -> Path:
    """The tree the sampler reads: the simulated node's own when it stands in for the GPUs, else the node's /sys."""
    return active_sim_root(settings) or settings.sysfs_root


class TopologyScreen(Screen[None]):
    BINDINGS = [("escape", "app.pop_screen", "Back"), ("q", "app.pop_screen", "Back"),
                ("backspace", "app.pop_screen", "Back")]

    def __init__(self, snap: NodeSnapshot):
        super().__init__()
        self.snap = snap
        self.doc: dict | None = None
        self._shape: tuple | None = None  # what the last document was computed from
        self.computed = 0  # documents shown (the tests wait on it)

    def compose(self) -> ComposeResult:
        with VerticalScroll():
            yield Static("Topology: reading the PCI tree…", id="topology-title")
            table = DataTable(cursor_type="row", id="topology-table")
            table.border_title = "GPUs: XGMI hive, PCIe parent, NUMA node, reset scope"
            yield table
            yield Static("", id="topology-blast")
        yield KeyStrip([("q/esc", "Back")])

    def on_mount(self) -> None:
        self.query_one(DataTable).add_columns(*(COLUMNS[i] for i in ORDER))
        self.show_snapshot(self.snap)

    def show_snapshot(self, snap: NodeSnapshot) -> None:
        self.snap = snap
        shape = (tuple((g.index, g.bus_id, g.hive_id, g.compute_partition, g.memory_partition) for g in snap.gpus),
                 tuple(sorted((e.name, e.gpu, e.phase, e.stale is not None) for e in snap.engines)))
        if shape == self._shape:
            return
        self._shape = shape
        settings = self.app.settings  # type: ignore[attr-defined]
        self.run_worker(lambda: self._compute(snap, settings), thread=True, exclusive=True, group="topology")

    def _compute(self, snap: NodeSnapshot, settings) -> None:
        """(worker thread) The topology document: a few small sysfs reads per GPU."""
        # A node read over SSH (the fleet console): this machine's PCI tree says nothing about it.
        remote = snap.source.startswith("ssh:")
        doc = topology(snap, REMOTE_ROOT if remote else sysfs_root(settings))
        try:
            self.app.call_from_thread(self._show, doc, remote)
        except RuntimeError:
            pass  # the app is closing

    def _show(self, doc: dict, remote: bool = False) -> None:
        self.doc = doc
        hives = sorted({r["hive_id"] for r in doc["gpus"] if r["hive_id"]})
        numa = sorted({r["numa_node"] for r in doc["gpus"] if r["numa_node"] is not None})
        title = Text(f"Topology of {doc['hostname']}: {len(doc['gpus'])} GPU(s)", style="bold")
        title.append(f", XGMI hive{'s' if len(hives) > 1 else ''} {', '.join(hives)}" if hives else ", no XGMI hive")
        title.append(f", NUMA node{'s' if len(numa) > 1 else ''} {', '.join(map(str, numa))}" if numa
                     else ", NUMA nodes n/a")
        self.query_one("#topology-title", Static).update(title)
        table = self.query_one(DataTable)
        table.clear()
        for row in table_rows(doc):
            table.add_row(*(row[i] for i in ORDER), key=row[0])
        blast = blast_text(doc)
        if remote:
            blast.append(f"\nNUMA and PCIe n/a: {doc['hostname']} is read over SSH; run `gpuwarden status "
                         "--topology` on it for its PCI tree", style="dim")
        self.query_one("#topology-blast", Static).update(blast)
        self.computed += 1
