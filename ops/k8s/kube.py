"""The Kubernetes API as gpuwarden uses it: lightkube's config, routes and transport, raw JSON in and out.

Loads the client lazily (in-cluster service account, else KUBECONFIG); counts the calls it makes so the
agent can show its API cost. Every refusal becomes a KubeError naming the verb, the object and the fix.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, Callable, Iterator, NoReturn

from gpuwarden.ops.foundation import extras

from gpuwarden.ops.foundation.errors import GpuwardenError
from gpuwarden.ops.k8s.objects import Lease, Node, Pod, PodList, WatchEvent

if TYPE_CHECKING:
    import httpx2
    from lightkube.config.kubeconfig import KubeConfig
    from lightkube.core.generic_client import BasicRequest, GenericSyncClient

SMP = "application/strategic-merge-patch+json"
MERGE = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
RBAC_HINT = ("grant it in the ClusterRole of deploy/k8s/base/rbac.yaml "
             "(kubectl apply -k deploy/k8s/overlays/amd, or .../nvidia)")
CREDENTIALS_HINT = "run in the DaemonSet (service account), or set KUBECONFIG to a kubeconfig file"
# Where a pod finds its service account (the Kubernetes docs, "Accessing the Kubernetes API from a Pod").
SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
# kubeconfig fields that name a file, resolved against the file that says them (kubectl's rule).
_FILE_FIELDS = {"clusters": ("cluster", ("certificate-authority",)),
                "users": ("user", ("client-certificate", "client-key", "tokenFile"))}


class KubeError(GpuwardenError):
    """The API server refused or could not be reached; `status` is the HTTP code (None: no answer)."""

    def __init__(self, message: str, hint: str | None = None, status: int | None = None, reason: str = ""):
        super().__init__(message, hint)
        self.status = status
        self.reason = reason

    def line(self) -> str:
        """The refusal in one log line, its hint in parentheses."""
        return self.message + (f" ({self.hint})" if self.hint else "")

    def retry_in(self, retry_s: float) -> float:
        """Seconds a reconciler waits before asking again."""
        return retry_s


class Forbidden(KubeError):
    """403: the service account lacks a verb (RBAC)."""

    def retry_in(self, retry_s: float) -> float:
        # Forbidden stays forbidden until someone fixes RBAC: ask again slowly, never in a tight loop.
        return retry_s * 4


class Conflict(KubeError):
    """409: the object changed since it was read (resourceVersion); read it again and retry."""


class TooManyRequests(KubeError):
    """429: for an eviction, a PodDisruptionBudget does not allow it now."""


class NotFoundError(KubeError):
    """404: no such object."""


_BY_STATUS = {403: Forbidden, 409: Conflict, 429: TooManyRequests, 404: NotFoundError}
_HINTS = {403: RBAC_HINT,
          409: "it changed meanwhile; gpuwarden reads it again and retries",
          429: "a PodDisruptionBudget does not allow it now; wait, or relax the budget",
          404: "check the name (this node's: --node-name, [kubernetes] node_name, NODE_NAME)"}


def _load_client() -> None:
    """Import lightkube, or MissingExtra naming the kubernetes extra (and which of lightkube's own dependencies
    is missing, for an install made with --no-deps)."""
    # deferred: optional (the kubernetes extra): only Kubernetes mode pays for it
    extras.require("lightkube.core.generic_client", "Kubernetes mode")


# --- configuration -----------------------------------------------------------------------------------
def connect(kubeconfig: str | None = None, timeout_s: float = 10.0) -> "Kube":
    """A Kube for this pod's service account when in a cluster (KUBERNETES_SERVICE_HOST set and no kubeconfig
    given), else for `kubeconfig`, KUBECONFIG or ~/.kube/config (a list joined by os.pathsep merges as kubectl
    merges it); the current context of that file."""
    _load_client()
    # deferred: optional extra [kubernetes]
    import yaml
    # deferred: optional extra [kubernetes]
    from lightkube.core.exceptions import ConfigError
    try:
        if kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
            config = _in_cluster()
        else:
            config = _from_files(kubeconfig)
        return _connect(config, timeout_s)
    except (ConfigError, OSError, KeyError, TypeError, ValueError, yaml.YAMLError) as exc:
        # KeyError: a context names a cluster or user the file does not define, or a section is missing
        why = f"the kubeconfig lacks {exc}" if isinstance(exc, KeyError) else " ".join(str(exc).split())
        why = why or type(exc).__name__  # one line: a YAML error spans several
        raise GpuwardenError(f"no Kubernetes credentials: {why}", CREDENTIALS_HINT) from None


def connect_config(kubeconfig: Mapping[str, Any], timeout_s: float = 10.0) -> "Kube":
    """A Kube for a kubeconfig given as its parsed document (its current context)."""
    _load_client()
    # deferred: optional extra [kubernetes]
    from lightkube.config.kubeconfig import KubeConfig
    return _connect(KubeConfig.from_dict(dict(kubeconfig)), timeout_s)


def _in_cluster() -> "KubeConfig":
    """The pod's service account: token, CA and namespace files, the API at KUBERNETES_SERVICE_HOST/PORT."""
    # deferred: optional extra [kubernetes]
    from lightkube.config.kubeconfig import KubeConfig
    # deferred: optional extra [kubernetes]
    from lightkube.core.exceptions import ConfigError
    if not os.environ.get("KUBERNETES_SERVICE_PORT"):
        raise ConfigError("KUBERNETES_SERVICE_HOST is set but KUBERNETES_SERVICE_PORT is not")
    for name in ("token", "ca.crt"):
        path = SERVICE_ACCOUNT / name
        if not path.is_file() or path.stat().st_size == 0:
            raise ConfigError(f"{path} is missing or empty (is the service-account token mounted? "
                              "automountServiceAccountToken must not be false)")
    return KubeConfig.from_service_account(SERVICE_ACCOUNT)


