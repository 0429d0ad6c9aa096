"""The Kubernetes API objects gpuwarden reads, as the API server serves them (raw JSON), typed field by field.

Only the fields gpuwarden looks at are named, each as the API reference spells it; every one may be absent
(total=False), so readers keep using .get. A strategic merge patch is a partial object of the same shape, with
None where it deletes (an annotation, a field).
"""

from __future__ import annotations

from typing import TypedDict


class OwnerReference(TypedDict, total=False):
    kind: str
    name: str


class ObjectMeta(TypedDict, total=False):
    name: str
    namespace: str
    uid: str
    resourceVersion: str
    generateName: str
    deletionTimestamp: str
    annotations: dict[str, str | None]  # None only in a patch: it removes the annotation
    ownerReferences: list[OwnerReference]


class ListMeta(TypedDict, total=False):
    resourceVersion: str


# --- Node ------------------------------------------------------------------------------------------------------
class Taint(TypedDict, total=False):
    key: str
    value: str | None
    effect: str


class NodeCondition(TypedDict, total=False):
    type: str
    status: str
    reason: str
    message: str
    lastTransitionTime: str
    lastHeartbeatTime: str


class NodeSpec(TypedDict, total=False):
    taints: list[Taint]
    unschedulable: bool | None  # None only in a patch


class NodeStatus(TypedDict, total=False):
    conditions: list[NodeCondition]


class Node(TypedDict, total=False):
    metadata: ObjectMeta
    spec: NodeSpec
    status: NodeStatus


# --- Pod -------------------------------------------------------------------------------------------------------
class ResourceRequirements(TypedDict, total=False):
    limits: dict[str, str | int]  # quantities: "1", 1
    requests: dict[str, str | int]


class Container(TypedDict, total=False):
    name: str
    resources: ResourceRequirements


class ContainerStatus(TypedDict, total=False):
    name: str
    containerID: str  # "containerd://<64 hex>"


class PodSpec(TypedDict, total=False):
    nodeName: str
    containers: list[Container]
    initContainers: list[Container]


class PodStatus(TypedDict, total=False):
    phase: str
    initContainerStatuses: list[ContainerStatus]
    containerStatuses: list[ContainerStatus]
    ephemeralContainerStatuses: list[ContainerStatus]


class Pod(TypedDict, total=False):
    metadata: ObjectMeta
    spec: PodSpec
    status: PodStatus


class PodList(TypedDict, total=False):
    metadata: ListMeta
    items: list[Pod]


class WatchEvent(TypedDict, total=False):
    type: str  # ADDED, MODIFIED, DELETED, BOOKMARK, ERROR
    object: Pod


# --- Lease (coordination.k8s.io/v1) ----------------------------------------------------------------------------
class LeaseSpec(TypedDict, total=False):
    holderIdentity: str | None  # None: free
    leaseDurationSeconds: int
    acquireTime: str  # MicroTime
    renewTime: str | None
    leaseTransitions: int


class Lease(TypedDict, total=False):
    apiVersion: str
    kind: str
    metadata: ObjectMeta
    spec: LeaseSpec
