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


FreeFormObject = Annotated[
    dict[str, Any],
    WithJsonSchema({"type": "object", "x-kubernetes-preserve-unknown-fields": True}),
]
"""A deliberately free-form object (pod overrides, extra engine config): the API server keeps it as is."""


class ConditionStatus(str, Enum):
    TRUE = "True"
    FALSE = "False"
    UNKNOWN = "Unknown"


class Condition(StatusModel):
    """A standard Kubernetes condition (metav1.Condition shape)."""

    type: str
    """Condition type, e.g. Valid, Profiled, Serving, MetricsAvailable, NodesAvailable."""
    status: ConditionStatus
    """True, False or Unknown."""
    reason: str = Field(min_length=1, max_length=1024)
    """A CamelCase word saying why the condition is in this state."""
    message: str = ""
    """Human-readable details, naming the field and the fix for a configuration error."""
    last_transition_time: datetime | None = None
    """When the status last changed (RFC 3339)."""
    observed_generation: int | None = None
    """The .metadata.generation the condition was computed from."""


class SecretKeyRef(ApiModel):
    """A key of a Secret in the resource's namespace."""

    name: str = Field(min_length=1, max_length=253)
    """Secret name."""
    key: str = Field(default="token", min_length=1)
    """Key within the Secret."""


class ConfigMapKeyRef(ApiModel):
    """A key of a ConfigMap in the resource's namespace."""

    name: str = Field(min_length=1, max_length=253)
    """ConfigMap name."""
    key: str = Field(min_length=1)
    """Key within the ConfigMap."""


def format_validation_error(exc: ValidationError, root: str = "spec") -> str:
    """One line per problem, each naming the field path as the user wrote it (camelCase) and what to do.

    pydantic reports `loc` tuples of aliases when validating by alias; we join them into a JSONPath-like
    path (`spec.gpuPools[1].pricePerGpuHour`) because that is what a user sees in their YAML.
    """
    lines = []
    for err in exc.errors():
        path = root
        for part in err.get("loc", ()):
            if isinstance(part, int):
                path += f"[{part}]"
            elif part:
                path += f".{part}"
        msg = err.get("msg", "invalid")
        msg = msg.removeprefix("Value error, ")
        got = err.get("input")
        shown = "" if err.get("type", "").startswith(("missing", "model_", "value_error")) else f" (got {got!r})"
        if err.get("type") == "extra_forbidden":
            msg, shown = "is not a known field: remove it or check its spelling (kubectl explain shows the fields)", ""
        lines.append(f"{path}: {msg}{shown}")
    return "; ".join(lines)
