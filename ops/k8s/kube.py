"""The Kubernetes API as gpuwarden uses it: the official client, raw JSON in and out, one-line errors.

Loads the client lazily (in-cluster service account, else KUBECONFIG); counts the calls it makes so the
agent can show its API cost. Every refusal becomes a KubeError naming the verb, the object and the fix.
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Mapping
from types import ModuleType
from typing import Any, Callable, Iterator

from gpuwarden.ops.foundation.errors import GpuwardenError
from gpuwarden.ops.k8s.objects import Lease, Node, Pod, PodList, WatchEvent

SMP = "application/strategic-merge-patch+json"
MERGE = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
RBAC_HINT = ("grant it in the ClusterRole of deploy/k8s/base/rbac.yaml "
             "(kubectl apply -k deploy/k8s/overlays/amd, or .../nvidia)")


class KubeError(GpuwardenError):
    """The API server refused or could not be reached; `status` is the HTTP code (None: no answer)."""

    def __init__(self, message: str, hint: str | None = None, status: int | None = None, reason: str = ""):
        super().__init__(message, hint)
        self.status = status
        self.reason = reason


class Forbidden(KubeError):
    """403: the service account lacks a verb (RBAC)."""


class Conflict(KubeError):
    """409: the object changed since it was read (resourceVersion); read it again and retry."""


class TooManyRequests(KubeError):
    """429: for an eviction, a PodDisruptionBudget does not allow it now."""


class NotFoundError(KubeError):
    """404: no such object."""


_BY_STATUS = {403: Forbidden, 409: Conflict, 429: TooManyRequests, 404: NotFoundError}


def _load_client() -> tuple[ModuleType, ModuleType]:
    """The client's `client` and `config` modules (untyped: the official client ships no annotations)."""
    try:
        # deferred: optional (the kubernetes extra), and heavy: only Kubernetes mode pays for it
        import kubernetes  # noqa: F401
        from kubernetes import client, config
    except ImportError:
        raise GpuwardenError("the Kubernetes client is not installed",
                             "pip install 'gpuwarden[kubernetes]' (the official `kubernetes` package)") from None
    return client, config


def connect(kubeconfig: str | None = None) -> "Kube":
    """A Kube for this pod's service account when in a cluster, else for KUBECONFIG (or ~/.kube/config)."""
    client, config = _load_client()
    conf = client.Configuration()
    try:
        if kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
            config.load_incluster_config(client_configuration=conf)
        else:
            config.load_kube_config(config_file=kubeconfig, client_configuration=conf, persist_config=False)
    except (config.ConfigException, OSError, TypeError, ValueError) as exc:
        raise GpuwardenError(f"no Kubernetes credentials: {exc}",
                             "run in the DaemonSet (service account), or set KUBECONFIG to a kubeconfig file") from None
    # A hung API server must not hold the agent's sampling: every call gets a deadline.
    conf.retries = 1
    return Kube(client.ApiClient(conf), host=conf.host)


