"""A Kubernetes API server stand-in on loopback: the subset gpuwarden uses, with the API's semantics.

Written from the Kubernetes API reference (API concepts: resourceVersion preconditions and 409, watch
streams with bookmarks and 410 Gone; strategic-merge, JSON-merge and JSON patches; the Eviction
subresource answering 429 while a PodDisruptionBudget allows no disruption; Status bodies for errors)
and driven by gpuwarden's client (lightkube underneath). A real API server cannot run on these machines; this is the one
stand-in the k8s tests use. Every request is logged, so tests can count what the agent costs.
"""

from __future__ import annotations

import copy
import json
import re
import ssl
import threading
import time
import uuid
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlparse

# Lists that a strategic merge patch merges by a key instead of replacing (from the API types'
# patchMergeKey/patchStrategy tags); every other list (spec.taints is listType=atomic) is replaced whole.
MERGE_KEYS = {("status", "conditions"): "type", ("status", "addresses"): "type",
              ("metadata", "ownerReferences"): "uid", ("spec", "containers"): "name"}
TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")


@dataclass
class Request:
    ts: float
    method: str
    path: str
    query: dict
    status: int
    verb: str
    resource: str


class ApiError(Exception):
    def __init__(self, code: int, reason: str, message: str, details: dict | None = None):
        super().__init__(message)
        self.code, self.reason, self.message, self.details = code, reason, message, details or {}

    def status(self) -> dict:
        return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": self.message, "reason": self.reason, "details": self.details, "code": self.code}


# --- patches ---------------------------------------------------------------------------------------
def merge_patch(target, patch):
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = merge_patch(out.get(k), v)
    return out


