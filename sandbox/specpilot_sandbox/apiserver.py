"""An in-process Kubernetes API for tests and `specpilot demo`: kmock's KubernetesEmulator over HTTP,
taught the API-server behaviours the operator relies on, and the refusals it must meet.

kmock stores objects and serves list/watch/get/create/patch/delete with merge semantics. A real API
server also stamps metadata (uid, creationTimestamp, generation, resourceVersion) and garbage-collects
objects whose owners are gone; kopf and the operator read those, so this subclass adds them. A real API
server also refuses what its schemas do not allow, so this one validates every write (create, replace,
patch, the status subresource's included) as the object it would store: a custom resource against its
CRD's openAPIV3Schema and CEL rules (`api.validate`, what `specpilot validate` runs), a built-in object
against the Kubernetes OpenAPI schema of its kind (kubernetes-validate); an invalid one is refused with 422
Invalid naming each field in `details.causes`, as the API server does (`SchemaValidator`). Errors an update
leaves as they were are let through, as the API server's validation ratcheting does. Unknown fields are
refused (a real server, by default, drops them with a warning: a writer relying on one would lose it).
It serves the built-in resources, specpilot's CRDs and the CRDs of other projects a test or the demo installs
(`SandboxApiServer.install_gateway_api`, `install_inference_extension`: the Gateway API's HTTPRoute and the
Inference Extension's InferencePool, from `crds/`); any other resource answers 404, as a cluster without its CRD.
It does not do RBAC, selectors or conflict detection, but it can record every request it serves as an RBAC
attribute (`SandboxApiServer.record_requests`), so a test can compare what a client really asked for with the
rules a chart grants it.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import datetime
import functools
import importlib.resources
import itertools
import math
import re
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp.web
import attrs
import jsonpatch
import jsonschema
import kmock
import yaml
from kmock._internal import parsing as _parsing
from kmock._internal.dicts import patch_dict
from kmock._internal.k8s import KubernetesObjectConflictError
from referencing import Registry, Resource

from specpilot.api.base import cap
from specpilot.api.crd import all_crds
from specpilot.api.validate import validate_custom_resource
from specpilot.controller.kube import KIND_TO_PLURAL, RESOURCES, resource_path

from . import objectrules

_VERBS = {"get", "list", "watch", "create", "update", "patch", "delete"}

# Built-in resources the operator and the sandbox use, beyond kmock's bundled discovery data.
_EXTRA = {
    "monitoring.coreos.com/v1/podmonitors": ("PodMonitor", "podmonitor", True),
    "monitoring.coreos.com/v1/servicemonitors": ("ServiceMonitor", "servicemonitor", True),
    "kopf.dev/v1/kopfpeerings": ("KopfPeering", "kopfpeering", True),
    "kopf.dev/v1/clusterkopfpeerings": ("ClusterKopfPeering", "clusterkopfpeering", False),
}


def _parse_path_with_namespaces(path: str) -> _parsing.ParsedPath:
    """kmock 0.8 reads `/api/v1/namespaces[/NAME]` as a namespace-scoped path with no resource and fails;
    kopf lists and watches Namespaces there. Parse the Namespace resource itself, defer the rest."""
    parts = path.strip("/").split("/")
    if parts[:2] == ["api", "v1"] and parts[2:3] == ["namespaces"] and len(parts) <= 4:
        return _parsing.ParsedPath("", "v1", "namespaces", None, parts[3] if len(parts) == 4 else None, None)
    return _original_parse_path(path)


_original_parse_path = _parsing.parse_path
_parsing.parse_path = _parse_path_with_namespaces


@dataclasses.dataclass(frozen=True)
class RecordedRequest:
    """One request as the API server's authorizer sees it (verb, API group, resource, subresource,
    namespace, name), with the bearer token that made it (the sandbox's stand-in for a user)."""

    identity: str
    verb: str
    group: str
    resource: str
    """Plural of the resource; for a request outside the resource API (discovery), the URL path."""
    subresource: str | None
    namespace: str | None
    name: str | None

    @property
    def non_resource(self) -> bool:
        """A request to a non-resource URL (/api, /apis/..., /version): discovery, which every
        authenticated user may read (system:discovery)."""
        return self.resource.startswith("/")


def _verb(request: kmock.Request) -> str:
    """The RBAC verb of a request, as the API server derives it from the HTTP method and the URL."""
    method = str(getattr(request.method, "value", request.method) or "GET").upper()
    if method == "GET":
        if request.action == kmock.action.WATCH:
            return "watch"
        return "get" if request.name is not None or not getattr(request.resource, "plural", None) else "list"
    return {"POST": "create", "PATCH": "patch", "PUT": "update", "DELETE": "delete"}.get(method, method.lower())


def _record(request: kmock.Request) -> RecordedRequest:
    auth = (request.headers or {}).get("Authorization") or (request.headers or {}).get("authorization") or ""
    identity = auth.removeprefix("Bearer ").strip() or "anonymous"
    if request.resource is None or not request.resource.plural:
        return RecordedRequest(identity, _verb(request), "", request.url.path, None, None, None)
    return RecordedRequest(identity, _verb(request), request.resource.group or "", request.resource.plural,
                           request.subresource, request.namespace, request.name)


def _forget(log: list, request: kmock.Request) -> None:
    for i in range(len(log) - 1, -1, -1):
        if log[i] is request:
            del log[i]
            return


@dataclasses.dataclass
class Fault:
    """A write the sandbox refuses, as a real API server would for an invalid or oversized body.

    Matches requests to `resource` (plural), optionally one `name`, one `subresource` ("status"; None: the
    object itself; ANY: both), with a verb in `verbs` and, with `field`, a body whose top-level `status` or
    `metadata` carries that field (one particular write, e.g. status.jobName). Answers `code` (422 Invalid, 413
    too large, 500/503) with a Status body, `times` times (None: until removed)."""

    resource: str
    name: str | None = None
    subresource: str | None = "*"
    code: int = 422
    verbs: frozenset[str] = frozenset({"create", "patch", "update"})
    times: int | None = None
    message: str = ""
    field: str | None = None
    hits: int = 0

    ANY = "*"

    def matches(self, request: kmock.Request) -> bool:
        if request.resource is None or request.resource.plural != self.resource:
            return False
        if self.name is not None and (request.name or _body_name(request)) != self.name:
            return False
        if self.subresource != Fault.ANY and request.subresource != self.subresource:
            return False
        if self.field is not None and not _body_has(request, self.field):
            return False
        return _verb(request) in self.verbs and (self.times is None or self.hits < self.times)

    def response(self, request: kmock.Request) -> aiohttp.web.Response:
        self.hits += 1
        reason = {400: "BadRequest", 413: "RequestEntityTooLarge", 422: "Invalid", 503: "ServiceUnavailable"}.get(self.code, "InternalError")
        message = self.message or {
            413: "Request entity too large: limit is 3145728",
            422: f"{self.resource} \"{request.name or ''}\" is invalid: refused by the sandbox's fault injection",
        }.get(self.code, "the sandbox's fault injection")
        return aiohttp.web.json_response({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                                          "message": message, "reason": reason, "code": self.code},
                                         status=self.code)


def _body_has(request: kmock.Request, field: str) -> bool:
    """Whether the request's body sets `field` in its status or metadata."""
    data = request.data if isinstance(request.data, dict) else {}
    return any(isinstance(data.get(part), dict) and field in data[part] for part in ("status", "metadata"))


def _body_name(request: kmock.Request) -> str | None:
    """The name a create request gives its object (its URL has none)."""
    meta = request.data.get("metadata") if isinstance(request.data, dict) else None
    return meta.get("name") if isinstance(meta, dict) else None


def _has_non_finite(value: Any) -> bool:
    if isinstance(value, float):
        return not math.isfinite(value)
    if isinstance(value, dict):
        return any(_has_non_finite(v) for v in value.values())
    if isinstance(value, list):
        return any(_has_non_finite(v) for v in value)
    return False


def _non_finite(request: kmock.Request) -> Fault | None:
    """JSON has no NaN or Infinity: a real API server refuses such a body (400) where kmock's parser took it."""
    if request.resource is None or not _has_non_finite(request.data):
        return None
    return Fault(request.resource.plural, code=400,
                 message="the request body is not valid JSON: invalid character 'N' looking for beginning of value")


UNVALIDATED_HEADER = "X-Sandbox-Unvalidated"
"""A test's write carrying this header is stored without schema validation (`SandboxApiServer.create(...,
validate=False)`): an object the API server stored before its CRD's rules were tightened."""
KUBERNETES_VERSION = "1.34"
"""The Kubernetes release whose OpenAPI schemas built-in objects are validated against (the oldest the project
supports; the field types the operator writes are the same in later ones)."""


@dataclasses.dataclass(frozen=True)
class Cause:
    """One field a write is refused for, as in a Status's `details.causes`."""

    field: str
    message: str
    reason: str = objectrules.INVALID
    """FieldValueInvalid (`message` is the detail after "Invalid value: "), or another reason, whose `message`
    is the whole text after the field ("Required value", "Forbidden: ...")."""

    @property
    def text(self) -> str:
        return f"Invalid value: {self.message}" if self.reason == objectrules.INVALID else self.message


class SchemaValidator:
    """What the API server's schemas say about an object a write would store: custom resources of specpilot's
    CRDs and of those installed since (`add`; schema, structure and CEL rules), and built-in kinds
    kubernetes-validate knows (others, such as a PodMonitor whose CRD the sandbox does not have, pass)."""

    def __init__(self) -> None:
        self.crds: dict[tuple[str, str], dict] = {}
        """(group, plural) -> the CRD its custom resources are validated against."""
        self.status_subresources: frozenset[tuple[str, str]] = frozenset()
        """The custom resources whose status is written through /status only (and only there)."""
        self.unchanged: dict[tuple[tuple[str, str], str], dict] = {}
        """The CRDs with one top-level section left unchecked: what an update that leaves that section as it was
        is judged by (ratcheting makes its errors moot, and it spares validating a spec on each status write)."""
        for crd in all_crds().values():
            self.add(crd)

    def add(self, crd: dict) -> None:
        """Validate the custom resources of `crd` too (a CRD installed while the server runs)."""
        key = (crd["spec"]["group"], crd["spec"]["names"]["plural"])
        self.crds[key] = crd
        if any("status" in (v.get("subresources") or {}) for v in crd["spec"]["versions"]):
            self.status_subresources |= {key}
        for section in ("spec", "status"):
            self.unchanged[key, section] = _without_section(crd, section)

    def causes(self, group: str, plural: str, obj: dict, old: dict | None = None) -> list[Cause]:
        """Why the API server would refuse to store `obj` (an update of `old`), one cause per field; errors `old`
        already had are not counted (ratcheting)."""
        found = self._causes(group, plural, obj, old)
        if old is not None and found:
            before = set(self._causes(group, plural, old, None))
            found = [c for c in found if c not in before]
        return found

    def _causes(self, group: str, plural: str, obj: dict, old: dict | None) -> list[Cause]:
        rules = [Cause(field, text.removeprefix("Invalid value: ") if reason == objectrules.INVALID else text,
                       reason) for field, reason, text in objectrules.object_problems(plural, obj, old is None)]
        return rules + self._schema_causes(group, plural, obj, old)

    def _schema_causes(self, group: str, plural: str, obj: dict, old: dict | None) -> list[Cause]:
        crd = self.crds.get((group, plural))
        if crd is not None:
            same = [s for s in ("spec", "status") if old is not None and s in obj and obj.get(s) == old.get(s)]
            if len(same) == 2:
                return []  # metadata only (finalizers, annotations): the schema says nothing about them
            if same:
                crd = self.unchanged[(group, plural), same[0]]
            return [_cause(p) for p in validate_custom_resource(crd, obj, old)]
        api_version, kind = obj.get("apiVersion"), obj.get("kind")
        validator = _builtin_validator(api_version, kind) if isinstance(api_version, str) and isinstance(
            kind, str) else None
        if validator is None:
            return []
        causes = []
        for error in sorted(validator.iter_errors(obj), key=lambda e: [str(p) for p in e.absolute_path]):
            field = ""
            for part in error.absolute_path:
                field = f"{field}[{part}]" if isinstance(part, int) else f"{field}.{part}" if field else str(part)
            causes.append(Cause(field or "<root>", cap(error.message, 300)))
        return causes


@functools.lru_cache(maxsize=64)
def _builtin_validator(api_version: str, kind: str) -> Any:
    """kubernetes-validate's strict schema of a built-in kind (None: it has none), loaded once: its
    `validate()` reads the whole definitions file again on every call (tens of milliseconds a write)."""
    from kubernetes_validate import utils

    version = [v for v in utils.all_versions() if utils.major_minor(v) <= KUBERNETES_VERSION][-1]
    group_version = re.sub(r"^([^./]*)(?:\.[^/]*)?/", r"\1-", api_version)
    folder = f"kubernetes-json-schema/v{version}-local-strict"
    try:
        schema = utils.schema_contents(f"{folder}/{kind.lower()}-{group_version}.json", version)
    except FileNotFoundError:
        return None
    definitions = utils.schema_contents(f"{folder}/_definitions.json", version)
    registry = Resource.from_contents(definitions) @ (Resource.from_contents(schema) @ Registry())
    return jsonschema.validators.Draft202012Validator(schema, registry=registry)


def _without_section(crd: dict, section: str) -> dict:
    """`crd` whose schema takes any object as `section` (spec or status)."""
    crd = copy.deepcopy(crd)
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    schema["properties"][section] = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
    return crd


_REQUIRED_PROPERTY = re.compile(r"'([^']+)' is a required property")


def _cause(problem: str) -> Cause:
    """`api.validate`'s "field: message" as a Cause; a missing required field is named itself, "Required value",
    as the API server names it (the schema validator names the object that lacks it)."""
    field, sep, message = problem.partition(": ")
    if not sep:
        return Cause("<root>", problem)
    missing = _REQUIRED_PROPERTY.fullmatch(message)
    if missing:
        return Cause(missing[1] if field == "<root>" else f"{field}.{missing[1]}", "Required value",
                     objectrules.REQUIRED)
    return Cause(field, message)


def _invalid(request: kmock.Request, obj: dict, causes: list[Cause]) -> aiohttp.web.Response:
    """The API server's 422 for an object its schemas refuse: a Status with reason Invalid, one cause per field."""
    kind = obj.get("kind") or (request.resource.plural if request.resource else "")
    group = request.resource.group if request.resource is not None else ""
    name = (obj.get("metadata") or {}).get("name") or request.name or ""
    message = f'{kind}{"." + group if group else ""} "{name}" is invalid: ' + ", ".join(
        f"{c.field}: {c.text}" for c in causes[:20])
    return aiohttp.web.json_response({
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message,
        "reason": "Invalid", "code": 422,
        "details": {"name": name, "group": group, "kind": kind,
                    "causes": [{"reason": c.reason, "message": c.text, "field": c.field} for c in causes]},
    }, status=422)


def _status(code: int, reason: str, message: str) -> aiohttp.web.Response:
    return aiohttp.web.json_response({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                                      "message": message, "reason": reason, "code": code}, status=code)


def _keep_own_section(request: kmock.Request, status_subresources: frozenset[tuple[str, str]]) -> None:
    """What the API server ignores of a write to a custom resource with a status subresource: the status
    sent to the object itself (create, replace, patch) and everything but the status sent to /status (its
    spec, its metadata but the resourceVersion a replace is conditional on). The write goes on without it."""
    resource = request.resource
    if resource is None or (resource.group or "", resource.plural) not in status_subresources:
        return
    verb = _verb(request)
    if verb not in ("create", "update", "patch"):
        return
    data = request.data
    on_status = request.subresource == "status"
    if isinstance(data, dict):
        if on_status:
            meta = data.get("metadata") if isinstance(data.get("metadata"), dict) else {}
            for key in [k for k in data if k not in ("status", "apiVersion", "kind")]:
                del data[key]
            if meta.get("resourceVersion") is not None:
                data["metadata"] = {"resourceVersion": meta["resourceVersion"]}
        elif request.subresource is None:
            data.pop("status", None)
    elif isinstance(data, list):
        def own(op: Any) -> bool:
            path = str(op.get("path", "")) if isinstance(op, dict) else ""
            under_status = path == "/status" or path.startswith("/status/")
            if on_status:
                return under_status or path == "/metadata/resourceVersion"
            return not under_status
        data[:] = [op for op in data if own(op)]


ANNOTATIONS_LIMIT = 256 * 1024
"""The API server's limit on the total size of an object's annotations (keys and values)."""


def _now() -> str:
    return datetime.datetime.now(tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@attrs.define(kw_only=True)
class SandboxEmulator(kmock.KubernetesEmulator):
    """KubernetesEmulator + metadata stamping + owner-reference garbage collection."""

    _versions: Any = attrs.field(factory=lambda: itertools.count(1), init=False)
    recorded: list[RecordedRequest] | None = attrs.field(default=None, init=False)
    """Every request served since recording began (None: not recording)."""
    faults: list[Fault] = attrs.field(factory=list, init=False)
    """Writes to refuse (see `SandboxApiServer.refuse`)."""
    schemas: SchemaValidator | None = attrs.field(factory=SchemaValidator, init=False)
    """Validates every write as the API server would (None: store what comes, as kmock does)."""

    async def __call__(self, raw_request: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        # The depth limit goes before kmock parses the body: Python's decoder fails past its recursion limit.
        body = await raw_request.read()
        if body and objectrules.nesting_depth(body) > objectrules.MAX_DEPTH:
            return _status(400, "BadRequest", f"the request body is invalid: json: exceeded max depth of "
                                              f"{objectrules.MAX_DEPTH} (objects and arrays nested deeper)")
        return await super().__call__(raw_request)

    async def _handle(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        if self.recorded is not None:
            self.recorded.append(_record(request))
        if self.schemas is not None:
            _keep_own_section(request, self.schemas.status_subresources)
        # A test's injected fault first, then what the API server refuses on its own.
        fault = next((f for f in self.faults if f.matches(request)), None)
        refusal = fault.response(request) if fault is not None else self._not_served(request)
        if refusal is None:
            fault = self._annotations_too_long(request) or _non_finite(request)
            refusal = fault.response(request) if fault is not None else self._schema_refusal(request)
        if refusal is not None:
            _forget(self._requests, request)
            for payload in self._payloads:
                _forget(payload._requests, request)
            return refusal
        data = request.data if isinstance(request.data, dict) else None
        if request.resource is not None and data is not None:
            meta = data.setdefault("metadata", {}) if request.action == kmock.action.CREATE else data.get("metadata")
            if request.action == kmock.action.CREATE:
                if not meta.get("name") and meta.get("generateName"):
                    # Like the API server (RetryGenerateName, GA in 1.32): a suffix that is taken is drawn
                    # again, so hundreds of kopf Events never collide into a 409.
                    while True:
                        meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
                        key = (request.resource, request.namespace, meta["name"])
                        if key not in self.objects or self.objects[key].deleted:
                            break
                meta.setdefault("uid", str(uuid.uuid4()))
                meta.setdefault("creationTimestamp", _now())
                meta["generation"] = 1
                meta["resourceVersion"] = str(next(self._versions))
            elif request.action == kmock.action.UPDATE and request.name is not None:
                data.setdefault("metadata", {})["resourceVersion"] = str(next(self._versions))
                if "spec" in data and request.subresource != "status":
                    key = (request.resource, request.namespace, request.name)
                    current = self.objects[key] if key in self.objects else None
                    if current is not None and not current.deleted and current.raw.get("spec") != data["spec"]:
                        data["metadata"]["generation"] = int(current.raw.get("metadata", {}).get("generation", 1)) + 1
        try:
            response = await super()._handle(request)
        except jsonpatch.JsonPatchTestFailed as exc:
            # A JSON patch whose `test` of resourceVersion fails is a write conflict: 409, as the API says.
            raise KubernetesObjectConflictError(message=f"the object changed: {exc}") from exc
        finally:
            # kmock keeps every request and finds the reaction for a new one by scanning that log, so a long
            # run slows down quadratically; nothing here asserts on past requests.
            _forget(self._requests, request)
            for payload in self._payloads:
                _forget(payload._requests, request)
        if request.action == kmock.action.DELETE or (
                request.action == kmock.action.UPDATE and self._was_deleted(request)):
            await self._collect_garbage()
        return response

    def _not_served(self, request: kmock.Request) -> aiohttp.web.Response | None:
        """404 for a resource that no built-in API or installed CRD serves, whatever the verb, as the API server
        answers (kmock would store a created object and serve its resource from then on). The operator tells a
        cluster without a CRD (the Gateway API's, the Inference Extension's) by this 404."""
        if request.resource is None or not request.resource.plural or request.resource in self.resources:
            return None  # discovery, or a served resource
        return _status(404, "NotFound", "the server could not find the requested resource")

    def _schema_refusal(self, request: kmock.Request) -> aiohttp.web.Response | None:
        """A 422 for a write whose result the API server's schemas refuse (see `SchemaValidator`): the body of a
        create or replace, a patch applied to the stored object (a status patch too: the object is validated
        whole, as the API server does, with what was already wrong left alone)."""
        if self.schemas is None or request.resource is None or not isinstance(request.data, (dict, list)):
            return None
        if (request.headers or {}).get(UNVALIDATED_HEADER):
            return None
        verb = _verb(request)
        if verb not in ("create", "update", "patch"):
            return None
        old = None
        if verb != "create":
            key = (request.resource, request.namespace, request.name)
            if request.name is None or key not in self.objects or self.objects[key].deleted:
                return None  # kmock answers 404
            old = copy.deepcopy(self.objects[key].raw)
        if verb == "patch":
            try:
                new = dict(patch_dict(copy.deepcopy(old), request.data))
            except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException, TypeError):
                return None  # kmock answers the broken patch itself
        elif isinstance(request.data, dict):
            new = copy.deepcopy(request.data)
        else:
            return None
        if request.subresource == "status" and verb == "update" and old is not None:
            new = {**old, "status": new.get("status")}  # PUT .../status replaces the status only
        causes = self.schemas.causes(request.resource.group or "", request.resource.plural, new, old)
        return _invalid(request, new, causes) if causes else None

    def _annotations_too_long(self, request: kmock.Request) -> Fault | None:
        """A write that would leave the object's annotations over the API server's 256 KiB limit is refused
        with its 422, as a real API server does (kopf keeps its own bookkeeping there)."""
        data = request.data if isinstance(request.data, dict) else None
        meta = (data or {}).get("metadata")
        if request.resource is None or not isinstance(meta, dict) or not isinstance(meta.get("annotations"), dict):
            return None
        annotations: dict = {}
        if request.action == kmock.action.UPDATE and request.name is not None:
            key = (request.resource, request.namespace, request.name)
            if key in self.objects and not self.objects[key].deleted:
                annotations = dict((self.objects[key].raw.get("metadata") or {}).get("annotations") or {})
        for k, v in meta["annotations"].items():
            if v is None:
                annotations.pop(k, None)
            else:
                annotations[k] = v
        size = sum(len(str(k)) + len(str(v)) for k, v in annotations.items())
        if size <= ANNOTATIONS_LIMIT:
            return None
        return Fault(request.resource.plural, code=422, message=(
            f'{request.resource.plural} "{request.name or meta.get("name") or ""}" is invalid: metadata.annotations: '
            f"Too long: must have at most {ANNOTATIONS_LIMIT} bytes"))

    def _was_deleted(self, request: kmock.Request) -> bool:
        """Whether this update released the object's last finalizer, so it is gone now."""
        key = (request.resource, request.namespace, request.name)
        return key in self.objects and self.objects[key].deleted

    def _KubernetesEmulator__get_objs(self, request: kmock.Request, strict: bool) -> list:
        # kmock scans every object for a get/patch/delete of one named object; look its key up instead
        # (lists and watches still scan, as they must). Overrides kmock's name-mangled private method.
        if strict and request.name is not None and request.resource is not None:
            key = (request.resource, request.namespace, request.name)
            return [self.objects[key]] if key in self.objects else []
        return kmock.KubernetesEmulator._KubernetesEmulator__get_objs(self, request, strict)

    async def _serve_watch(self, request: kmock.Request) -> AsyncIterator[Any]:
        """kmock's watch, without its window for lost events: kmock takes the snapshot of existing objects,
        streams it, and only then marks its place in the resource's event bus, so a change made while the
        snapshot was being sent (a watch that kopf starts or restarts while the cluster works) never reached
        that watcher, whose cache then stayed stale until the next change of the object, or the next
        re-list minutes later. Here the place is marked under the lock every write holds, together with the
        snapshot: each change is in the snapshot or in the stream, once."""
        yield b""  # the headers go out: the watch is established even while nothing happens
        bus = self._buses[request.resource]
        async with self._lock:
            marker = await bus.mark()
            events = [{"type": "ADDED", "object": obj.raw}
                      for obj in self._KubernetesEmulator__get_objs(request, strict=False) if not obj.deleted]
        try:
            for event in events:
                yield event
            async for event in bus.stream(since=marker):
                meta = (event.get("object") or {}).get("metadata") or {}
                if self._KubernetesEmulator__check(request, request.resource, meta.get("namespace"),
                                                   meta.get("name"), strict=False):
                    yield event
        finally:
            await bus.unmark(marker)

    async def _collect_garbage(self) -> None:
        """Delete objects whose every owner is gone (background cascading deletion)."""
        while True:
            async with self._lock:
                live = {obj.raw.get("metadata", {}).get("uid") for obj in self.objects.values() if not obj.deleted}
                orphans = []
                for key, obj in self.objects.items():
                    if obj.deleted:
                        continue
                    owners = obj.raw.get("metadata", {}).get("ownerReferences") or []
                    if owners and not any(o.get("uid") in live for o in owners):
                        orphans.append((key, obj))
                for key, obj in orphans:
                    raw = obj.raw
                    obj.delete()
                    await self._buses[key[0]].put({"type": "DELETED", "object": raw})
            if not orphans:
                return


INFERENCE_POOL_CRD = "inference.networking.k8s.io_inferencepools.yaml"
HTTP_ROUTE_CRD = "gateway.networking.k8s.io_httproutes.yaml"


def _api_path(api_version: str, plural: str, namespace: str | None, name: str | None = None,
              subresource: str | None = None) -> str:
    """The URL path of a resource by its apiVersion (`v1` is the core group's, under /api)."""
    parts = [f"/apis/{api_version}" if "/" in api_version else f"/api/{api_version}"]
    parts += ["namespaces", namespace] if namespace else []
    parts += [part for part in (plural, name, subresource) if part]
    return "/".join(parts)


def packaged_crd(file_name: str) -> dict:
    """A CRD of another project that this package ships (`crds/`), for `SandboxApiServer.install_crd`."""
    return yaml.safe_load((importlib.resources.files(__package__) / "crds" / file_name).read_text())


class SandboxApiServer:
    """The emulator served on 127.0.0.1 with specpilot's CRDs installed, plus a kubeconfig pointing at it; other
    projects' CRDs on request (`install_crd`, `install_gateway_api`, `install_inference_extension`)."""

    def __init__(self) -> None:
        self.emulator = SandboxEmulator()
        self.emulator.resources.load_bundled()
        # kmock's discovery data was taken from a cluster with the Gateway API's CRDs installed; they are no part
        # of Kubernetes, so here they are served once installed (install_gateway_api), 404 until then.
        for resource in [r for r in self.emulator.resources if r.group == "gateway.networking.k8s.io"]:
            del self.emulator.resources[resource]
        for resource, (kind, singular, namespaced) in _EXTRA.items():
            self.emulator.resources[resource] = kmock.ResourceInfo(
                kind=kind, singular=singular, namespaced=namespaced, verbs=_VERBS)
        for crd in all_crds().values():
            self._serve(crd)
        self._server: kmock.Server | None = None
        self.url = ""
        self._plurals: dict[str, set] = {}
        """plural -> the emulator's resources (one per API version) its objects were stored under, for `get`."""

    async def __aenter__(self) -> SandboxApiServer:
        await self.emulator.__aenter__()
        self._server = kmock.Server(self.emulator)
        await self._server.__aenter__()
        self.url = str(self._server.url).rstrip("/")
        async with aiohttp.ClientSession() as session:
            for crd in all_crds().values():
                async with session.post(f"{self.url}/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
                                        json=crd) as response:
                    response.raise_for_status()
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._server is not None:
            await self._server.__aexit__(*exc)
        await self.emulator.__aexit__(*exc)

    def _serve(self, crd: dict) -> None:
        """Serve the resource `crd` defines (its first version), as the API server does once a CRD is
        established."""
        spec, names = crd["spec"], crd["spec"]["names"]
        version = spec["versions"][0]
        self.emulator.resources[f"{spec['group']}/{version['name']}/{names['plural']}"] = kmock.ResourceInfo(
            kind=names["kind"], singular=names["singular"], namespaced=spec["scope"] == "Namespaced",
            verbs=_VERBS, shortnames=set(names.get("shortNames") or ()),
            categories=set(names.get("categories") or ()), subresources=set(version.get("subresources") or ()))

    async def install_crd(self, crd: dict) -> None:
        """Install a CRD while the server runs, as `kubectl apply -f` of it would: it is stored under
        customresourcedefinitions (validated as one), then its resource is served and its objects are validated
        against its schema and CEL rules. Until then that resource answers 404. Installing it again changes
        nothing."""
        if self.get("customresourcedefinitions", None, crd["metadata"]["name"]) is None:
            await self._request("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd)
        if self.emulator.schemas is not None:
            self.emulator.schemas.add(crd)
        self._serve(crd)

    async def install_inference_extension(self) -> None:
        """The Gateway API Inference Extension's InferencePool (inference.networking.k8s.io/v1), its CRD in
        `crds/` (see its header for the version it follows)."""
        await self.install_crd(packaged_crd(INFERENCE_POOL_CRD))

    async def install_gateway_api(self) -> None:
        """The Gateway API's HTTPRoute (gateway.networking.k8s.io/v1), a subset of its schema in `crds/` (see
        its header for what it checks)."""
        await self.install_crd(packaged_crd(HTTP_ROUTE_CRD))

    def refuse(self, resource: str, name: str | None = None, *, code: int = 422, subresource: str | None = Fault.ANY,
               times: int | None = None, verbs: frozenset[str] = frozenset({"create", "patch", "update"}),
               message: str = "", field: str | None = None) -> Fault:
        """Refuse writes to `resource` (a plural; one `name`, one `subresource`: "status", None for the object
        itself, Fault.ANY for both; with `field`, only writes that set it in status or metadata) with HTTP
        `code`, `times` times or until `allow(fault)`. Returns the fault, whose `hits` counts the requests it
        refused."""
        fault = Fault(resource, name, subresource, code, frozenset(verbs), times, message, field)
        self.emulator.faults.append(fault)
        return fault

    def allow(self, fault: Fault | None = None) -> None:
        """Stop refusing: one fault, or all of them."""
        self.emulator.faults[:] = [] if fault is None else [f for f in self.emulator.faults if f is not fault]

    async def go_away(self) -> None:
        """Stop listening, as an API server that went down: connections are refused and watches end. The
        objects are kept; `come_back` listens again on the same port."""
        if self._server is not None:
            server, self._server = self._server, None
            runner = server.server.runner
            if runner is not None:
                runner._shutdown_timeout = 0.5  # open watches are cut, not waited for (aiohttp waits 60 s)
            await server.__aexit__(None, None, None)

    async def come_back(self) -> None:
        """Listen again on the port `go_away` closed."""
        if self._server is None:
            port = int(self.url.rsplit(":", 1)[1])
            self._server = kmock.Server(self.emulator, port=port)
            await self._server.__aenter__()

    def record_requests(self) -> list[RecordedRequest]:
        """Start recording every request (including ones that fail); returns the live list."""
        if self.emulator.recorded is None:
            self.emulator.recorded = []
        return self.emulator.recorded

    def write_kubeconfig(self, path: Path, namespace: str = "default", token: str = "sandbox") -> Path:
        path.write_text(yaml.safe_dump({
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "sandbox", "cluster": {"server": self.url}}],
            "users": [{"name": "sandbox", "user": {"token": token}}],
            "contexts": [{"name": "sandbox", "context": {"cluster": "sandbox", "user": "sandbox",
                                                          "namespace": namespace}}],
            "current-context": "sandbox",
        }))
        return path

    async def _request(self, method: str, path: str, body: dict | None = None,
                       headers: dict[str, str] | None = None) -> dict | None:
        async with aiohttp.ClientSession() as session, session.request(method, self.url + path, json=body,
                                                                       headers=headers) as resp:
            if resp.status >= 400:
                raise RuntimeError(f"{method} {path}: HTTP {resp.status}: {await resp.text()}")
            return await resp.json(content_type=None)

    async def create(self, obj: dict, *, validate: bool = True) -> dict:
        """Create an object, as `kubectl create -f` would. `validate=False` stores it even if the schemas refuse
        it: an object stored before its CRD's rules were tightened (an upgrade), which the operator must still
        answer with a condition."""
        headers = None if validate else {UNVALIDATED_HEADER: "true"}
        namespace = obj["metadata"].get("namespace")
        plural = KIND_TO_PLURAL.get(obj["kind"])
        if plural is not None:
            return await self._request("POST", resource_path(plural, namespace), obj, headers)
        # A kind of another project's CRD: its plural as served, or (not installed) the lowercase plural its CRD
        # would have, which answers 404 as the API server does.
        served = next((r.plural for r in self.emulator.resources
                       if self.emulator.resources[r].kind == obj["kind"]), f"{obj['kind'].lower()}s")
        return await self._request("POST", _api_path(obj["apiVersion"], served, namespace), obj, headers)

    async def patch(self, plural: str, namespace: str | None, name: str, patch: dict,
                    subresource: str | None = None, *, validate: bool = True) -> dict:
        """Merge-patch an object (or its status), as `kubectl patch --type merge` would (`validate=False`: as
        `create`'s, what the schemas refuse is stored too)."""
        headers = None if validate else {UNVALIDATED_HEADER: "true"}
        return await self._request("PATCH", self._path(plural, namespace, name, subresource), patch, headers)

    async def delete(self, plural: str, namespace: str | None, name: str) -> None:
        await self._request("DELETE", self._path(plural, namespace, name))

    def _path(self, plural: str, namespace: str | None, name: str | None = None,
              subresource: str | None = None) -> str:
        """The URL path of an object of `plural`: the operator's (`kube.resource_path`), else that of the resource
        of that plural the server serves (an installed CRD's)."""
        if plural in RESOURCES:
            return resource_path(plural, namespace, name, subresource)
        served = next((r for r in self.emulator.resources if r.plural == plural), None)
        if served is None:
            raise KeyError(f"the server serves no resource named {plural}")
        return _api_path(f"{served.group}/{served.version}" if served.group else served.version, plural,
                         namespace, name, subresource)

    def get(self, plural: str, namespace: str | None, name: str) -> dict | None:
        """The live object, or None. Looked up by key under each resource (API version) of that plural seen
        so far, rescanned when that misses: a get costs the same whatever the emulator holds (a scan of every
        object per get made the scale benchmark's N=1,000 quadratic)."""
        if namespace is not None:
            found = self._by_key(plural, namespace, name)
            if found is None:  # maybe under a resource of this plural not seen yet
                self._plurals[plural] = {key[0] for key in list(self.emulator.objects) if key[0].plural == plural}
                found = self._by_key(plural, namespace, name)
            return found
        for obj in self.objects(plural, namespace):
            if obj["metadata"]["name"] == name:
                return obj
        return None

    def _by_key(self, plural: str, namespace: str, name: str) -> dict | None:
        for resource in self._plurals.get(plural, ()):
            key = (resource, namespace, name)
            if key in self.emulator.objects and not self.emulator.objects[key].deleted:
                return self.emulator.objects[key].raw
        return None

    def objects(self, plural: str, namespace: str | None = None) -> list[dict]:
        """Live objects of a resource (by plural), for assertions and the sandbox's kubelet."""
        out = []
        for (resource, ns, _name), obj in list(self.emulator.objects.items()):
            if resource.plural == plural and not obj.deleted and (namespace is None or ns == namespace):
                out.append(obj.raw)
        return out

    async def wait_for(self, predicate, timeout_s: float = 30.0, interval_s: float = 0.1, what: str = "condition"):
        """Poll until predicate() returns something truthy; raise with `what` after the timeout."""
        deadline = asyncio.get_running_loop().time() + timeout_s
        while True:
            value = predicate()
            if value:
                return value
            if asyncio.get_running_loop().time() > deadline:
                raise TimeoutError(f"timed out after {timeout_s:.0f}s waiting for {what}")
            await asyncio.sleep(interval_s)
