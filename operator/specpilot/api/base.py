"""Shared pieces of the API models: the base class, conditions and small value types.

Every model here is the single source of a CRD schema: field docstrings become the
`description` that `kubectl explain` prints, aliases are the camelCase field names.
"""

from __future__ import annotations

from datetime import datetime
from enum import Enum
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, WithJsonSchema

GROUP = "specpilot.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"


def to_camel(snake: str) -> str:
    """snake_case -> camelCase the Kubernetes way (`e2e_latency_ms` -> `e2eLatencyMs`, `tpot_p95_ms` -> `tpotP95Ms`)."""
    head, *rest = snake.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


class ApiModel(BaseModel):
    """Base of every spec/status model: camelCase names, docstrings as descriptions, no unknown fields."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        use_attribute_docstrings=True,
        use_enum_values=True,
    )

    def dump(self) -> dict[str, Any]:
        """The JSON-ready dict as it appears in the Kubernetes object (camelCase, unset fields left out)."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


class StatusModel(ApiModel):
    """Base of status models: tolerant of fields written by a newer operator version."""

    model_config = ConfigDict(extra="ignore")


FREE_FORM_MAX_PROPERTIES = 64
"""Top-level keys a free-form object may have (its size as a whole is bounded by the operator's checks)."""

FreeFormObject = Annotated[
    dict[str, Any],
    Field(max_length=FREE_FORM_MAX_PROPERTIES),
    WithJsonSchema({"type": "object", "x-kubernetes-preserve-unknown-fields": True,
                    "maxProperties": FREE_FORM_MAX_PROPERTIES}),
]
"""A deliberately free-form object (pod overrides, extra engine config): the API server keeps it as is."""

# Bounded strings. Every free string of the CRDs has a maxLength: the API server estimates the cost of
# CEL rules from them, and a spec over ~256 KB breaks kopf's last-handled-configuration annotation.
Name = Annotated[str, Field(min_length=1, max_length=253)]
"""A Kubernetes object name, key or label-sized token."""
ShortText = Annotated[str, Field(max_length=1024)]
"""A reason, a short value, a fingerprint."""
Text = Annotated[str, Field(max_length=32768)]
"""A human-readable message (the metav1.Condition message bound)."""
ImageRef = Annotated[str, Field(min_length=1, max_length=512, pattern=r"^[A-Za-z0-9][A-Za-z0-9._/:@-]*$")]
"""A container image reference (registry/path:tag or @sha256:digest): no spaces, no leading '-'."""

ECHO_LIMIT = 200
"""Characters of a user's value a validation message repeats before it is cut with an ellipsis."""
MESSAGE_PROBLEMS_LIMIT = 20
"""Problems one validation message lists; the rest are counted."""
MESSAGE_LIMIT = 8192
"""Characters of a whole validation message (condition and Event)."""


def echo(value: Any, limit: int = ECHO_LIMIT) -> str:
    """`repr(value)` for a message, cut to `limit` characters with an ellipsis (and the size said): a
    1,000-item list or a megabyte string is never printed whole into a terminal, a condition or an Event."""
    text = repr(value)
    if len(text) <= limit:
        return text
    if isinstance(value, list | tuple | dict | set):
        return f"{text[:limit]}… ({len(value)} items)"
    if isinstance(value, str):
        return f"{text[:limit]}… ({len(value)} characters)"
    return text[:limit] + "…"


def cap(text: str, limit: int = ECHO_LIMIT) -> str:
    """`text` cut to `limit` characters with an ellipsis."""
    return text if len(text) <= limit else text[:limit] + "…"


def join_problems(problems: list[str], total: int | None = None, limit: int = MESSAGE_PROBLEMS_LIMIT) -> str:
    """Problems as one `; `-separated message: at most `limit` of them (the rest of `total` counted), each
    cut to a readable length, the whole within MESSAGE_LIMIT characters."""
    total = len(problems) if total is None else total
    shown = [cap(p, 3 * ECHO_LIMIT) for p in problems[:limit]]
    if total > len(shown):
        shown.append(f"… and {total - len(shown)} more problem(s)")
    return cap("; ".join(shown), MESSAGE_LIMIT)


DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
"""A DNS-1123 subdomain: what names of Secrets, ConfigMaps and PVCs are."""
CONFIG_KEY = r"^[-._a-zA-Z0-9]+$"
"""A key of a Secret or ConfigMap."""


class ConditionStatus(str, Enum):
    TRUE = "True"
    FALSE = "False"
    UNKNOWN = "Unknown"


class Condition(StatusModel):
    """A standard Kubernetes condition (metav1.Condition shape)."""

    type: str = Field(max_length=316)
    """Condition type, e.g. Valid, Profiled, Serving, MetricsAvailable, NodesAvailable."""
    status: ConditionStatus
    """True, False or Unknown."""
    reason: str = Field(min_length=1, max_length=1024)
    """A CamelCase word saying why the condition is in this state."""
    message: str = Field(default="", max_length=32768)
    """Human-readable details, naming the field and the fix for a configuration error."""
    last_transition_time: datetime | None = None
    """When the status last changed (RFC 3339)."""
    observed_generation: int | None = None
    """The .metadata.generation the condition was computed from."""


class SecretKeyRef(ApiModel):
    """A key of a Secret in the resource's namespace."""

    name: str = Field(min_length=1, max_length=253, pattern=DNS_SUBDOMAIN)
    """Secret name. The operator's config lists the Secrets a SpeculativeDeployment may reference
    (tenancy.allowedSecretNames); any other is refused."""
    key: str = Field(default="token", min_length=1, max_length=253, pattern=CONFIG_KEY)
    """Key within the Secret."""


class ConfigMapKeyRef(ApiModel):
    """A key of a ConfigMap in the resource's namespace."""

    name: str = Field(min_length=1, max_length=253, pattern=DNS_SUBDOMAIN)
    """ConfigMap name."""
    key: str = Field(min_length=1, max_length=253, pattern=CONFIG_KEY)
    """Key within the ConfigMap."""


def format_validation_error(exc: ValidationError, root: str = "spec") -> str:
    """One line per problem, each naming the field path as the user wrote it (camelCase) and what to do.

    pydantic reports `loc` tuples of aliases when validating by alias; we join them into a JSONPath-like
    path (`spec.gpuPools[1].pricePerGpuHour`) because that is what a user sees in their YAML.
    """
    lines = []
    errors = exc.errors()
    for err in errors[:MESSAGE_PROBLEMS_LIMIT]:
        path = root
        for part in err.get("loc", ()):
            if isinstance(part, int):
                path += f"[{part}]"
            elif part:
                path += f".{part}"
        msg = err.get("msg", "invalid")
        msg = cap(msg.removeprefix("Value error, "), 2 * ECHO_LIMIT)
        got = err.get("input")
        shown = "" if err.get("type", "").startswith(("missing", "model_", "value_error")) else f" (got {echo(got)})"
        if err.get("type") == "extra_forbidden":
            msg, shown = "is not a known field: remove it or check its spelling (kubectl explain shows the fields)", ""
        lines.append(f"{cap(path)}: {msg}{shown}")
    return join_problems(lines, total=len(errors))