def _from_files(kubeconfig: str | None) -> "KubeConfig":
    """One kubeconfig, or several merged: the first file to name a cluster, context or user (or to set
    current-context) wins; files named there that do not exist are skipped (kubectl's loading rules)."""
    # deferred: optional extra [kubernetes]
    from lightkube.config.kubeconfig import KubeConfig
    # deferred: optional extra [kubernetes]
    from lightkube.core.exceptions import ConfigError
    spec = kubeconfig if kubeconfig is not None else (os.environ.get("KUBECONFIG") or "~/.kube/config")
    paths = [Path(p).expanduser() for p in spec.split(os.pathsep) if p]
    found = [p for p in paths if p.is_file()]
    if not found:
        raise ConfigError(f"no kubeconfig file at {spec}")
    if len(found) == 1:
        _parse(found[0])  # a broken file named in one line, before lightkube reads it
        return KubeConfig.from_file(found[0])
    merged: dict[str, Any] = {"clusters": [], "contexts": [], "users": []}
    seen: dict[str, set[str]] = {key: set() for key in merged}
    for path in found:
        doc = _parse(path)
        if not isinstance(doc, dict):
            raise ConfigError(f"{path} is not a kubeconfig (a YAML mapping)")
        merged["current-context"] = merged.get("current-context") or doc.get("current-context") or None
        for key in ("clusters", "contexts", "users"):
            for entry in doc.get(key) or ():
                if isinstance(entry, dict) and str(entry.get("name")) not in seen[key]:
                    seen[key].add(str(entry.get("name")))
                    merged[key].append(_absolute(key, entry, path.parent.resolve()))
    return KubeConfig.from_dict(merged)


def _parse(path: Path) -> Any:
    """A kubeconfig file's YAML document; ConfigError naming the file and the line when it is not YAML."""
    # deferred: optional extra [kubernetes]
    import yaml
    # deferred: optional extra [kubernetes]
    from lightkube.core.exceptions import ConfigError
    try:
        return yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"{path} is not valid YAML{where}: {getattr(exc, 'problem', None) or exc}") from None


def _absolute(key: str, entry: dict[str, Any], base: Path) -> dict[str, Any]:
    """A merged entry's relative file names made absolute against the file it came from."""
    inner, fields = _FILE_FIELDS.get(key, ("", ()))
    body = dict(entry.get(inner) or {}) if inner else {}
    for name in fields:
        if isinstance(body.get(name), str) and body[name] and not Path(body[name]).is_absolute():
            body[name] = str(base / body[name])
    return {**entry, inner: body} if inner else entry


