"""Per-GPU exclusion on DRA clusters: one DeviceTaintRule per device of a GPU that is not clean, gone once it is.

Finds this node's devices in the ResourceSlices of the configured drivers, maps each to gpuwarden's GPUs by PCI
bus id (or UUID), and writes only differences, so a quiet node costs no API writes; versions come from discovery.
"""

from __future__ import annotations

import hashlib
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

from gpuwarden.ops.foundation import journal
from gpuwarden.ops.foundation.model import GpuInfo
from gpuwarden.ops.k8s.kube import Conflict, Kube, KubeError, NotFoundError

GROUP = "resource.k8s.io"
# Newest first: v1 is DRA's GA version (1.34 for slices; DeviceTaintRule GA later), v1beta2 serves DeviceTaintRule
# as beta (KEP-5055). v1beta1 slices nest attributes under devices[].basic, a shape this module does not read.
VERSIONS = ("v1", "v1beta2")
DRIVERS = ("gpu.amd.com", "gpu.nvidia.com")
TAINT_KEY = "gpuwarden.io/gpu-unclean"
NODE_LABEL = "gpuwarden.io/node"
MANAGED_BY = "app.kubernetes.io/managed-by"
EFFECTS = ("NoSchedule", "NoExecute")
# Where the drivers put the PCI address (ROCm/k8s-gpu-dra-driver docs/driver-attributes.md: the standard
# resource.kubernetes.io/pciBusID on every device, pciAddr on auto-partition devices; NVIDIA/k8s-dra-driver-gpu
# cmd/gpu-kubelet-plugin/deviceinfo.go GetDevice: pcieBusID) and the GPU's UUID (NVIDIA: uuid).
BUS_ATTRIBUTES = ("resource.kubernetes.io/pciBusID", "pcieBusID", "pciAddr", "pciBusID")
UUID_ATTRIBUTES = ("uuid",)


@dataclass(frozen=True)
class Device:
    """One device of a ResourceSlice and the GPUs it is (partitions of one GPU share its bus id)."""

    driver: str
    pool: str
    name: str
    gpus: tuple[int, ...]

    @property
    def ref(self) -> str:
        return f"{self.driver}/{self.pool}/{self.name}"


def attribute(device: dict[str, Any], name: str, driver: str) -> str | None:
    """A device attribute's string value; an unqualified name is in the driver's own domain, so both spellings
    ("uuid" and "gpu.nvidia.com/uuid") are the same attribute."""
    attrs = device.get("attributes") or {}
    for key in (name, f"{driver}/{name}"):
        value = attrs.get(key)
        if isinstance(value, dict) and isinstance(value.get("string"), str):
            return str(value["string"])
    return None


def _bus(bus: str) -> str:
    bus = bus.strip().lower()
    return bus if bus.count(":") == 2 else f"0000:{bus}"


def map_devices(slices: Iterable[dict[str, Any]], gpus: Iterable[GpuInfo]) -> tuple[list[Device], list[str]]:
    """(devices that are GPUs of this node, "driver/pool/device" of those that match none)."""
    gpus = list(gpus)
    found, unmatched = [], []
    for s in slices:
        spec = s.get("spec") or {}
        driver, pool = spec.get("driver", ""), (spec.get("pool") or {}).get("name", "")
        for dev in spec.get("devices") or ():
            name = dev.get("name", "")
            bus = next((b for b in (attribute(dev, a, driver) for a in BUS_ATTRIBUTES) if b), None)
            uuid = next((u for u in (attribute(dev, a, driver) for a in UUID_ATTRIBUTES) if u), None)
            hit = tuple(g.index for g in gpus
                        if (bus and g.bus_id and _bus(bus) == _bus(g.bus_id))
                        or (uuid and g.uuid and uuid.lower() == g.uuid.lower()))
            if hit:
                found.append(Device(driver, pool, name, hit))
            else:
                unmatched.append(f"{driver}/{pool}/{name}")
    return found, unmatched


def rule_name(node: str, device: Device) -> str:
    """Deterministic, so a restarted agent finds its rule and a second create is a 409, never a duplicate."""
    base = f"gpuwarden-{node}-{device.driver.split('.')[0]}-{device.pool}-{device.name}".lower()
    clean = re.sub(r"[^a-z0-9.-]+", "-", base).strip("-.")
    digest = hashlib.sha256(device.ref.encode()).hexdigest()[:10]
    return f"{clean[:200].rstrip('-.')}-{digest}"


