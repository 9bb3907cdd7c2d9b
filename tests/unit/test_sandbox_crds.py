"""The other projects' CRDs the sandbox ships (specpilot_sandbox/crds/): installable from the built package,
every string, list and map bounded (a real API server cost-checks CEL rules against those bounds), and each
file's header naming the version it follows and where it was read."""

from __future__ import annotations

import fnmatch
import tomllib
from pathlib import Path

import pytest

from specpilot_sandbox.apiserver import HTTP_ROUTE_CRD, INFERENCE_POOL_CRD, packaged_crd

ROOT = Path(__file__).resolve().parents[2]
CRDS = ROOT / "sandbox" / "specpilot_sandbox" / "crds"


def test_every_shipped_crd_is_package_data_of_the_sandbox_distribution():
    globs = tomllib.loads((ROOT / "sandbox" / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    shipped = sorted(path.relative_to(CRDS.parent).as_posix() for path in CRDS.iterdir())
    assert shipped and all(any(fnmatch.fnmatch(f, g) for g in globs["specpilot_sandbox"]) for f in shipped)
    assert {INFERENCE_POOL_CRD, HTTP_ROUTE_CRD} == {path.name for path in CRDS.iterdir()}


def _unbounded(schema: dict, at: str) -> list[str]:
    found = []
    kind = schema.get("type")
    if kind == "string" and not ({"maxLength", "enum"} & schema.keys() or schema.get("format") == "date-time"):
        found.append(at)
    if kind == "array" and "maxItems" not in schema:
        found.append(at)
    if kind == "object" and "additionalProperties" in schema and "maxProperties" not in schema:
        found.append(at)
    for name, sub in (schema.get("properties") or {}).items():
        found += _unbounded(sub, f"{at}.{name}")
    for key in ("items", "additionalProperties"):
        if isinstance(schema.get(key), dict):
            found += _unbounded(schema[key], f"{at}[{key}]")
    return found


@pytest.mark.parametrize("file_name", [INFERENCE_POOL_CRD, HTTP_ROUTE_CRD])
def test_every_string_list_and_map_of_the_spec_and_status_is_bounded(file_name):
    schema = packaged_crd(file_name)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    assert _unbounded(schema["properties"]["spec"], "spec") == []
    assert _unbounded(schema["properties"]["status"], "status") == []


@pytest.mark.parametrize("file_name, words", [
    (INFERENCE_POOL_CRD, ("Inference Extension v1.4", "https://gateway-api-inference-extension.sigs.k8s.io/")),
    (HTTP_ROUTE_CRD, ("SUBSET", "Gateway API v1.3", "https://gateway-api.sigs.k8s.io/")),
])
def test_the_header_names_the_version_and_the_source(file_name, words):
    header = (CRDS / file_name).read_text().split("\napiVersion:", 1)[0]
    assert all(w in header for w in words)