def _connect(config: "KubeConfig", timeout_s: float) -> "Kube":
    # deferred: optional extra [kubernetes]
    import httpx2
    # deferred: optional extra [kubernetes]
    from lightkube.config.client_adapter import ConnectionParams
    # deferred: optional extra [kubernetes]
    from lightkube.config.models import User
    # deferred: optional extra [kubernetes]
    from lightkube.core.exceptions import ConfigError
    # deferred: optional extra [kubernetes]
    from lightkube.core.generic_client import GenericSyncClient
    single = config.get()
    if single is None:
        raise ConfigError("the kubeconfig sets no current-context")
    if single.user is None:
        single = single._replace(user=User())  # a context with no user: no credentials (kubectl proxy)
    # A hung API server must not hold the agent's sampling: every call gets a deadline (the client's default
    # here, and each request below names its own as well).
    client = GenericSyncClient(ConnectionParams(timeout=httpx2.Timeout(timeout_s)), single)
    return Kube(client, host=single.cluster.server, timeout_s=timeout_s)


# --- the calls ---------------------------------------------------------------------------------------
class Kube:
    """The calls the agent and the playbooks make; raw dicts as the API serves them. lightkube's resource
    types give each call its route (group, version, plural, scope, subresource); bodies go and come as the
    API's JSON untouched, so a field newer than lightkube-models survives a read-modify-write."""

    def __init__(self, client: "GenericSyncClient", host: str = "", timeout_s: float = 10.0):
        _load_client()
        # deferred: optional extra [kubernetes]
        from lightkube.resources.coordination_v1 import Lease as LeaseResource
        # deferred: optional extra [kubernetes]
        from lightkube.resources.core_v1 import Event, Node as NodeResource, NodeStatus, Pod as PodResource
        # deferred: optional extra [kubernetes]
        from lightkube.resources.core_v1 import PodEviction
        self.client = client
        self.host = host
        self.timeout_s = timeout_s
        self.calls = 0
        self._node, self._node_status, self._pod = NodeResource, NodeStatus, PodResource
        self._eviction, self._event, self._lease = PodEviction, Event, LeaseResource

    def close(self) -> None:
        self.client.close()  # type: ignore[no-untyped-call]  # lightkube leaves it unannotated

    # ------------------------------------------------------------------------------------------
    def _prepare(self, method: str, res: type, *, name: str | None = None, namespace: str | None = None,
                 body: object = None, params: Mapping[str, str] | None = None, content_type: str | None = None,
                 watch: bool = False) -> "BasicRequest":
        obj = _Body(body) if isinstance(body, Mapping) and method in ("post", "put") else body
        return self.client.prepare_request(method, res, obj=obj, name=name, namespace=namespace, watch=watch,
                                           params=dict(params or {}),
                                           headers={"Content-Type": content_type} if content_type else None)

    def _send(self, what: str, br: "BasicRequest", *, stream: bool = False) -> "httpx2.Response":
        """The response to `br` (2xx), with a deadline; any other answer or none raises KubeError."""
        # deferred: optional extra [kubernetes]
        import httpx2
        # deferred: optional extra [kubernetes]
        from lightkube.core.exceptions import ConfigError
        self.calls += 1
        if br.timeout is None:
            br.timeout = httpx2.Timeout(self.timeout_s)
        try:
            resp: httpx2.Response = self.client.send(self.client.build_adapter_request(br), stream=stream)
        except httpx2.HTTPError as exc:  # refused, timed out, TLS, a torn answer: no word from the API
            cause = str(exc) or type(exc).__name__
            raise KubeError(f"cannot reach the Kubernetes API at {self.host or '?'} to {what}: {cause[:200]}",
                            "check the API server and the node's network; gpuwarden retries") from None
        except (ConfigError, OSError) as exc:  # a token file gone, an exec plugin failing or missing: at request time
            raise KubeError(f"no Kubernetes credentials to {what}: {exc}", CREDENTIALS_HINT) from None
        if 200 <= resp.status_code <= 299:
            return resp
        try:
            if stream:
                resp.read()
            self._raise(what, resp)
        finally:
            resp.close()

    def _call(self, what: str, br: "BasicRequest") -> Any:
        """The JSON the API answered to `br`. Any: the typed methods below say which object each call answers."""
        # deferred: optional extra [kubernetes]
        import msgspec
        data = self._send(what, br).content
        return msgspec.json.decode(data) if data else {}

    def _raise(self, what: str, resp: "httpx2.Response") -> NoReturn:
        """KubeError for a refusal, from the Status body the API answers with (lightkube's ApiError reads it)."""
        # deferred: optional extra [kubernetes]
        from lightkube.core.exceptions import ApiError
        code = resp.status_code
        message, reason = resp.reason_phrase or "", ""
        try:
            status = ApiError(request=resp.request, response=resp).status
            message, reason = status.message or message, status.reason or ""
            # A 429 from an eviction names the PodDisruptionBudget only in its causes.
            causes = [c.message for c in (status.details.causes or ()) if c.message] if status.details else []
            if causes:
                message = f"{message} ({'; '.join(causes)})"
        except (TypeError, ValueError):  # not a Status (a proxy's HTML page): the HTTP reason stands
            pass
        cls = _BY_STATUS.get(code, KubeError)
        raise cls(f"Kubernetes refused to {what} ({code} {reason or resp.reason_phrase}): {message}",
                  _HINTS.get(code), status=code, reason=reason)

    # --- any path (API discovery: which versions a group serves) -----------------------------------------------
    def request(self, what: str, method: str, path: str, *, query: Mapping[str, str] | None = None,
                body: object = None) -> Any:
        """One call to `path` (e.g. /apis/resource.k8s.io) through the client's auth and deadline; the JSON it
        answered. Any: each caller reads the object its path serves."""
        _load_client()
        # deferred: optional extra [kubernetes]
        from lightkube.core.generic_client import BasicRequest
        br = BasicRequest(method=method, url=path.lstrip("/"), params=dict(query or {}), data=body,
                          headers={"Accept": "application/json"})
        return self._call(what, br)

    # --- cluster-scoped objects of a version chosen at run time (resource.k8s.io, authentication.k8s.io) -----
    def cluster_resource(self, api_version: str, kind: str, plural: str) -> type:
        """lightkube's type of a cluster-scoped resource: lightkube-models' when it has that version (1.37.0.8:
        resource.k8s.io v1 and v1beta2 ResourceSlice and DeviceTaintRule, authentication.k8s.io/v1
        TokenReview), else a generic resource of that group, version and plural (a version newer than the models)."""
        # deferred: optional extra [kubernetes]
        from lightkube.core.exceptions import LoadResourceError
        # deferred: optional extra [kubernetes]
        from lightkube.core.resource_registry import resource_registry
        # deferred: optional extra [kubernetes]
        from lightkube.generic_resource import create_global_resource
        try:
            return resource_registry.load(api_version, kind)
        except LoadResourceError:
            group, _, version = api_version.rpartition("/")
            return create_global_resource(group, version, kind, plural)

    def list_cluster(self, what: str, api_version: str, kind: str, plural: str,
                     query: Mapping[str, str] | None = None) -> Any:
        """The list (e.g. ResourceSliceList) the API answers; Any: the caller reads the list its kind serves."""
        return self._call(what, self._prepare("list", self.cluster_resource(api_version, kind, plural), params=query))

    def create_cluster(self, what: str, api_version: str, kind: str, plural: str, body: Mapping[str, object]) -> Any:
        """POST of `body`; the object the API answers (409 Conflict when the name is taken)."""
        return self._call(what, self._prepare("post", self.cluster_resource(api_version, kind, plural), body=body))

    def delete_cluster(self, what: str, api_version: str, kind: str, plural: str, name: str) -> Any:
        """DELETE of one object (404 NotFoundError when it is gone already)."""
        return self._call(what, self._prepare("delete", self.cluster_resource(api_version, kind, plural), name=name))

    # --- nodes ---------------------------------------------------------------------------------
    def node(self, name: str) -> Node:
        node: Node = self._call(f"get node {name}", self._prepare("get", self._node, name=name))
        return node

    def patch_node(self, name: str, body: Mapping[str, object] | Sequence[Mapping[str, object]],
                   content_type: str = SMP) -> Node:
        """A patch of the node: strategic merge (the default), MERGE or JSON_PATCH (a list of operations)."""
        node: Node = self._call(f"patch node {name}", self._prepare("patch", self._node, name=name, body=body,
                                                                    content_type=content_type))
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
        node: Node = self._call(f"patch nodes/status of {name}",
                                self._prepare("patch", self._node_status, name=name, body=body,
                                              content_type=content_type))
        return node

    # --- pods ----------------------------------------------------------------------------------
    def pods_on(self, node: str) -> PodList:
        """PodList of the pods bound to `node` (fieldSelector spec.nodeName)."""
        # deferred: optional extra [kubernetes]
        from lightkube.core.generic_client import ALL_NS
        pods: PodList = self._call(f"list pods on node {node}",
                                   self._prepare("list", self._pod, namespace=ALL_NS,
                                                 params={"fieldSelector": f"spec.nodeName={node}"}))
        return pods

    def watch_pods(self, node: str, resource_version: str, timeout_s: int) -> "WatchStream":
        """A watch of the pods on `node` from `resource_version`; iterate it for (type, object)."""
        # deferred: optional extra [kubernetes]
        import httpx2
        # deferred: optional extra [kubernetes]
        from lightkube.core.generic_client import ALL_NS
        br = self._prepare("list", self._pod, namespace=ALL_NS, watch=True,
                           params={"fieldSelector": f"spec.nodeName={node}", "resourceVersion": resource_version,
                                   "allowWatchBookmarks": "true", "timeoutSeconds": str(int(timeout_s))})
        # The server ends the watch after timeoutSeconds; a read that outlasts that by 15 s is a dead connection.
        br.timeout = httpx2.Timeout(self.timeout_s, read=timeout_s + 15.0)
        return WatchStream(self._send(f"watch pods on node {node}", br, stream=True))

    def pod(self, namespace: str, name: str) -> Pod | None:
        # A list by name, not a get: the agent's role has list/watch on pods and nothing more.
        listed: PodList = self._call(f"list pod {namespace}/{name}",
                                     self._prepare("list", self._pod, namespace=namespace,
                                                   params={"fieldSelector": f"metadata.name={name}"}))
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
        self._call(f"evict pod {namespace}/{name}",
                   self._prepare("post", self._eviction, name=name, namespace=namespace, body=body))

    # --- events --------------------------------------------------------------------------------
    def create_event(self, namespace: str, body: Mapping[str, object]) -> None:
        self._call(f"create an event in {namespace}",
                   self._prepare("post", self._event, namespace=namespace, body=body))

    # --- leases (coordination.k8s.io/v1) ------------------------------------------------------------
    def lease(self, namespace: str, name: str) -> Lease:
        lease: Lease = self._call(f"get lease {namespace}/{name}",
                                  self._prepare("get", self._lease, name=name, namespace=namespace))
        return lease

    def create_lease(self, namespace: str, body: Lease) -> Lease:
        """409 (Conflict) when a lease of that name exists already."""
        lease: Lease = self._call(f"create lease {namespace}/{body['metadata']['name']}",
                                  self._prepare("post", self._lease, namespace=namespace, body=body))
        return lease

    def update_lease(self, namespace: str, body: Lease) -> Lease:
        """PUT with the resourceVersion it was read at: 409 (Conflict) when anyone wrote it since."""
        name = body["metadata"]["name"]
        lease: Lease = self._call(f"update lease {namespace}/{name}",
                                  self._prepare("put", self._lease, name=name, namespace=namespace, body=body))
        return lease


