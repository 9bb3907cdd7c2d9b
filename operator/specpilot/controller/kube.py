"""The operator's Kubernetes I/O edge: a small async REST client speaking plain JSON dicts.

One `Connection` (connection.py: a kubeconfig's context, or the pod's service account) serves both kopf's
login and our own calls, so the operator runs unchanged against any API server a kubeconfig names. Requests
go out on aiohttp in kopf's event loop, at most API_CONCURRENCY at once: no thread per request and no official
client (whose generated models alone are about 20 MiB of the operator's memory).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import aiohttp
import kopf

from .connection import Connection, ConfigError  # noqa: F401 (re-exported: the CLI and tests load it here)
from ..api.sanitize import sanitize

CORE = ("", "v1")

# plural -> (group, version, namespaced)
RESOURCES: dict[str, tuple[str, str, bool]] = {
    "speculativedeployments": ("specpilot.io", "v1alpha1", True),
    "speculationprofiles": ("specpilot.io", "v1alpha1", True),
    "deployments": ("apps", "v1", True),
    "replicasets": ("apps", "v1", True),
    "jobs": ("batch", "v1", True),
    "services": ("", "v1", True),
    "pods": ("", "v1", True),
    "serviceaccounts": ("", "v1", True),
    "events": ("", "v1", True),
    "nodes": ("", "v1", False),
    "namespaces": ("", "v1", False),
    "roles": ("rbac.authorization.k8s.io", "v1", True),
    "rolebindings": ("rbac.authorization.k8s.io", "v1", True),
    "clusterroles": ("rbac.authorization.k8s.io", "v1", False),
    "podmonitors": ("monitoring.coreos.com", "v1", True),
    "httproutes": ("gateway.networking.k8s.io", "v1", True),
    "inferencepools": ("inference.networking.k8s.io", "v1", True),
    "customresourcedefinitions": ("apiextensions.k8s.io", "v1", False),
}
KIND_TO_PLURAL = {
    "SpeculativeDeployment": "speculativedeployments", "SpeculationProfile": "speculationprofiles",
    "Deployment": "deployments", "ReplicaSet": "replicasets", "Job": "jobs", "Service": "services", "Pod": "pods",
    "ServiceAccount": "serviceaccounts", "Event": "events", "Node": "nodes", "Role": "roles",
    "RoleBinding": "rolebindings", "PodMonitor": "podmonitors", "Namespace": "namespaces",
    "ClusterRole": "clusterroles", "HTTPRoute": "httproutes",
    "InferencePool": "inferencepools",
}

FIELD_MANAGER = "specpilot"
API_CONCURRENCY = 32
"""Requests the operator keeps in flight to the API server at once (its connection pool): a hundred deployments
created together do not queue behind each other for seconds, and a slow API server is not sent a flood."""
REQUEST_TIMEOUT_S = 30.0
APPLY_RESYNC_S = 300.0
"""An object applied with the same body less than this long ago, whose live state was not read, is not applied
again (a Service: its spec only changes with the deployment's): no request, no watch event for every watcher of
it. Past this age it is read back (one get) and applied again only when it no longer holds what was applied: a
hand edit or a deletion is repaired, and a steady cluster sees no write (a blind re-apply would write for every
deployment whose resync fell due)."""
MAX_APPLIED_REMEMBERED = 20_000
"""Digests of applied bodies kept (about 100 bytes each); the oldest go first."""
_UNKNOWN: Any = object()


def kopf_connection_info(connection: Connection) -> kopf.ConnectionInfo:
    """kopf's login from the same Connection our own calls use."""
    return kopf.ConnectionInfo(
        server=connection.server, ca_path=connection.ca_path,
        ca_data=connection.ca_data.encode() if connection.ca_data else None, insecure=connection.insecure,
        username=connection.username, password=connection.password, token=connection.bearer(),
        certificate_path=connection.cert_path,
        certificate_data=connection.cert_data.encode() if connection.cert_data else None,
        private_key_path=connection.key_path,
        private_key_data=connection.key_data.encode() if connection.key_data else None,
        default_namespace=connection.default_namespace, proxy_url=connection.proxy)


def contains(live: Any, wanted: Any) -> bool:
    """Whether `live` (an object as the API server returns it) holds every field `wanted` sets, with the same
    value. The server's own additions (defaults, status, managedFields) are allowed; a list must have the same
    length and hold each wanted element in order. Conservative: a value the server normalises (a quantity
    written another way) reads as different, and the caller then applies, as it would have anyway."""
    if isinstance(wanted, dict):
        if not isinstance(live, dict):
            return False
        return all(value is None or (key in live and contains(live[key], value)) for key, value in wanted.items())
    if isinstance(wanted, list):
        return isinstance(live, list) and len(live) == len(wanted) and all(map(contains, live, wanted))
    if isinstance(wanted, bool) or isinstance(live, bool):
        return type(wanted) is type(live) and wanted == live
    return live == wanted


def digest(obj: Any) -> str:
    """A stable digest of a JSON body (key order does not matter)."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:32]


def request_verb(method: str, content_type: str, name_given: bool) -> str:
    """The Kubernetes audit verb of a request: what a per-verb request count reports."""
    if method == "GET":
        return "get" if name_given else "list"
    if method == "POST":
        return "create"
    if method == "DELETE":
        return "delete"
    if method == "PATCH":
        return "apply" if content_type == "application/apply-patch+yaml" else "patch"
    return method.lower()


class NotFound(Exception):
    """The object or resource does not exist."""


class Conflict(Exception):
    """The object already exists or changed under us."""


class Unreachable(kopf.TemporaryError):
    """No answer from the API server (connection refused or reset, a timeout)."""


UNREACHABLE_ERRORS = frozenset({
    "ClientConnectorError", "ClientConnectorDNSError", "ClientOSError", "ServerDisconnectedError",
    "ServerTimeoutError", "ConnectionTimeoutError", "SocketTimeoutError", "TimeoutError", "ConnectionRefusedError",
    "ConnectionResetError"})
"""Names of the errors (aiohttp's and the OS's) that mean no answer came from the API server. A TLS error is not
among them: the server answered, with a certificate the kubeconfig does not trust (kopf logs it as it is)."""


def is_unreachable(exc: BaseException | None) -> bool:
    """Whether `exc` says the API server could not be reached (not that it answered with an error)."""
    if isinstance(exc, (aiohttp.ClientSSLError, aiohttp.ClientResponseError)):
        return False
    return isinstance(exc, (Unreachable, aiohttp.ClientConnectionError, asyncio.TimeoutError, ConnectionError))


def unreachable_cause(text: str) -> str:
    """Why the API server could not be reached, in a few words, from an error's repr (with its cause's): aiohttp's
    own is a ConnectionKey with eight fields before the reason."""
    causes = (
        (("ConnectionRefusedError", "Errno 111", "Errno 61"), "connection refused"),
        (("ClientConnectorDNSError", "gaierror", "Name or service not known", "nodename nor servname",
          "Temporary failure in name resolution"), "its host name does not resolve"),
        (("No route to host", "Errno 113"), "no route to host"),
        (("Network is unreachable", "Errno 101"), "network unreachable"),
        (("ConnectionResetError", "Connection reset"), "connection reset"),
        (("ServerDisconnectedError",), "it closed the connection"),
        (("Timeout", "timed out"), "timed out"),
        (("Certificate", "CERTIFICATE", "SSL"), "TLS failed: check the kubeconfig's certificate-authority"),
    )
    for needles, cause in causes:
        if any(needle in text for needle in needles):
            return cause
    return "no connection"


class Refused(Exception):
    """The API server answered a request with a client error other than 404/409 (a 422 for a value the
    schema or a webhook refuses, a 413 for a body too large, a 403 for a missing permission): retrying the
    same request cannot succeed until the object or the cluster changes."""

    def __init__(self, status: int, method: str, path: str, detail: str) -> None:
        super().__init__(f"{method} {path}: HTTP {status}: {detail}")
        self.status, self.method, self.path, self.detail = status, method, path, detail
        self.reason = f"{method} {path}: HTTP {status}: {detail}"
        self.name: str | None = None
        """The object's name when the path does not hold it (a create)."""

    @property
    def target(self) -> str:
        """The object the request was about, as `resource namespace/name` (or the path)."""
        parts = self.path.strip("/").split("/")
        if self.name and self.method == "POST":
            parts.append(self.name)
        sub = ""
        if parts and parts[-1] in ("status", "scale"):
            sub, parts = f" ({parts[-1]})", parts[:-1]
        if "namespaces" in parts and len(parts) >= parts.index("namespaces") + 4:
            i = parts.index("namespaces")
            return f"{parts[i + 2]} {parts[i + 1]}/{parts[i + 3]}{sub}"
        return self.path