def strategic_merge(target, patch, path=()):
    """Strategic merge patch for the fields gpuwarden touches: maps merge, null deletes, keyed lists merge."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if k.startswith("$"):
            continue  # directives ($patch, $retainKeys) are not used by gpuwarden
        here = path + (k,)
        if v is None:
            out.pop(k, None)
        elif isinstance(v, list) and here[-2:] in MERGE_KEYS:
            key = MERGE_KEYS[here[-2:]]
            merged = [copy.deepcopy(x) for x in (out.get(k) or [])]
            for item in v:
                if not isinstance(item, dict) or key not in item:
                    raise ApiError(400, "BadRequest", f"map: {item} does not contain declared merge key: {key}")
                at = next((i for i, x in enumerate(merged) if x.get(key) == item[key]), None)
                if item.get("$patch") == "delete":
                    if at is not None:
                        merged.pop(at)
                elif at is None:
                    merged.append({a: b for a, b in item.items() if not a.startswith("$")})
                else:
                    merged[at] = strategic_merge(merged[at], item, here)
            out[k] = merged
        elif isinstance(v, dict):
            out[k] = strategic_merge(out.get(k), v, here)
        else:
            out[k] = copy.deepcopy(v)
    return out


def _pointer(doc, pointer: str):
    parts = [p.replace("~1", "/").replace("~0", "~") for p in pointer.split("/")[1:]]
    parent = doc
    for p in parts[:-1]:
        parent = parent[int(p)] if isinstance(parent, list) else parent[p]
    return parent, parts[-1] if parts else ""


def json_patch(doc, ops):
    """RFC 6902 add/remove/replace/test (what a client may send to a node)."""
    if not isinstance(ops, list):
        raise ApiError(400, "BadRequest", "json: cannot unmarshal object into Go value of type jsonpatch.Patch")
    doc = copy.deepcopy(doc)
    for op in ops:
        parent, last = _pointer(doc, op["path"])
        kind = op.get("op")
        try:
            if kind == "test":
                here = parent[int(last)] if isinstance(parent, list) else parent.get(last)
                if here != op.get("value"):
                    raise ApiError(422, "Invalid", f"the server rejected our request due to an error in our request: "
                                                   f"testing value {op['path']} failed")
            elif kind in ("add", "replace"):
                if isinstance(parent, list):
                    if last == "-":
                        parent.append(op["value"])
                    elif kind == "add":
                        parent.insert(int(last), op["value"])
                    else:
                        parent[int(last)] = op["value"]
                else:
                    if kind == "replace" and last not in parent:
                        raise ApiError(422, "Invalid", f"replace operation does not apply: doc is missing key: {op['path']}")
                    parent[last] = op["value"]
            elif kind == "remove":
                if isinstance(parent, list):
                    parent.pop(int(last))
                else:
                    del parent[last]
            else:
                raise ApiError(400, "BadRequest", f"unsupported JSON patch operation {kind!r}")
        except (KeyError, IndexError, ValueError, TypeError):
            raise ApiError(422, "Invalid", f"doc is missing path: {op['path']}") from None
    return doc


def kubeconfig_for(url: str, token: str = "test-token") -> dict:
    """A kubeconfig document whose current context is the API at `url`, with a bearer token."""
    return {"apiVersion": "v1", "kind": "Config", "current-context": "standin",
            "clusters": [{"name": "standin", "cluster": {"server": url}}],
            "users": [{"name": "agent", "user": {"token": token}}],
            "contexts": [{"name": "standin", "context": {"cluster": "standin", "user": "agent"}}]}


# --- the server ------------------------------------------------------------------------------------
class FakeApiServer:
    """Holds nodes, pods, events and PDBs; serves them over HTTP on 127.0.0.1 (start()/stop())."""

    def __init__(self, tls: tuple[str, str] | None = None, token: str | None = None):
        """tls: (certificate, key) files to serve HTTPS with, as a real API server does; token: when set, a
        request without `Authorization: Bearer <token>` is answered 401 Unauthorized (authentication runs
        before anything else)."""
        self.tls = tls
        self.token = token
        self.cond = threading.Condition()
        self.rv = 1000
        self.nodes: dict[str, dict] = {}
        self.pods: dict[tuple[str, str], dict] = {}
        self.events: list[dict] = []
        self.pdbs: list[dict] = []
        self.leases: dict[tuple[str, str], dict] = {}  # coordination.k8s.io/v1 Leases by (namespace, name)
        self.history: list[tuple[int, str, dict]] = []  # pod watch events (rv, type, object)
        self.history_floor = self.rv  # a watch from an older resourceVersion gets 410 Gone
        self.compactions = 0
        self.denied: set[tuple[str, str]] = set()  # (verb, resource) RBAC does not allow
        self.allowed: set[tuple[str, str]] | None = None  # when set, only these (a ClusterRole's rules)
        self.requests: list[Request] = []
        self.on_delete: list = []  # callables (namespace, name) run when a pod is deleted
        self.conflict_next: int = 0  # another client writes the node before each of the next N spec patches
        # resource.k8s.io (DRA): which versions serve which resources (discovery answers from this), the
        # ResourceSlices the "drivers" published and the DeviceTaintRules clients made, by name.
        self.dra_versions: dict[str, set[str]] = {"v1": {"resourceslices"},
                                                  "v1beta2": {"resourceslices", "devicetaintrules"}}
        self.slices: dict[str, dict] = {}
        self.taint_rules: dict[str, dict] = {}
        # authentication.k8s.io TokenReview: bearer token -> (status.user, audiences it was issued for)
        self.tokens: dict[str, tuple[dict, list[str]]] = {}
        self._stopping = False
        self._timers: list[threading.Timer] = []
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.httpd.daemon_threads = True
        if tls is not None:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(*tls)
            self.httpd.socket = context.wrap_socket(self.httpd.socket, server_side=True)
        self._thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                        daemon=True)

    @property
    def url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"{'https' if self.tls else 'http'}://{host}:{port}"

    def start(self) -> "FakeApiServer":
        self._thread.start()
        return self

    def stop(self) -> None:
        with self.cond:
            self._stopping = True
            self.cond.notify_all()
        for t in self._timers:
            t.cancel()
        self.httpd.shutdown()
        self.httpd.server_close()

    def kubeconfig(self, token: str = "test-token") -> dict:
        """A kubeconfig whose current context is this server, with a bearer token."""
        return kubeconfig_for(self.url, token)

    def write_kubeconfig(self, path: Path, token: str = "test-token") -> Path:
        path.write_text(json.dumps(self.kubeconfig(token)))
        return path

    def kube(self):
        """A gpuwarden Kube (lightkube underneath) talking to this server, set up from its kubeconfig."""
        from gpuwarden.ops.k8s.kube import connect_config
        return connect_config(self.kubeconfig())

    # --- objects the tests put in place ------------------------------------------------------------
    def _bump(self, obj: dict) -> None:
        self.rv += 1
        obj.setdefault("metadata", {})["resourceVersion"] = str(self.rv)

    def add_node(self, name: str, taints: list | None = None, labels: dict | None = None) -> dict:
        with self.cond:
            node = {"apiVersion": "v1", "kind": "Node",
                    "metadata": {"name": name, "uid": str(uuid.uuid4()), "labels": labels or {},
                                 "creationTimestamp": "2026-12-01T00:00:00Z"},
                    "spec": {"taints": list(taints or [])},
                    "status": {"conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                                               "message": "kubelet is posting ready status"}]}}
            self._bump(node)
            self.nodes[name] = node
            return copy.deepcopy(node)

    def add_resource_slice(self, node: str, driver: str, devices: list[dict], *, pool: str | None = None,
                           name: str | None = None) -> dict:
        """A ResourceSlice as a DRA driver's kubelet plugin publishes it: one pool per node (named after it),
        devices [{name, attributes: {attr: {"string"|"int"|"bool"|"version": value}}}] (v1beta2 / v1 shape)."""
        with self.cond:
            name = name or f"{node}-{driver}-{uuid.uuid4().hex[:5]}"
            obj = {"kind": "ResourceSlice", "metadata": {"name": name, "uid": str(uuid.uuid4())},
                   "spec": {"driver": driver, "nodeName": node,
                            "pool": {"name": pool or node, "generation": 1, "resourceSliceCount": 1},
                            "devices": copy.deepcopy(devices)}}
            self._bump(obj)
            self.slices[name] = obj
            return copy.deepcopy(obj)

    def rules(self) -> list[dict]:
        """The DeviceTaintRules there now."""
        with self.cond:
            return [copy.deepcopy(r) for r in self.taint_rules.values()]

    def node(self, name: str) -> dict:
        with self.cond:
            return copy.deepcopy(self.nodes[name])

    def condition(self, node: str, ctype: str) -> dict | None:
        return next((c for c in self.node(node)["status"].get("conditions", []) if c["type"] == ctype), None)

    def taints(self, node: str) -> list[dict]:
        return self.node(node)["spec"].get("taints") or []

    def edit_node(self, name: str, fn) -> None:
        """Change a node as another client would (bumps its resourceVersion)."""
        with self.cond:
            fn(self.nodes[name])
            self._bump(self.nodes[name])

    def add_pod(self, namespace: str, name: str, node: str, *, uid: str | None = None,
                containers: dict[str, str] | None = None, labels: dict | None = None, ready: bool = True,
                limits: dict[str, int] | None = None, owner_kind: str | None = None) -> dict:
        """containers: name -> container id (with its runtime prefix, e.g. containerd://<64 hex>); limits: what
        each container's resources.limits say (e.g. {"amd.com/gpu": 1}); owner_kind: its controller's kind."""
        with self.cond:
            meta = {"name": name, "namespace": namespace, "uid": uid or str(uuid.uuid4()), "labels": labels or {}}
            if owner_kind:
                meta["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": owner_kind, "name": f"{name}-owner",
                                            "uid": str(uuid.uuid4()), "controller": True}]
            specs = [{"name": c, **({"resources": {"limits": {k: str(v) for k, v in limits.items()}}}
                                    if limits else {})} for c in (containers or ({"main": ""} if limits else {}))]
            pod = {"apiVersion": "v1", "kind": "Pod", "metadata": meta,
                   "spec": {"nodeName": node, "containers": specs},
                   "status": {"phase": "Running", "containerStatuses": [
                       {"name": c, "containerID": cid, "ready": ready} for c, cid in (containers or {}).items()],
                              "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}
            self._bump(pod)
            self.pods[(namespace, name)] = pod
            self._record("ADDED", pod)
            return copy.deepcopy(pod)

    def set_ready(self, namespace: str, name: str, ready: bool = True) -> None:
        """The kubelet reports the pod's readiness (what a PodDisruptionBudget counts as healthy)."""
        with self.cond:
            pod = self.pods[(namespace, name)]
            for c in pod["status"].get("conditions") or []:
                if c["type"] == "Ready":
                    c["status"] = "True" if ready else "False"
            for cs in pod["status"].get("containerStatuses") or []:
                cs["ready"] = ready
            self._bump(pod)
            self._record("MODIFIED", pod)

    def delete_pod(self, namespace: str, name: str) -> None:
        with self.cond:
            pod = self.pods.pop((namespace, name), None)
            if pod is not None:
                self._bump(pod)
                self._record("DELETED", pod)
        if pod is not None:
            for hook in self.on_delete:  # the "kubelet" stopping the pod's containers
                hook(namespace, name)

    def add_pdb(self, namespace: str, name: str, match_labels: dict, disruptions_allowed: int | None = None, *,
                min_available: int | str | None = None, max_unavailable: int | str | None = None,
                expected_pods: int | None = None) -> None:
        """A PodDisruptionBudget. With min_available or max_unavailable (a count or "50%") the budget is worked
        out at each eviction as the disruption controller does, from the matching pods that are Ready and not
        terminating; expected_pods stands in for the controller's scale (default: the matching pods).
        disruptions_allowed alone: a fixed status.disruptionsAllowed, counted down by each eviction."""
        with self.cond:
            self.pdbs.append({"namespace": namespace, "name": name, "matchLabels": match_labels,
                              "disruptionsAllowed": disruptions_allowed, "minAvailable": min_available,
                              "maxUnavailable": max_unavailable, "expectedPods": expected_pods})

    def set_pdb(self, name: str, disruptions_allowed: int) -> None:
        with self.cond:
            for p in self.pdbs:
                if p["name"] == name:
                    p["disruptionsAllowed"] = disruptions_allowed

    def _budget(self, pdb: dict) -> tuple[int, int, int]:
        """(disruptionsAllowed, desiredHealthy, currentHealthy) of a PDB now (called with the lock held)."""
        pods = [p for (ns, _), p in self.pods.items() if ns == pdb["namespace"]
                and all((p["metadata"].get("labels") or {}).get(k) == v for k, v in pdb["matchLabels"].items())]
        healthy = sum(1 for p in pods if _ready(p) and not p["metadata"].get("deletionTimestamp"))
        if pdb["minAvailable"] is None and pdb["maxUnavailable"] is None:
            allowed = pdb["disruptionsAllowed"] or 0
            return allowed, max(healthy - allowed, 0), healthy
        expected = pdb["expectedPods"] if pdb["expectedPods"] is not None else len(pods)
        if pdb["minAvailable"] is not None:
            desired = _scaled(pdb["minAvailable"], expected)
        else:
            desired = max(expected - _scaled(pdb["maxUnavailable"], expected), 0)
        return max(healthy - desired, 0), desired, healthy

    def compact(self) -> None:
        """Forget watch history (as etcd compaction does): open watches end with 410 Gone, and a watch
        from any resourceVersion seen so far answers 410 too; clients must list again."""
        with self.cond:
            self.history.clear()
            self.history_floor = self.rv + 1
            self.compactions += 1
            self.cond.notify_all()

    def _record(self, kind: str, pod: dict) -> None:
        self.history.append((self.rv, kind, copy.deepcopy(pod)))
        self.cond.notify_all()

    def calls(self, since: float = 0.0, *, verbs: tuple[str, ...] | None = None) -> list[Request]:
        with self.cond:
            return [r for r in self.requests if r.ts >= since and (verbs is None or r.verb in verbs)]

    # --- request handling ----------------------------------------------------------------------------
    def handle(self, method: str, path: str, query: dict, body: bytes, ctype: str):
        """(status, object) for one request, or (200, generator) for a watch."""
        route = self._route(method, path, query)
        if route is None:
            raise ApiError(404, "NotFound", f"the server could not find the requested resource ({method} {path})")
        verb, resource, fn, args = route
        if verb == "discover":
            return fn(*args, query=query, body=body, ctype=ctype)
        if (verb, resource) in self.denied or (self.allowed is not None and (verb, resource) not in self.allowed):
            name = args[-1] if args else ""
            raise ApiError(403, "Forbidden",
                           f"{resource.split('/')[0]} \"{name}\" is forbidden: User "
                           f"\"system:serviceaccount:gpuwarden:gpuwarden-agent\" cannot {verb} resource "
                           f"\"{resource}\" in API group \"{_group_of(path)}\" "
                           f"at the cluster scope",
                           {"name": name, "kind": resource.split("/")[0]})
        return fn(*args, query=query, body=body, ctype=ctype)

    def _route(self, method, path, query):
        watching = query.get("watch", [""])[0] in ("true", "1")
        table = [
            ("GET", r"/api/v1/nodes/([^/]+)", "get", "nodes", self._get_node),
            ("PATCH", r"/api/v1/nodes/([^/]+)", "patch", "nodes", self._patch_node),
            ("PATCH", r"/api/v1/nodes/([^/]+)/status", "patch", "nodes/status", self._patch_node_status),
            ("GET", r"/api/v1/pods", "watch" if watching else "list", "pods", self._list_pods),
            ("GET", r"/api/v1/namespaces/([^/]+)/pods/([^/]+)", "get", "pods", self._get_pod),
            ("GET", r"/api/v1/namespaces/([^/]+)/pods", "list", "pods", self._list_namespaced_pods),
            ("POST", r"/api/v1/namespaces/([^/]+)/pods/([^/]+)/eviction", "create", "pods/eviction", self._evict),
            ("POST", r"/api/v1/namespaces/([^/]+)/events", "create", "events", self._create_event),
            ("GET", r"/apis/coordination.k8s.io/v1/namespaces/([^/]+)/leases/([^/]+)", "get", "leases",
             self._get_lease),
            ("POST", r"/apis/coordination.k8s.io/v1/namespaces/([^/]+)/leases", "create", "leases", self._create_lease),
            ("PUT", r"/apis/coordination.k8s.io/v1/namespaces/([^/]+)/leases/([^/]+)", "update", "leases",
             self._update_lease),
            ("GET", r"/apis", "discover", "", self._groups),
            ("GET", r"/apis/resource.k8s.io", "discover", "", self._resource_group),
            ("GET", r"/apis/resource.k8s.io/([^/]+)", "discover", "", self._resource_list),
            ("GET", r"/apis/resource.k8s.io/([^/]+)/resourceslices", "watch" if watching else "list",
             "resourceslices", self._list_slices),
            ("GET", r"/apis/resource.k8s.io/([^/]+)/devicetaintrules", "list", "devicetaintrules", self._list_rules),
            ("GET", r"/apis/resource.k8s.io/([^/]+)/devicetaintrules/([^/]+)", "get", "devicetaintrules",
             self._get_rule),
            ("POST", r"/apis/resource.k8s.io/([^/]+)/devicetaintrules", "create", "devicetaintrules",
             self._create_rule),
            ("DELETE", r"/apis/resource.k8s.io/([^/]+)/devicetaintrules/([^/]+)", "delete", "devicetaintrules",
             self._delete_rule),
            ("POST", r"/apis/authentication.k8s.io/v1/tokenreviews", "create", "tokenreviews", self._token_review),
        ]
        for m, pattern, verb, resource, fn in table:
            found = re.fullmatch(pattern, path)
            if m == method and found:
                return verb, resource, fn, found.groups()
        return None

    # --- resource.k8s.io: discovery, ResourceSlices, DeviceTaintRules (API reference of the DRA types) -------
    def _served(self, version: str, resource: str) -> None:
        if resource not in self.dra_versions.get(version, set()):
            raise ApiError(404, "NotFound", f"the server could not find the requested resource "
                           f"(resource.k8s.io/{version} {resource})")

    def _groups(self, **_):
        versions = self._dra_version_list()
        groups = [{"name": "coordination.k8s.io", "versions": [{"groupVersion": "coordination.k8s.io/v1",
                                                                 "version": "v1"}],
                   "preferredVersion": {"groupVersion": "coordination.k8s.io/v1", "version": "v1"}}]
        if versions:
            groups.append(self._resource_group()[1])
        return 200, {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}

    def _dra_version_list(self) -> list[str]:
        order = ["v1", "v1beta2", "v1beta1", "v1alpha3"]
        return [v for v in order if self.dra_versions.get(v)] + sorted(v for v in self.dra_versions
                                                                      if v not in order and self.dra_versions[v])

    def _resource_group(self, **_):
        versions = self._dra_version_list()
        if not versions:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        entries = [{"groupVersion": f"resource.k8s.io/{v}", "version": v} for v in versions]
        return 200, {"kind": "APIGroup", "apiVersion": "v1", "name": "resource.k8s.io", "versions": entries,
                     "preferredVersion": entries[0]}

    def _resource_list(self, version, **_):
        served = self.dra_versions.get(version)
        if not served:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        kinds = {"resourceslices": ("ResourceSlice", ["create", "delete", "get", "list", "watch", "update"]),
                 "devicetaintrules": ("DeviceTaintRule", ["create", "delete", "get", "list", "watch", "update"])}
        return 200, {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": f"resource.k8s.io/{version}",
                     "resources": [{"name": r, "singularName": kinds[r][0].lower(), "namespaced": False,
                                    "kind": kinds[r][0], "verbs": kinds[r][1]} for r in sorted(served)]}

    def _list_slices(self, version, query, **_):
        self._served(version, "resourceslices")
        wanted = {}
        for term in filter(None, query.get("fieldSelector", [""])[0].split(",")):
            field, _, value = term.partition("=")
            if field not in ("spec.nodeName", "spec.driver"):
                raise ApiError(400, "BadRequest", f"field label not supported: {field}")
            wanted[field.split(".")[1]] = value
        with self.cond:
            items = [{**copy.deepcopy(s), "apiVersion": f"resource.k8s.io/{version}"} for s in self.slices.values()
                     if all(s["spec"].get(k) == v for k, v in wanted.items())]
            return 200, {"apiVersion": f"resource.k8s.io/{version}", "kind": "ResourceSliceList",
                         "metadata": {"resourceVersion": str(self.rv)}, "items": items}

    def _list_rules(self, version, query, **_):
        self._served(version, "devicetaintrules")
        labels = dict(t.split("=", 1) for t in filter(None, query.get("labelSelector", [""])[0].split(",")))
        with self.cond:
            items = [{**copy.deepcopy(r), "apiVersion": f"resource.k8s.io/{version}"} for r in self.taint_rules.values()
                     if all((r["metadata"].get("labels") or {}).get(k) == v for k, v in labels.items())]
            return 200, {"apiVersion": f"resource.k8s.io/{version}", "kind": "DeviceTaintRuleList",
                         "metadata": {"resourceVersion": str(self.rv)}, "items": items}

    def _get_rule(self, version, name, **_):
        self._served(version, "devicetaintrules")
        with self.cond:
            rule = self.taint_rules.get(name)
            if rule is None:
                raise _rule_not_found(name)
            return 200, {**copy.deepcopy(rule), "apiVersion": f"resource.k8s.io/{version}"}

    def _create_rule(self, version, body, **_):
        self._served(version, "devicetaintrules")
        rule = json.loads(body or b"{}")
        if rule.get("apiVersion") != f"resource.k8s.io/{version}" or rule.get("kind") != "DeviceTaintRule":
            raise ApiError(400, "BadRequest", f"the API version in the data ({rule.get('apiVersion')}) does not match "
                           f"the expected API version (resource.k8s.io/{version})")
        _validate_rule(rule)
        name = rule["metadata"]["name"]
        with self.cond:
            if name in self.taint_rules:
                raise ApiError(409, "AlreadyExists", f"devicetaintrules.resource.k8s.io \"{name}\" already exists",
                               {"name": name, "group": "resource.k8s.io", "kind": "devicetaintrules"})
            rule["metadata"] = {**rule["metadata"], "uid": str(uuid.uuid4()), "generation": 1,
                                "creationTimestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
            rule["spec"]["taint"].setdefault("timeAdded", rule["metadata"]["creationTimestamp"])
            self._bump(rule)
            self.taint_rules[name] = rule
            return 201, copy.deepcopy(rule)

    def _delete_rule(self, version, name, **_):
        self._served(version, "devicetaintrules")
        with self.cond:
            rule = self.taint_rules.pop(name, None)
            if rule is None:
                raise _rule_not_found(name)
            return 200, {**rule, "apiVersion": f"resource.k8s.io/{version}"}

    def _token_review(self, body, **_):
        review = json.loads(body or b"{}")
        spec = review.get("spec") or {}
        found = self.tokens.get(spec.get("token", ""))
        want = spec.get("audiences") or ["https://kubernetes.default.svc"]
        status: dict = {"authenticated": False, "error": "invalid bearer token"}
        if found is not None:
            user, audiences = found
            common = [a for a in want if a in audiences]
            status = ({"authenticated": True, "user": copy.deepcopy(user), "audiences": common} if common else
                      {"authenticated": False, "error": "token audiences do not match the requested audiences"})
        return 201, {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "metadata": {},
                     "spec": spec, "status": status}

    def _get_node(self, name, **_):
        with self.cond:
            if name not in self.nodes:
                raise ApiError(404, "NotFound", f"nodes \"{name}\" not found", {"name": name, "kind": "nodes"})
            return 200, copy.deepcopy(self.nodes[name])

    def _apply(self, obj, body: bytes, ctype: str):
        try:
            patch = json.loads(body or b"null")
        except ValueError:
            raise ApiError(400, "BadRequest", "the body of the request was in an unknown format") from None
        kind = ctype.split(";")[0].strip()
        if kind == "application/strategic-merge-patch+json":
            if not isinstance(patch, dict):
                raise ApiError(400, "BadRequest", "json: cannot unmarshal array into Go value of type map[string]interface {}")
            return strategic_merge(obj, patch)
        if kind == "application/merge-patch+json":
            return merge_patch(obj, patch)
        if kind == "application/json-patch+json":
            return json_patch(obj, patch)
        raise ApiError(415, "UnsupportedMediaType", f"the body of the request was in an unknown format - accepted "
                       f"media types include: application/json-patch+json, application/merge-patch+json, "
                       f"application/apply-patch+yaml, application/strategic-merge-patch+json (got {kind!r})")

    def _patch(self, name, body, ctype, *, status: bool):
        with self.cond:
            if name not in self.nodes:
                raise ApiError(404, "NotFound", f"nodes \"{name}\" not found")
            if not status and self.conflict_next > 0:
                # Another client wrote the node between this client's read and its patch.
                self.conflict_next -= 1
                self._bump(self.nodes[name])
            old = self.nodes[name]
            new = self._apply(old, body, ctype)
            want_rv = (new.get("metadata") or {}).get("resourceVersion")
            if want_rv != old["metadata"]["resourceVersion"]:
                raise ApiError(409, "Conflict", f"Operation cannot be fulfilled on nodes \"{name}\": the object has "
                               "been modified; please apply your changes to the latest version and try again",
                               {"name": name, "kind": "nodes"})
            merged = copy.deepcopy(old)
            if status:  # the status subresource changes status only
                merged["status"] = new.get("status", {})
            else:  # the main resource never changes status
                merged["metadata"] = {**new.get("metadata", {}), "uid": old["metadata"]["uid"], "name": name}
                merged["spec"] = new.get("spec", {})
            _validate_node(merged)
            self._bump(merged)
            self.nodes[name] = merged
            return 200, copy.deepcopy(merged)

    def _patch_node(self, name, body, ctype, **_):
        return self._patch(name, body, ctype, status=False)

    def _patch_node_status(self, name, body, ctype, **_):
        return self._patch(name, body, ctype, status=True)

    def _list_pods(self, query, **_):
        selector = query.get("fieldSelector", [""])[0]
        node = selector.split("=", 1)[1] if selector.startswith("spec.nodeName=") else None
        if query.get("watch", [""])[0] in ("true", "1"):
            return 200, self._watch(node, query)
        with self.cond:
            items = [copy.deepcopy(p) for p in self.pods.values() if node is None or p["spec"]["nodeName"] == node]
            return 200, {"apiVersion": "v1", "kind": "PodList", "metadata": {"resourceVersion": str(self.rv)},
                         "items": items}

    def _watch(self, node, query):
        since = int(query.get("resourceVersion", ["0"])[0] or 0)
        timeout = float(query.get("timeoutSeconds", ["300"])[0])
        bookmarks = query.get("allowWatchBookmarks", [""])[0] in ("true", "1")
        deadline = time.monotonic() + timeout

        def expired():
            err = ApiError(410, "Expired", f"too old resource version: {since} ({self.history_floor})")
            return {"type": "ERROR", "object": err.status()}

        def stream():
            sent = since
            with self.cond:
                generation = self.compactions
                if since < self.history_floor:
                    yield expired()
                    return
            while True:
                with self.cond:
                    if self.compactions != generation:
                        yield expired()
                        return
                    batch = [(rv, k, o) for rv, k, o in self.history if rv > sent]
                    if not batch:
                        left = deadline - time.monotonic()
                        if left <= 0 or self._stopping:
                            if bookmarks:
                                yield {"type": "BOOKMARK", "object": {"kind": "Pod", "apiVersion": "v1",
                                                                      "metadata": {"resourceVersion": str(self.rv)}}}
                            return
                        self.cond.wait(min(left, 0.5))
                        continue
                for rv, kind, obj in batch:
                    sent = rv
                    if node is None or obj["spec"]["nodeName"] == node:
                        yield {"type": kind, "object": obj}
        return stream()

    def _list_namespaced_pods(self, namespace, query, **_):
        selector = query.get("fieldSelector", [""])[0]
        name = selector.split("=", 1)[1] if selector.startswith("metadata.name=") else None
        with self.cond:
            items = [copy.deepcopy(p) for (ns, n), p in self.pods.items() if ns == namespace and name in (None, n)]
            return 200, {"apiVersion": "v1", "kind": "PodList", "metadata": {"resourceVersion": str(self.rv)},
                         "items": items}

    def _get_pod(self, namespace, name, **_):
        with self.cond:
            pod = self.pods.get((namespace, name))
            if pod is None:
                raise ApiError(404, "NotFound", f"pods \"{name}\" not found", {"name": name, "kind": "pods"})
            return 200, copy.deepcopy(pod)

    def _evict(self, namespace, name, body, **_):
        req = json.loads(body or b"{}")
        grace = ((req.get("deleteOptions") or {}).get("gracePeriodSeconds"))
        dry = "All" in ((req.get("deleteOptions") or {}).get("dryRun") or [])
        with self.cond:
            pod = self.pods.get((namespace, name))
            if pod is None:
                raise ApiError(404, "NotFound", f"pods \"{name}\" not found", {"name": name, "kind": "pods"})
            if pod["metadata"].get("deletionTimestamp"):
                return 201, _status_ok()
            labels = pod["metadata"].get("labels") or {}
            for pdb in self.pdbs:
                if pdb["namespace"] == namespace and all(labels.get(k) == v for k, v in pdb["matchLabels"].items()):
                    allowed, desired, healthy = self._budget(pdb)
                    # An unready pod may go while the budget is met (unhealthyPodEvictionPolicy IfHealthyBudget).
                    if allowed <= 0 and not (not _ready(pod) and healthy >= desired):
                        raise ApiError(429, "TooManyRequests",
                                       "Cannot evict pod as it would violate the pod's disruption budget.",
                                       {"causes": [{"reason": "DisruptionBudget", "message":
                                                    f"The disruption budget {pdb['name']} needs {desired} healthy "
                                                    f"pods and has {healthy} currently"}]})
                    if not dry and pdb["disruptionsAllowed"] is not None and _ready(pod):
                        pdb["disruptionsAllowed"] -= 1
            if dry:
                return 201, _status_ok()
            pod["metadata"]["deletionTimestamp"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            pod["metadata"]["deletionGracePeriodSeconds"] = 30 if grace is None else grace
            self._bump(pod)
            self._record("MODIFIED", pod)
        delay = 0.05 if not grace else min(float(grace), 2.0)  # terminated by the "kubelet"
        t = threading.Timer(delay, self.delete_pod, (namespace, name))
        t.daemon = True
        self._timers.append(t)
        t.start()
        return 201, _status_ok()

    # Leases: create fails with 409 AlreadyExists when the name is taken; an update (PUT) must carry the
    # resourceVersion it was read at, else 409 Conflict; every write bumps it (optimistic concurrency).
    def _get_lease(self, namespace, name, **_):
        with self.cond:
            lease = self.leases.get((namespace, name))
            if lease is None:
                raise _lease_not_found(name)
            return 200, copy.deepcopy(lease)

    def _create_lease(self, namespace, body, **_):
        lease = json.loads(body or b"{}")
        name = (lease.get("metadata") or {}).get("name")
        if not name:
            raise ApiError(422, "Invalid", "Lease.coordination.k8s.io is invalid: metadata.name: Required value")
        with self.cond:
            if (namespace, name) in self.leases:
                raise ApiError(409, "AlreadyExists", f"leases.coordination.k8s.io \"{name}\" already exists",
                               {"name": name, "group": "coordination.k8s.io", "kind": "leases"})
            lease["metadata"] = {**lease["metadata"], "namespace": namespace, "uid": str(uuid.uuid4())}
            lease.update(apiVersion="coordination.k8s.io/v1", kind="Lease")
            self._bump(lease)
            self.leases[(namespace, name)] = lease
            return 201, copy.deepcopy(lease)

    def _update_lease(self, namespace, name, body, **_):
        lease = json.loads(body or b"{}")
        with self.cond:
            old = self.leases.get((namespace, name))
            if old is None:
                raise _lease_not_found(name)
            if (lease.get("metadata") or {}).get("resourceVersion") != old["metadata"]["resourceVersion"]:
                raise ApiError(409, "Conflict", f"Operation cannot be fulfilled on leases.coordination.k8s.io "
                               f"\"{name}\": the object has been modified; please apply your changes to the "
                               "latest version and try again", {"name": name, "kind": "leases"})
            lease["metadata"] = {**lease["metadata"], "namespace": namespace, "name": name,
                                 "uid": old["metadata"]["uid"]}
            lease.update(apiVersion="coordination.k8s.io/v1", kind="Lease")
            self._bump(lease)
            self.leases[(namespace, name)] = lease
            return 200, copy.deepcopy(lease)

    def _create_event(self, namespace, body, **_):
        event = json.loads(body)
        meta = event.setdefault("metadata", {})
        if not meta.get("name"):
            meta["name"] = meta.get("generateName", "event.") + uuid.uuid4().hex[:10]
        meta["namespace"] = namespace
        if not event.get("involvedObject", {}).get("kind") or not event.get("reason"):
            raise ApiError(422, "Invalid", "Event is invalid: involvedObject and reason are required")
        with self.cond:
            self._bump(event)
            self.events.append(event)
        return 201, event


def _ready(pod: dict) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in (pod.get("status") or {}).get("conditions") or ())


def _scaled(value: int | str, expected: int) -> int:
    """An IntOrString of a PDB: a count, or a percentage of the expected pods rounded up (as the controller does)."""
    if isinstance(value, str) and value.endswith("%"):
        return -(-int(value[:-1]) * expected // 100)
    return int(value)


def _group_of(path: str) -> str:
    if "eviction" in path:
        return "policy"
    return path.split("/")[2] if path.startswith("/apis/") else ""


def _rule_not_found(name: str) -> ApiError:
    return ApiError(404, "NotFound", f"devicetaintrules.resource.k8s.io \"{name}\" not found",
                    {"name": name, "group": "resource.k8s.io", "kind": "devicetaintrules"})


DEVICE_TAINT_EFFECTS = ("NoSchedule", "NoExecute", "None")
_QUALIFIED = re.compile(r"([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
                        r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")
_LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def _validate_rule(rule: dict) -> None:
    """The DeviceTaintRule validation gpuwarden can trip: name, taint key/value/effect, a selector."""
    def invalid(field: str, why: str) -> ApiError:
        name = (rule.get("metadata") or {}).get("name", "")
        return ApiError(422, "Invalid", f"DeviceTaintRule.resource.k8s.io \"{name}\" is invalid: {field}: {why}",
                        {"name": name, "group": "resource.k8s.io", "kind": "DeviceTaintRule",
                         "causes": [{"reason": "FieldValueInvalid", "message": why, "field": field}]})
    name = (rule.get("metadata") or {}).get("name") or ""
    if not _DNS_SUBDOMAIN.fullmatch(name) or len(name) > 253:
        raise invalid("metadata.name", f"Invalid value: {name!r}: a lowercase RFC 1123 subdomain")
    spec = rule.get("spec") or {}
    taint = spec.get("taint") or {}
    if not taint.get("key") or not _QUALIFIED.fullmatch(taint["key"]):
        raise invalid("spec.taint.key", f"Invalid value: {taint.get('key')!r}: a qualified name")
    if len(taint.get("value") or "") > 63 or not _LABEL_VALUE.fullmatch(taint.get("value") or ""):
        raise invalid("spec.taint.value", f"Invalid value: {taint.get('value')!r}: a label value")
    if taint.get("effect") not in DEVICE_TAINT_EFFECTS:
        raise invalid("spec.taint.effect", f"Unsupported value: {taint.get('effect')!r}: supported values: "
                      + ", ".join(f'"{e}"' for e in DEVICE_TAINT_EFFECTS))
    selector = spec.get("deviceSelector")
    if selector is not None:
        unknown = set(selector) - {"driver", "pool", "device"}
        if unknown:
            raise invalid("spec.deviceSelector", f"unknown field(s) {sorted(unknown)}")


def _lease_not_found(name: str) -> ApiError:
    return ApiError(404, "NotFound", f"leases.coordination.k8s.io \"{name}\" not found",
                    {"name": name, "group": "coordination.k8s.io", "kind": "leases"})


def _status_ok() -> dict:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}


def _validate_node(node: dict) -> None:
    for t in (node.get("spec") or {}).get("taints") or []:
        if not t.get("key") or t.get("effect") not in TAINT_EFFECTS:
            raise ApiError(422, "Invalid", f"Node \"{node['metadata']['name']}\" is invalid: spec.taints: "
                           f"Invalid value: {json.dumps(t)}: a taint needs a key and one of {TAINT_EFFECTS}")
    keys = [(t.get("key"), t.get("effect")) for t in (node.get("spec") or {}).get("taints") or []]
    if len(keys) != len(set(keys)):
        raise ApiError(422, "Invalid", "spec.taints: Duplicate value: taints must be unique by key and effect")
    for c in (node.get("status") or {}).get("conditions") or []:
        if not c.get("type") or c.get("status") not in ("True", "False", "Unknown"):
            raise ApiError(422, "Invalid", f"status.conditions: Invalid value: {json.dumps(c)}")


def _handler(api: FakeApiServer):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):  # the request log is api.requests
            pass

        def _serve(self, method: str):
            url = urlparse(self.path)
            query = parse_qs(url.query)
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            route = api._route(method, url.path, query)
            verb, resource = (route[0], route[1]) if route else ("?", "?")
            try:
                if api.token is not None and self.headers.get("Authorization") != f"Bearer {api.token}":
                    raise ApiError(401, "Unauthorized", "Unauthorized")
                code, obj = api.handle(method, url.path, query, body, self.headers.get("Content-Type", ""))
            except ApiError as exc:
                code, obj = exc.code, exc.status()
            with api.cond:
                api.requests.append(Request(time.time(), method, url.path, query, code, verb, resource))
            if hasattr(obj, "__next__"):
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                try:
                    for event in obj:
                        line = (json.dumps(event) + "\n").encode()
                        self.wfile.write(f"{len(line):x}\r\n".encode() + line + b"\r\n")
                        self.wfile.flush()
                    self.wfile.write(b"0\r\n\r\n")
                except (BrokenPipeError, ConnectionResetError):
                    pass
                self.close_connection = True
                return
            data = json.dumps(obj).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            self._serve("GET")

        def do_PATCH(self):
            self._serve("PATCH")

        def do_POST(self):
            self._serve("POST")

        def do_PUT(self):
            self._serve("PUT")

        def do_DELETE(self):
            self._serve("DELETE")

    return Handler
