"""Generate the two CustomResourceDefinitions from the pydantic models.

pydantic emits JSON Schema 2020-12 with `$defs`/`$ref`, `anyOf [X, null]` for optionals, numeric
`exclusiveMinimum` and titles; the API server wants a structural OpenAPI v3.0 schema. `structural()`
does that translation; the CEL rules and free-form markers travel through `json_schema_extra`.
"""

from __future__ import annotations

import copy
from typing import Any

from pydantic import BaseModel

from .base import GROUP, VERSION
from .deployment_spec import SpeculativeDeploymentSpec
from .deployment_status import SpeculativeDeploymentStatus
from .profile import SpeculationProfileSpec, SpeculationProfileStatus

CATEGORY = "specpilot"

_DROP = {"title", "additionalProperties", "$defs", "discriminator"}


def _resolve(node: Any, defs: dict[str, Any]) -> Any:
    if isinstance(node, list):
        return [_resolve(n, defs) for n in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        target = copy.deepcopy(defs[node["$ref"].rsplit("/", 1)[-1]])
        extra = {k: v for k, v in node.items() if k != "$ref"}
        merged = {**target, **extra}
        return _resolve(merged, defs)
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in ("properties",):
            out[key] = {name: _resolve(sub, defs) for name, sub in value.items()}
        elif key == "additionalProperties" and isinstance(value, dict):
            out["__additional__"] = _resolve(value, defs)
        else:
            out[key] = _resolve(value, defs)
    return out


def _structural(node: Any) -> Any:
    if isinstance(node, list):
        return [_structural(n) for n in node]
    if not isinstance(node, dict):
        return node
    if "anyOf" in node:
        branches = [b for b in node["anyOf"] if b.get("type") != "null"]
        rest = {k: v for k, v in node.items() if k != "anyOf"}
        if len(branches) == 1:
            node = {**branches[0], **rest}
        else:
            raise ValueError(f"non-structural union in schema: {node['anyOf']!r}")
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _DROP:
            continue
        if key == "__additional__":
            out["additionalProperties"] = _structural(value)
        elif key == "properties":
            out[key] = {name: _structural(sub) for name, sub in value.items()}
        elif key == "items":
            out[key] = _structural(value)
        elif key == "description":
            # Docstrings wrap at ~110 columns; kubectl explain re-wraps, so keep paragraphs only.
            out[key] = "\n\n".join(" ".join(p.split()) for p in value.split("\n\n"))
        elif key == "default" and value is None:
            continue
        elif key == "exclusiveMinimum":
            out["minimum"] = value
            out["exclusiveMinimum"] = True
        elif key == "exclusiveMaximum":
            out["maximum"] = value
            out["exclusiveMaximum"] = True
        elif key == "format" and value not in ("date-time", "int64", "int32", "double", "float"):
            continue
        else:
            out[key] = _structural(value)
    if "enum" in out and "type" not in out:
        out["type"] = "string"
    if out.get("format") == "date-time":
        out["type"] = "string"
    if out.get("x-kubernetes-preserve-unknown-fields"):
        out.pop("properties", None)
        out.pop("additionalProperties", None)
    if "properties" in out and "type" not in out:
        out["type"] = "object"
    return out


def structural(model: type[BaseModel]) -> dict[str, Any]:
    """The model as a structural OpenAPI v3 schema (refs inlined, optionals flattened, titles dropped)."""
    raw = model.model_json_schema(by_alias=True, mode="validation")
    defs = raw.get("$defs", {})
    return _structural(_resolve(raw, defs))


def _wrap(spec: dict[str, Any], status: dict[str, Any], description: str, spec_rules: list | None = None) -> dict:
    spec = dict(spec)
    if spec_rules:
        spec["x-kubernetes-validations"] = spec.get("x-kubernetes-validations", []) + spec_rules
    return {
        "type": "object",
        "description": description,
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string", "maxLength": 64,
                           "description": "APIVersion of this object: specpilot.io/v1alpha1."},
            "kind": {"type": "string", "maxLength": 64, "description": "Kind of this object."},
            "metadata": {"type": "object"},
            "spec": spec,
            "status": status,
        },
    }


def _crd(plural: str, singular: str, kind: str, short: str, schema: dict, columns: list[dict]) -> dict:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": f"{plural}.{GROUP}",
            "labels": {"app.kubernetes.io/name": "specpilot", "app.kubernetes.io/part-of": "specpilot"},
        },
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "plural": plural,
                "singular": singular,
                "kind": kind,
                "shortNames": [short],
                "categories": [CATEGORY],
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": columns,
                    "schema": {"openAPIV3Schema": schema},
                }
            ],
        },
    }


def speculative_deployment_crd() -> dict[str, Any]:
    schema = _wrap(
        structural(SpeculativeDeploymentSpec),
        structural(SpeculativeDeploymentStatus),
        "SpeculativeDeployment serves one model with vLLM on GPU pools, profiling each candidate "
        "speculative-decoding method per GPU type and serving the best per-batch-size schedule.",
    )
    columns = [
        {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
        {"name": "Progress", "type": "string", "jsonPath": ".status.progress", "priority": 1},
        {"name": "Decision", "type": "string", "jsonPath": ".status.decisionSummary",
         "description": "Per pool: method[schedule]"},
        {"name": "Concurrency", "type": "number", "jsonPath": ".status.observedConcurrency",
         "description": "Observed mean concurrency per replica"},
        {"name": "$/Mtok", "type": "number", "jsonPath": ".status.costPerMtok",
         "description": "Dollars per million output tokens: the fleet's under its placement (two or more pools), "
                        "else the cheapest pool's predicted"},
        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    ]
    return _crd("speculativedeployments", "speculativedeployment", "SpeculativeDeployment", "sdep", schema, columns)


def speculation_profile_crd() -> dict[str, Any]:
    schema = _wrap(
        structural(SpeculationProfileSpec),
        structural(SpeculationProfileStatus),
        "SpeculationProfile is one measurement of a speculative-decoding method (or the no-SD baseline) of a "
        "model on a GPU type, written by specpilot's benchmark Job and reused by every deployment that needs it.",
        spec_rules=[{
            "rule": "self == oldSelf",
            "message": "spec is immutable: a SpeculationProfile is the identity of one measurement; "
                       "create a new profile instead",
        }],
    )
    columns = [
        {"name": "SKU", "type": "string", "jsonPath": ".spec.sku"},
        {"name": "Method", "type": "string", "jsonPath": ".spec.method.method"},
        {"name": "Model", "type": "string", "jsonPath": ".spec.model.id", "priority": 1},
        {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
        {"name": "KV-Tokens", "type": "integer", "jsonPath": ".status.kvCapacityTokens", "priority": 1},
        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    ]
    return _crd("speculationprofiles", "speculationprofile", "SpeculationProfile", "sprof", schema, columns)


def all_crds() -> dict[str, dict[str, Any]]:
    """File name -> CRD object, in the order they are written."""
    return {
        f"{GROUP}_speculativedeployments.yaml": speculative_deployment_crd(),
        f"{GROUP}_speculationprofiles.yaml": speculation_profile_crd(),
    }
