"""What a real API server refuses beyond the OpenAPI schemas: the rules its Go validation code enforces on names,
containers, volumes and mounts (k8s.io/kubernetes/pkg/apis/core/validation, apimachinery's name validators), so
the sandbox refuses what a cluster would (a write the operator makes that a cluster refuses fails here first).

Pure functions of an object as it would be stored: each returns `(field, reason, text)` triples in the API
server's words (`metadata.name: Invalid value: "Bad_Name": a lowercase RFC 1123 subdomain must consist of...`).
"""

from __future__ import annotations

import posixpath
import re
from typing import Any

DNS1123_LABEL_MAX = 63
DNS1123_SUBDOMAIN_MAX = 253
_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_DNS1035 = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
LABEL_MESSAGE = ("a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must "
                 "start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for "
                 "validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')")
SUBDOMAIN_MESSAGE = ("a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', "
                     "and must start and end with an alphanumeric character (e.g. 'example.com', regex used for "
                     "validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')")
DNS1035_MESSAGE = ("a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an "
                   "alphabetic character, and end with an alphanumeric character (e.g. 'my-name',  or 'abc-123', "
                   "regex used for validation is '[a-z]([-a-z0-9]*[a-z0-9])?')")

INVALID, REQUIRED, FORBIDDEN, NOT_FOUND, NOT_SUPPORTED = (
    "FieldValueInvalid", "FieldValueRequired", "FieldValueForbidden", "FieldValueNotFound", "FieldValueNotSupported")

Problem = tuple[str, str, str]
"""(field, reason, text as the API server words it after the field: `Invalid value: "x": ...`)."""

RBAC_PLURALS = frozenset({"roles", "clusterroles", "rolebindings", "clusterrolebindings"})
"""RBAC objects are named by path segment rules (`system:controller:x` is a valid Role name)."""
LABEL_NAMED = frozenset({"namespaces"})
DNS1035_NAMED = frozenset({"services"})
POD_SPEC_PATHS: dict[str, tuple[str, ...]] = {
    "pods": ("spec",),
    "podtemplates": ("template", "spec"),
    "jobs": ("spec", "template", "spec"),
    "deployments": ("spec", "template", "spec"),
    "replicasets": ("spec", "template", "spec"),
    "statefulsets": ("spec", "template", "spec"),
    "daemonsets": ("spec", "template", "spec"),
    "replicationcontrollers": ("spec", "template", "spec"),
    "cronjobs": ("spec", "jobTemplate", "spec", "template", "spec"),
}
"""Where a kind keeps its pod spec (the API server validates a template's containers as a pod's)."""
MOUNT_PROPAGATIONS = ("Bidirectional", "HostToContainer", "None")


def _invalid(field: str, value: str, detail: str) -> Problem:
    return field, INVALID, f"Invalid value: {_quoted(value)}: {detail}"


def _quoted(value: str) -> str:
    escaped = value.replace("\\", "\\\\").replace('"', '\\"')
    return f'"{escaped}"'


def _name(value: str, field: str, max_length: int, pattern: re.Pattern, message: str) -> list[Problem]:
    out = []
    if len(value) > max_length:
        out.append(_invalid(field, value, f"must be no more than {max_length} characters"))
    if not pattern.fullmatch(value):
        out.append(_invalid(field, value, message))
    return out


def dns1123_label(value: str, field: str) -> list[Problem]:
    return _name(value, field, DNS1123_LABEL_MAX, _LABEL, LABEL_MESSAGE)


def dns1123_subdomain(value: str, field: str) -> list[Problem]:
    return _name(value, field, DNS1123_SUBDOMAIN_MAX, _SUBDOMAIN, SUBDOMAIN_MESSAGE)


def dns1035_label(value: str, field: str) -> list[Problem]:
    return _name(value, field, DNS1123_LABEL_MAX, _DNS1035, DNS1035_MESSAGE)


def path_segment_name(value: str, field: str) -> list[Problem]:
    if value in (".", ".."):
        return [_invalid(field, value, f"may not be '{value}'")]
    return [_invalid(field, value, f"may not contain '{c}'") for c in ("/", "%") if c in value]


def name_problems(plural: str, meta: dict[str, Any]) -> list[Problem]:
    """Why an object's name (or, when it has none, its generateName) is not one its kind allows."""
    check = (path_segment_name if plural in RBAC_PLURALS else dns1123_label if plural in LABEL_NAMED
             else dns1035_label if plural in DNS1035_NAMED else dns1123_subdomain)
    name, prefix = meta.get("name"), meta.get("generateName")
    out: list[Problem] = []
    if isinstance(prefix, str) and prefix:
        # a prefix may end in '-' (the API server masks one before checking)
        masked = prefix[:-1] + "a" if prefix.endswith("-") else prefix
        out += [(f, r, t.replace(_quoted(masked), _quoted(prefix), 1))
                for f, r, t in check(masked, "metadata.generateName")]
    if isinstance(name, str) and name:
        out += check(name, "metadata.name")
    elif not prefix:
        out.append(("metadata.name", REQUIRED, "Required value: name or generateName is required"))
    return out


