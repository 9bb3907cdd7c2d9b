"""Every field does what its docstring says, or it is removed: each field of the SpeculativeDeployment and
SpeculationProfile specs and of the operator config must be read by code outside the modules that define
the models. Read means the attribute accessed (`.field_name`) or, for objects that travel as dicts (profiles
from the watch), the camelCase key in quotes. A grep, so a name that another model also uses may hide a dead
field; the exceptions below are few and say why."""

from __future__ import annotations

import re
import typing
from functools import cache
from pathlib import Path

import pytest
from pydantic import BaseModel

from specpilot.api.base import to_camel
from specpilot.api.deployment_spec import SpeculativeDeploymentSpec
from specpilot.api.profile import SpeculationProfileSpec
from specpilot.config import OperatorConfig

ROOT = Path(__file__).resolve().parents[2]
SOURCES = [ROOT / "operator" / "specpilot", ROOT / "benchmark-job"]
DEFINITIONS = {"operator/specpilot/api/deployment.py", "operator/specpilot/api/deployment_spec.py",
               "operator/specpilot/api/deployment_status.py", "operator/specpilot/api/profile.py",
               "operator/specpilot/api/base.py", "operator/specpilot/api/crd.py", "operator/specpilot/config.py"}
"""Where the models are defined (their own validators do not count as a reader)."""

PASSED_THROUGH = "a Kubernetes API field copied into the pods with its object as a whole (dump())"
EXCEPTIONS: dict[str, str] = {
    "EnvVarSource.config_map_key_ref": PASSED_THROUGH,
    "EnvVarSource.resource_field_ref": PASSED_THROUGH,
    "KeySelector.optional": PASSED_THROUGH,
    "ResourceSelector.container_name": PASSED_THROUGH,
    "ResourceSelector.divisor": PASSED_THROUGH,
    "Toleration.effect": PASSED_THROUGH,
    "Toleration.toleration_seconds": PASSED_THROUGH,
    "EngineSettings.container_overrides": "part of a profile's identity: EngineSettings.identity() hashes the whole "
                                          "object (written by controller.engine_settings)",
    "SpeculationProfileSpec.gpu_product": "a record for people reading the profile (the node's gpu.product label), "
                                          "written by controller.profile_spec",
}


def _models(model: type[BaseModel], seen: set[type[BaseModel]] | None = None) -> set[type[BaseModel]]:
    """`model` and every model reachable through its fields' annotations."""
    seen = set() if seen is None else seen
    if model in seen:
        return seen
    seen.add(model)
    for field in model.model_fields.values():
        for inner in _types(field.annotation):
            if isinstance(inner, type) and issubclass(inner, BaseModel):
                _models(inner, seen)
    return seen


def _types(annotation) -> list:
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) is typing.Annotated:
        return _types(args[0])
    if args:
        return [t for a in args for t in _types(a)]
    return [annotation]


FIELDS = sorted({(m.__name__, name) for root in (SpeculativeDeploymentSpec, SpeculationProfileSpec, OperatorConfig)
                 for m in _models(root) for name in m.model_fields})


@cache
def _code() -> str:
    texts = []
    for base in SOURCES:
        for path in sorted(base.rglob("*.py")):
            if str(path.relative_to(ROOT)) not in DEFINITIONS:
                texts.append(path.read_text())
    return "\n".join(texts)


def test_there_are_fields_to_check():
    assert len(FIELDS) > 50
    assert all(key.count(".") == 1 for key in EXCEPTIONS)


@pytest.mark.parametrize(("model", "field"), FIELDS, ids=[f"{m}.{f}" for m, f in FIELDS])
def test_every_field_is_read_outside_the_api_models(model: str, field: str):
    if f"{model}.{field}" in EXCEPTIONS:
        pytest.skip(EXCEPTIONS[f"{model}.{field}"])
    code = _code()
    by_attribute = re.search(rf"\.{field}\b", code)
    by_key = re.search(rf"[\"']{to_camel(field)}[\"']", code)
    assert by_attribute or by_key, (f"{model}.{field} is read by no code outside the model modules: wire it to "
                                    f"what its docstring promises, or remove it (with a migration note)")



def test_removed_fields_of_older_objects_are_dropped_or_refused_with_the_fix():
    from pydantic import ValidationError

    body = {"model": {"id": "meta-llama/Llama-3.1-8B-Instruct"}, "methods": [{"method": "ngram"}],
            "gpuPools": [{"name": "h100", "nodeSelector": {"pool": "h100"}}]}
    old = {**body, "profiling": {"reprofile": {"newSku": True, "engineImageChange": True, "maxAgeHours": 5}}}
    assert SpeculativeDeploymentSpec.model_validate(old).profiling.reprofile.max_age_hours == 5
    with pytest.raises(ValidationError, match="reprofile.newSku: false is not supported"):
        SpeculativeDeploymentSpec.model_validate({**body, "profiling": {"reprofile": {"newSku": False}}})
    assert OperatorConfig.model_validate({"benchmarkMode": "launch"}) == OperatorConfig()
    with pytest.raises(ValidationError, match="benchmarkMode is removed"):
        OperatorConfig.model_validate({"benchmarkMode": "sidecar"})