def _api_message(text: Any) -> str:
    """The `message` of the API server's Status answer (its own words: which field, which limit), cut short."""
    try:
        data = json.loads(text)
        message = data.get("message") if isinstance(data, dict) else None
    except (TypeError, ValueError):
        message = None
    return str(message or "no message")[:400]


def resource_path(plural: str, namespace: str | None, name: str | None = None, subresource: str | None = None) -> str:
    group, version, namespaced = RESOURCES[plural]
    base = f"/api/{version}" if not group else f"/apis/{group}/{version}"
    if namespaced and namespace:
        base += f"/namespaces/{namespace}"
    base += f"/{plural}"
    if name:
        base += f"/{name}"
    if subresource:
        base += f"/{subresource}"
    return base


class Kube:
    """Async JSON-in, JSON-out access to the resources specpilot touches."""

    def __init__(self, connection: Connection, on_request: Callable[[str, str], None] | None = None) -> None:
        self._connection = connection
        self._http: aiohttp.ClientSession | None = None
        """Made at the first request, in the event loop that sends them all (kopf's)."""
        self._on_request = on_request
        """Called with (verb, resource) for each request sent: the operator's per-verb request counter."""
        self._applied: OrderedDict[tuple[str, str | None, str], tuple[str, float]] = OrderedDict()
        """(resource, namespace, name) -> digest of the body last applied, and when (monotonic seconds)."""

    def _session(self) -> aiohttp.ClientSession:
        if self._http is None or self._http.closed:
            connector = aiohttp.TCPConnector(limit=API_CONCURRENCY, ssl=self._connection.ssl_context())
            self._http = aiohttp.ClientSession(connector=connector,
                                               timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S))
        return self._http

    async def _call(self, method: str, path: str, body: Any = None, content_type: str = "application/json",
                    query: list[tuple[str, Any]] | None = None, resource: str = "", name_given: bool = False) -> Any:
        if self._on_request is not None:
            self._on_request(request_verb(method, content_type, name_given), resource)
        headers = {"Content-Type": content_type, "Accept": "application/json", **self._connection.headers()}
        extra: dict[str, Any] = {}
        if self._connection.tls_server_name:
            extra["server_hostname"] = self._connection.tls_server_name
        try:
            async with self._session().request(
                    method, self._connection.server + path, params=[(k, str(v)) for k, v in query or []],
                    data=None if body is None else json.dumps(body, separators=(",", ":")), headers=headers,
                    proxy=self._connection.proxy, **extra) as response:
                status, text = response.status, await response.read()
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
            cause = unreachable_cause(f"{exc!r} {exc.__cause__!r}")
            raise Unreachable(f"cannot reach the Kubernetes API server at {self._connection.server} ({cause}) on "
                              f"{method} {path}", delay=5) from exc
        if status == 404:
            raise NotFound(f"{method} {path}: not found")
        if status == 409:
            raise Conflict(f"{method} {path}: conflict")
        if status in (429, 500, 502, 503, 504):
            raise kopf.TemporaryError(f"API server {status} on {method} {path}", delay=5)
        if status >= 400:
            raise Refused(status, method, path, _api_message(text))
        return json.loads(text) if text else None

    async def get(self, plural: str, namespace: str | None, name: str) -> dict:
        return await self._call("GET", resource_path(plural, namespace, name), resource=plural, name_given=True)

    async def list(self, plural: str, namespace: str | None = None, label_selector: str | None = None) -> list[dict]:
        query = [("labelSelector", label_selector)] if label_selector else None
        result = await self._call("GET", resource_path(plural, namespace), query=query, resource=plural)
        items = (result or {}).get("items", [])
        if label_selector:
            # Some API servers (the emulator among them) ignore selectors: filter here as well.
            wanted = dict(part.split("=", 1) for part in label_selector.split(","))
            items = [i for i in items if all((i.get("metadata", {}).get("labels") or {}).get(k) == v
                                             for k, v in wanted.items())]
        return items

    async def create(self, obj: dict) -> dict:
        plural = KIND_TO_PLURAL[obj["kind"]]
        try:
            return await self._call("POST", resource_path(plural, obj["metadata"].get("namespace")), body=obj,
                                    resource=plural)
        except Refused as exc:
            exc.name = obj["metadata"].get("name") or obj["metadata"].get("generateName")
            raise

    async def patch(self, plural: str, namespace: str | None, name: str, patch: dict,
                    subresource: str | None = None) -> dict:
        if subresource == "status" and isinstance(patch.get("status"), dict):
            # Every status the operator writes (deployments' and profiles'): no NaN/Inf, bounded sizes.
            patch = {**patch, "status": sanitize(patch["status"])}
        return await self._call("PATCH", resource_path(plural, namespace, name, subresource), body=patch,
                                content_type="application/merge-patch+json",
                                resource=f"{plural}/{subresource}" if subresource else plural, name_given=True)

    async def apply(self, obj: dict, current: dict | None = _UNKNOWN) -> dict | None:
        """Server-side apply as field manager `specpilot`, forcing ownership of the fields we set.

        Fields we set are put back after a hand edit; fields we do not set (e.g. an annotation an
        admission webhook or a person added) are left alone.

        A no-op apply is not sent. With `current` (the live object the caller just read, None if absent) it is
        skipped when the body is the one this process last applied and the live object still holds every field
        of it (so a hand edit of a field we set is put back at the next reconciliation); the live object is
        returned. Without `current` it is skipped when the same body was applied less than APPLY_RESYNC_S ago,
        and None is returned; past that the live object is read, and the apply is skipped (the live object
        returned) when it still holds every field of the body. A process that has not applied the object yet
        always applies it once.
        """
        plural = KIND_TO_PLURAL[obj["kind"]]
        meta = obj["metadata"]
        key = (plural, meta.get("namespace"), meta["name"])
        body_digest = digest(obj)
        last = self._applied.get(key)
        if last is not None and last[0] == body_digest:
            if current is _UNKNOWN:
                if time.monotonic() - last[1] < APPLY_RESYNC_S:
                    return None
                try:
                    current = await self.get(plural, meta.get("namespace"), meta["name"])
                except Exception:  # gone, or not readable (a ClusterRole from before the read-back): apply
                    current = None
                if current is not None and contains(current, obj):
                    self._applied[key] = (body_digest, time.monotonic())
                    self._applied.move_to_end(key)
                    return current
            elif current is not None and contains(current, obj):
                return current
        path = resource_path(*key)
        query = [("fieldManager", FIELD_MANAGER), ("force", "true")]
        try:
            result = await self._call("PATCH", path, body=obj, content_type="application/apply-patch+yaml",
                                      query=query, resource=plural, name_given=True)
        except NotFound:
            # A real API server creates on apply; API servers without server-side apply (the sandbox) do not.
            result = await self.create(obj)
        except BaseException:
            self._applied.pop(key, None)
            raise
        self._applied[key] = (body_digest, time.monotonic())
        self._applied.move_to_end(key)
        while len(self._applied) > MAX_APPLIED_REMEMBERED:
            self._applied.popitem(last=False)
        return result

    async def ensure(self, obj: dict) -> tuple[dict, bool]:
        """Create the object if it is absent; return it and whether it was created."""
        try:
            return await self.create(obj), True
        except Conflict:
            meta = obj["metadata"]
            return await self.get(KIND_TO_PLURAL[obj["kind"]], meta.get("namespace"), meta["name"]), False

    async def delete(self, plural: str, namespace: str | None, name: str) -> None:
        self._applied.pop((plural, namespace, name), None)
        try:
            await self._call("DELETE", resource_path(plural, namespace, name),
                             body={"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Background"},
                             resource=plural, name_given=True)
        except NotFound:
            pass

    async def close(self) -> None:
        if self._http is not None:
            await self._http.close()
            self._http = None