class Kube:
    """The calls the agent and the playbooks make; raw dicts as the API serves them."""

    def __init__(self, api_client: Any, host: str = "", timeout_s: float = 10.0):
        client, _ = _load_client()
        self.api_client = api_client
        self.core = client.CoreV1Api(api_client)
        self.coordination = client.CoordinationV1Api(api_client)
        self.host = host
        self.timeout_s = timeout_s
        self.calls = 0

    def close(self) -> None:
        self.api_client.close()

    # ------------------------------------------------------------------------------------------
    def _call(self, what: str, fn: Callable[..., Any], *args: object, raw: bool = True, **kw: object) -> Any:
        """fn(*args, **kw) with a deadline; the JSON it answered (raw) or the client's response object. Any: the
        typed methods below say which object each call answers."""
        # deferred: the client's modules, loaded by _load_client() when Kubernetes mode starts
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError
        self.calls += 1
        kw.setdefault("_request_timeout", self.timeout_s)
        if raw:
            kw["_preload_content"] = False
        try:
            resp = fn(*args, **kw)
        except ApiException as exc:
            raise self._error(what, exc) from None
        except HTTPError as exc:
            # urllib3 wraps the cause (connection refused, timeout) in MaxRetryError: the cause is the news.
            cause = str(getattr(exc, "reason", None) or exc)
            cause = cause.split("): ", 1)[-1] if "): " in cause else cause
            raise KubeError(f"cannot reach the Kubernetes API at {self.host or '?'} to {what}: {cause[:200]}",
                            "check the API server and the node's network; gpuwarden retries") from None
        if not raw:
            return resp
        data = resp.data
        return json.loads(data) if data else {}

    def _error(self, what: str, exc: Any) -> KubeError:
        message, reason = exc.reason or "", ""
        try:
            body = json.loads(exc.body or "{}")
            message, reason = body.get("message") or message, body.get("reason", "")
            # A 429 from an eviction names the PodDisruptionBudget only in its causes.
            causes = [str(c["message"]) for c in (body.get("details") or {}).get("causes") or ()
                      if isinstance(c, dict) and c.get("message")]
            if causes:
                message = f"{message} ({'; '.join(causes)})"
        except (TypeError, ValueError):
            pass
        cls = _BY_STATUS.get(exc.status, KubeError)
        hint = {403: RBAC_HINT,
                409: "it changed meanwhile; gpuwarden reads it again and retries",
                429: "a PodDisruptionBudget does not allow it now; wait, or relax the budget",
                404: "check the name (this node's: --node-name, [kubernetes] node_name, NODE_NAME)"}.get(exc.status)
        return cls(f"Kubernetes refused to {what} ({exc.status} {reason or exc.reason}): {message}",
                   hint, status=exc.status, reason=reason)

    # --- nodes ---------------------------------------------------------------------------------
    def node(self, name: str) -> Node:
        node: Node = self._call(f"get node {name}", self.core.read_node, name)
        return node

    def patch_node(self, name: str, body: Mapping[str, object], content_type: str = SMP) -> Node:
        # The client's default for a patch is JSON Patch; a dict body must say which patch it is.
        node: Node = self._call(f"patch node {name}", self.core.patch_node, name, body, _content_type=content_type)
        return node

    def update_node(self, name: str, change: Callable[[Node], Mapping[str, object] | None],
                    tries: int = 5) -> Node | None:
        """Read-modify-write of a node: change(node) gives a strategic merge patch (None: nothing to do),
        sent with the resourceVersion it was made from, so a write by anyone else in between is a 409;
        then the node is read again and the change made afresh."""
        for _ in range(tries):
            node = self.node(name)
            patch = change(node)
            if patch is None:
                return None
            meta = patch.get("metadata")
            body = {**patch, "metadata": {**(meta if isinstance(meta, Mapping) else {}),
                                          "resourceVersion": node["metadata"]["resourceVersion"]}}
            try:
                return self.patch_node(name, body)
            except Conflict:
                continue
        raise KubeError(f"node {name} kept changing: gave up after {tries} conflicting writes",
                        "gpuwarden tries again later")

    def patch_node_status(self, name: str, body: Mapping[str, object], content_type: str = SMP) -> Node:
        node: Node = self._call(f"patch nodes/status of {name}", self.core.patch_node_status, name, body,
                                _content_type=content_type)
        return node

    # --- pods ----------------------------------------------------------------------------------
    def pods_on(self, node: str) -> PodList:
        """PodList of the pods bound to `node` (fieldSelector spec.nodeName)."""
        pods: PodList = self._call(f"list pods on node {node}", self.core.list_pod_for_all_namespaces,
                                   field_selector=f"spec.nodeName={node}")
        return pods

    def watch_pods(self, node: str, resource_version: str, timeout_s: int) -> "WatchStream":
        """A watch of the pods on `node` from `resource_version`; iterate it for (type, object)."""
        resp = self._call(f"watch pods on node {node}", self.core.list_pod_for_all_namespaces, raw=False,
                          field_selector=f"spec.nodeName={node}", watch=True, resource_version=resource_version,
                          allow_watch_bookmarks=True, timeout_seconds=timeout_s, _preload_content=False,
                          _request_timeout=(self.timeout_s, timeout_s + 15))
        return WatchStream(resp)

    def pod(self, namespace: str, name: str) -> Pod | None:
        # A list by name, not a get: the agent's role has list/watch on pods and nothing more.
        listed: PodList = self._call(f"list pod {namespace}/{name}", self.core.list_namespaced_pod, namespace,
                                     field_selector=f"metadata.name={name}")
        items = listed.get("items") or []
        return items[0] if items else None

    def evict(self, namespace: str, name: str, grace_s: int | None = None, dry_run: bool = False) -> None:
        """POST pods/eviction: the API server checks PodDisruptionBudgets (429 while one blocks)."""
        body: dict[str, Any] = {"apiVersion": "policy/v1", "kind": "Eviction",
                                "metadata": {"name": name, "namespace": namespace}}
        if grace_s is not None:
            body["deleteOptions"] = {"gracePeriodSeconds": int(grace_s)}
        if dry_run:
            body.setdefault("deleteOptions", {})["dryRun"] = ["All"]
        self._call(f"evict pod {namespace}/{name}", self.core.create_namespaced_pod_eviction, name, namespace, body)

    # --- events --------------------------------------------------------------------------------
    def create_event(self, namespace: str, body: Mapping[str, object]) -> None:
        self._call(f"create an event in {namespace}", self.core.create_namespaced_event, namespace, body)


    # --- leases (coordination.k8s.io/v1) ------------------------------------------------------------
    def lease(self, namespace: str, name: str) -> Lease:
        lease: Lease = self._call(f"get lease {namespace}/{name}", self.coordination.read_namespaced_lease, name,
                                  namespace)
        return lease

    def create_lease(self, namespace: str, body: Lease) -> Lease:
        """409 (Conflict) when a lease of that name exists already."""
        lease: Lease = self._call(f"create lease {namespace}/{body['metadata']['name']}",
                                  self.coordination.create_namespaced_lease, namespace, body)
        return lease

    def update_lease(self, namespace: str, body: Lease) -> Lease:
        """PUT with the resourceVersion it was read at: 409 (Conflict) when anyone wrote it since."""
        name = body["metadata"]["name"]
        lease: Lease = self._call(f"update lease {namespace}/{name}", self.coordination.replace_namespaced_lease,
                                  name, namespace, body)
        return lease


class WatchStream:
    """Lines of a watch response as (type, object) pairs; close() ends it from another thread."""

    def __init__(self, resp: Any):
        self._resp = resp

    def __iter__(self) -> Iterator[tuple[str, Pod]]:
        buf = b""
        for chunk in self._resp.stream(amt=None, decode_content=False):
            buf += chunk
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                if line.strip():
                    event: WatchEvent = json.loads(line)
                    yield event.get("type", ""), event.get("object") or {}
        if buf.strip():
            event = json.loads(buf)
            yield event.get("type", ""), event.get("object") or {}

    def close(self) -> None:
        # Closing the response would wait for the reader's buffer lock; shutting the socket down wakes
        # the reader (EOF) and lets it finish by itself.
        sock = getattr(getattr(self._resp, "_connection", None), "sock", None)
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