def discover(kube: Kube) -> tuple[str | None, str | None]:
    """(version serving resourceslices, version serving devicetaintrules), newest of VERSIONS; None: not served."""
    try:
        group = kube.request("discover resource.k8s.io", "GET", f"/apis/{GROUP}")
    except NotFoundError:
        return None, None
    served = {v.get("version") for v in group.get("versions") or ()}
    slices = rules = None
    for version in VERSIONS:
        if version not in served:
            continue
        names = {r.get("name") for r in kube.request(f"discover {GROUP}/{version}", "GET",
                                                      f"/apis/{GROUP}/{version}").get("resources") or ()}
        slices = slices or (version if "resourceslices" in names else None)
        rules = rules or (version if "devicetaintrules" in names else None)
    return slices, rules


class DeviceTaints:
    """Keeps one DeviceTaintRule for each device of each GPU in `dirty`, and none for the others."""

    def __init__(self, kube: Kube, node: str, *, drivers: tuple[str, ...] = DRIVERS, effect: str = "NoSchedule",
                 state_dir: Path | None = None, events: Callable[[str, str, str], None] | None = None,
                 log: Callable[[str, str], None] = lambda level, text: None, retry_s: float = 30.0,
                 rescan_s: float = 300.0, clock: Callable[[], float] = time.monotonic):
        if effect not in EFFECTS:
            raise ValueError(f"effect must be one of {EFFECTS}")
        self.kube, self.node, self.drivers, self.effect = kube, node, drivers, effect
        self.state_dir = state_dir
        self.events = events or (lambda reason, message, kind: None)
        self.log = log
        self.retry_s, self.rescan_s, self.clock = retry_s, rescan_s, clock
        self.slice_version: str | None = None
        self.rule_version: str | None = None
        self.devices: list[Device] = []
        self.unmatched: list[str] = []
        self.rules: dict[str, tuple[Device | None, str]] = {}  # ours on the server: name -> (device, value)
        self.problem: str | None = None
        self.started = False
        self._slices: list[dict[str, Any]] = []
        self._scanned_at = float("-inf")
        self._retry_at = float("-inf")

    # ------------------------------------------------------------------------------------------
    @property
    def active(self) -> bool:
        """Discovery found both resources and the node's slices name at least one of its GPUs."""
        return self.rule_version is not None and bool(self.devices)

    def covered(self) -> frozenset[int]:
        """GPUs that a DeviceTaintRule keeps off claims (the node taint need not cover them); none while the
        rules cannot be written (RBAC, an outage): the node taint then stands in, failing safe."""
        if not self.active or self.problem is not None:
            return frozenset()
        return frozenset(g for d in self.devices for g in d.gpus)

    def status(self) -> dict[str, object]:
        return {"resource_version": self.rule_version, "devices": len(self.devices), "unmatched": self.unmatched[:8],
                "rules": sorted(self.rules), "problem": self.problem}

    def start(self, gpus: Iterable[GpuInfo]) -> None:
        """Discovery, the node's slices, and the rules of ours a previous agent left (a restart adopts them)."""
        self.slice_version, self.rule_version = discover(self.kube)
        self._scan(gpus)
        if self.rule_version is not None:
            listed = self.kube.list_cluster(f"list devicetaintrules of node {self.node}",
                                            f"{GROUP}/{self.rule_version}", "DeviceTaintRule", "devicetaintrules",
                                            query={"labelSelector": f"{NODE_LABEL}={self.node}"})
            by_name = {rule_name(self.node, d): d for d in self.devices}
            for item in listed.get("items") or ():
                name = item["metadata"]["name"]
                self.rules[name] = (by_name.get(name), ((item.get("spec") or {}).get("taint") or {}).get("value", ""))
        self.started = True

    def _scan(self, gpus: Iterable[GpuInfo]) -> None:
        self._scanned_at = self.clock()
        if self.slice_version is None:
            self.devices, self.unmatched = [], []
            return
        listed = self.kube.list_cluster(f"list resourceslices of node {self.node}", f"{GROUP}/{self.slice_version}",
                                        "ResourceSlice", "resourceslices",
                                        query={"fieldSelector": f"spec.nodeName={self.node}"})
        self._slices = [s for s in listed.get("items") or () if (s.get("spec") or {}).get("driver") in self.drivers]
        self.devices, self.unmatched = map_devices(self._slices, gpus)

    def device_gpus(self, driver: str, pool: str, name: str) -> tuple[int, ...]:
        """The GPUs a claim's device is (pod-resources' dynamic resources name driver, pool and device)."""
        return next((d.gpus for d in self.devices if (d.driver, d.pool, d.name) == (driver, pool, name)), ())

    def prepare(self, gpus: Iterable[GpuInfo]) -> None:
        """Discovery and the node's devices before anything else decides (the node taint leaves covered GPUs)."""
        if not self.started:
            self.reconcile({}, gpus, write=False)

    # ------------------------------------------------------------------------------------------
    def reconcile(self, dirty: dict[int, str], gpus: Iterable[GpuInfo], *, write: bool = True) -> None:
        """dirty: GPU -> why (the taint's value). Creates and deletes only what differs from what is there."""
        now = self.clock()
        if now < self._retry_at:
            return
        try:
            if not self.started:
                self.start(gpus)
            elif any(g not in self.covered() for g in dirty) and now - self._scanned_at >= self.rescan_s:
                self._scan(gpus)  # a GPU with no device yet: the driver may have published it since
            if self.rule_version is None or not write:
                return
            want = {rule_name(self.node, d): (d, dirty[g]) for d in self.devices for g in d.gpus if g in dirty}
            for name in [n for n in self.rules if n not in want]:
                self._delete(name)
            for name, (device, value) in want.items():
                if name not in self.rules:
                    self._create(name, device, value)
            if self.problem is not None:
                self.log("ok", f"kubernetes: device taints of node {self.node}: working again")
            self.problem = None
        except KubeError as exc:
            line = exc.line()
            if line != self.problem:
                self.log("error", f"kubernetes: device taints of node {self.node}: {line}")
            self.problem = line
            self._retry_at = now + exc.retry_in(self.retry_s)

    def _body(self, name: str, device: Device, value: str) -> dict[str, Any]:
        return {"apiVersion": f"{GROUP}/{self.rule_version}", "kind": "DeviceTaintRule",
                "metadata": {"name": name, "labels": {NODE_LABEL: self.node, MANAGED_BY: "gpuwarden"}},
                "spec": {"deviceSelector": {"driver": device.driver, "pool": device.pool, "device": device.name},
                         "taint": {"key": TAINT_KEY, "value": value[:63], "effect": self.effect}}}

    def _create(self, name: str, device: Device, value: str) -> None:
        try:
            self.kube.create_cluster(f"create devicetaintrule {name}", f"{GROUP}/{self.rule_version}",
                                     "DeviceTaintRule", "devicetaintrules", self._body(name, device, value))
        except Conflict:
            pass  # there already (another agent of this node wrote it a moment ago): one rule, as wanted
        self.rules[name] = (device, value)
        gpus = ", ".join(map(str, device.gpus))
        why = (f"tainted device {device.ref} (GPU {gpus}) {TAINT_KEY}={value}:{self.effect} "
               f"(DeviceTaintRule {name}): no new claim gets it until it verifies clean")
        self._record("set", name, device, value, why, "Warning")

    def _delete(self, name: str) -> None:
        device, value = self.rules[name]
        try:
            self.kube.delete_cluster(f"delete devicetaintrule {name}", f"{GROUP}/{self.rule_version}",
                                     "DeviceTaintRule", "devicetaintrules", name)
        except NotFoundError:
            pass  # someone removed it already: the wanted state
        del self.rules[name]
        what = f"device {device.ref} (GPU {', '.join(map(str, device.gpus))})" if device else "a device"
        why = f"removed {TAINT_KEY}={value} from {what} (DeviceTaintRule {name}): verified clean"
        self._record("removed", name, device, value, why, "Normal")

    def _record(self, result: str, name: str, device: Device | None, value: str, why: str, kind: str) -> None:
        self.log("warning" if result == "set" else "ok", f"kubernetes: node {self.node}: {why}")
        self.events("GPUDeviceTainted" if result == "set" else "GPUDeviceUntainted", why, kind)
        if self.state_dir is not None:
            journal.write(self.state_dir, "device-taint", result, node=self.node, rule=name, taint=value,
                          effect=self.effect, device=device.ref if device else None,
                          gpus=list(device.gpus) if device else [])