class _Body(dict[str, Any]):
    """A raw body as lightkube's request builder reads it: it looks up `.metadata.namespace` (and `.name`) of
    what it creates or replaces. The JSON sent is the dict itself; nothing is parsed into lightkube's models."""

    @property
    def metadata(self) -> SimpleNamespace:
        meta = self.get("metadata")
        meta = meta if isinstance(meta, Mapping) else {}
        return SimpleNamespace(namespace=meta.get("namespace"), name=meta.get("name"))


class WatchStream:
    """Lines of a watch response as (type, object) pairs; close() ends it from another thread."""

    def __init__(self, resp: "httpx2.Response"):
        self._resp = resp
        self._closed = False

    def __iter__(self) -> Iterator[tuple[str, Pod]]:
        # deferred: optional extra [kubernetes]
        import httpx2
        # deferred: optional extra [kubernetes]
        import msgspec
        try:
            for line in self._resp.iter_lines():
                if line.strip():
                    event: WatchEvent = msgspec.json.decode(line)
                    yield event.get("type", ""), event.get("object") or {}
        except httpx2.HTTPError:
            if not self._closed:
                raise  # a torn stream or a read past its deadline: the caller lists again
        finally:
            self._resp.close()

    def close(self) -> None:
        # Closing the response would wait for the reader; shutting the socket down wakes the reader (EOF)
        # and lets it finish by itself.
        self._closed = True
        stream = self._resp.extensions.get("network_stream")
        sock = stream.get_extra_info("socket") if stream is not None else None
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