def _descending_path(value: str, field: str) -> list[Problem]:
    out = []
    if posixpath.isabs(value):
        out.append(_invalid(field, value, "must be a relative path"))
    if ".." in value.replace("\\", "/").split("/"):
        out.append(_invalid(field, value, "must not contain '..'"))
    return out


def pod_spec_problems(spec: dict[str, Any], at: str) -> list[Problem]:
    """Why a pod spec (at `at`) is one the API server refuses: volume names not DNS-1123 labels, containers
    without a name that is one or without an image, mounts of volumes the pod lacks, a subPath that is absolute
    or climbs out with '..', Bidirectional mount propagation in a container that is not privileged."""
    out: list[Problem] = []
    volumes = spec.get("volumes") if isinstance(spec.get("volumes"), list) else []
    names = set()
    for i, volume in enumerate(volumes):
        if not isinstance(volume, dict):
            continue
        name = volume.get("name")
        if not name:
            out.append((f"{at}.volumes[{i}].name", REQUIRED, "Required value"))
            continue
        out += dns1123_label(str(name), f"{at}.volumes[{i}].name")
        names.add(name)
    for field in ("initContainers", "containers"):
        containers = spec.get(field) if isinstance(spec.get(field), list) else []
        for i, container in enumerate(containers):
            if isinstance(container, dict):
                out += _container_problems(container, f"{at}.{field}[{i}]", names)
    return out


def _container_problems(container: dict[str, Any], at: str, volumes: set[str]) -> list[Problem]:
    out: list[Problem] = []
    name = container.get("name")
    if not name:
        out.append((f"{at}.name", REQUIRED, "Required value"))
    else:
        out += dns1123_label(str(name), f"{at}.name")
    if not container.get("image"):
        out.append((f"{at}.image", REQUIRED, "Required value"))
    privileged = bool((container.get("securityContext") or {}).get("privileged"))
    mounts = container.get("volumeMounts") if isinstance(container.get("volumeMounts"), list) else []
    for j, mount in enumerate(mounts):
        if not isinstance(mount, dict):
            continue
        where = f"{at}.volumeMounts[{j}]"
        if mount.get("name") and mount["name"] not in volumes:
            out.append((f"{where}.name", NOT_FOUND, f"Not found: {_quoted(str(mount['name']))}"))
        for field in ("subPath", "subPathExpr"):
            if mount.get(field):
                out += _descending_path(str(mount[field]), f"{where}.{field}")
        if mount.get("subPath") and mount.get("subPathExpr"):
            out.append((f"{where}.subPathExpr", INVALID,
                        f"Invalid value: {_quoted(str(mount['subPathExpr']))}: subPathExpr and subPath are mutually "
                        f"exclusive"))
        propagation = mount.get("mountPropagation")
        if propagation is None:
            continue
        if propagation not in MOUNT_PROPAGATIONS:
            supported = ", ".join(_quoted(p) for p in MOUNT_PROPAGATIONS)
            out.append((f"{where}.mountPropagation", NOT_SUPPORTED,
                        f"Unsupported value: {_quoted(str(propagation))}: supported values: {supported}"))
        elif propagation == "Bidirectional" and not privileged:
            out.append((f"{where}.mountPropagation", FORBIDDEN,
                        "Forbidden: Bidirectional mount propagation is available only to privileged containers"))
    return out


def object_problems(plural: str, obj: dict[str, Any], created: bool) -> list[Problem]:
    """Why the API server refuses to store `obj` (a `plural`) beyond its schema: its name at create (a name
    never changes afterwards), the pod spec of a kind that has one."""
    out: list[Problem] = []
    meta = obj.get("metadata")
    if created and isinstance(meta, dict):
        out += name_problems(plural, meta)
    path = POD_SPEC_PATHS.get(plural)
    if path is not None:
        node: Any = obj
        for key in path:
            node = node.get(key) if isinstance(node, dict) else None
        if isinstance(node, dict):
            out += pod_spec_problems(node, ".".join(path))
    return out


MAX_DEPTH = 100
"""How deeply a request body may nest (objects and arrays). A real API server refuses a body past its decoder's
depth limit as a bad request; the sandbox's limit is lower, as Python's recursion (validation, deep copies) is,
and far above any object the project writes (a pod spec nests about 15 deep)."""
_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
_BRACKETS = re.compile(rb"[\[\]{}]")


def nesting_depth(body: bytes) -> int:
    """How deeply a JSON text nests (brackets outside strings), counted without recursion."""
    depth = deepest = 0
    for match in _BRACKETS.finditer(_STRING.sub(b'""', body)):
        if match.group() in (b"{", b"["):
            depth += 1
            deepest = max(deepest, depth)
        else:
            depth -= 1
    return deepest
