"""The committed CRDs are generated from the models, structural, and carry what kubectl users rely on."""

from __future__ import annotations

import shutil

import pytest
import yaml

from specpilot import cli
from specpilot.api import crd as crd_module
from specpilot.api.deployment_spec import SpeculativeDeploymentSpec


def test_crds_check_passes_on_committed_files(repo_root, capsys):
    assert cli.main(["crds", "--check", "--root", str(repo_root)]) == 0


@pytest.fixture
def scratch_root(repo_root, tmp_path):
    for rel in cli.CRD_DIRS:
        (tmp_path / rel).mkdir(parents=True)
        for f in (repo_root / rel).glob("specpilot.io_*.yaml"):
            shutil.copy(f, tmp_path / rel / f.name)
    return tmp_path


def test_crds_check_fails_after_unregenerated_model_change(scratch_root, monkeypatch, capsys):
    assert cli.main(["crds", "--check", "--root", str(scratch_root)]) == 0

    original = crd_module.speculative_deployment_crd

    def changed():
        crd = original()
        props = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
        props["newField"] = {"type": "string", "description": "a field added to the model"}
        return crd

    monkeypatch.setattr(crd_module, "speculative_deployment_crd", changed)
    assert cli.main(["crds", "--check", "--root", str(scratch_root)]) == 1
    assert "out of date" in capsys.readouterr().err
    assert cli.main(["crds", "--root", str(scratch_root)]) == 0
    assert cli.main(["crds", "--check", "--root", str(scratch_root)]) == 0


def test_crds_check_fails_on_hand_edit(scratch_root):
    path = scratch_root / "crds" / "specpilot.io_speculationprofiles.yaml"
    path.write_text(path.read_text().replace("sprof", "sp"))
    assert cli.main(["crds", "--check", "--root", str(scratch_root)]) == 1


def _walk(schema, path="$"):
    yield path, schema
    for name, sub in schema.get("properties", {}).items():
        yield from _walk(sub, f"{path}.{name}")
    if isinstance(schema.get("items"), dict):
        yield from _walk(schema["items"], f"{path}[]")
    if isinstance(schema.get("additionalProperties"), dict):
        yield from _walk(schema["additionalProperties"], f"{path}{{}}")


@pytest.mark.parametrize("kind", ["SpeculativeDeployment", "SpeculationProfile"])
def test_schema_is_structural_and_documented(crds, kind):
    schema = crds[kind]["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    for path, node in _walk(schema):
        for banned in ("$ref", "anyOf", "oneOf", "allOf", "title", "$defs", "prefixItems", "const"):
            assert banned not in node, f"{path} has non-structural {banned}"
        if node.get("x-kubernetes-preserve-unknown-fields"):
            assert node.get("type") == "object" and "properties" not in node, path
            continue
        assert "type" in node, f"{path} has no type"
        if path.count(".") >= 2 and path != "$.metadata":
            assert node.get("description") or path.endswith(("[]", "}")), f"{path} has no description"


def test_every_spec_field_of_the_model_is_documented():
    def fields(model, prefix="spec"):
        for name, info in model.model_fields.items():
            assert info.description, f"{prefix}.{info.alias or name} has no docstring"
            ann = info.annotation
            for inner in getattr(ann, "__args__", (ann,)):
                if isinstance(inner, type) and hasattr(inner, "model_fields"):
                    yield from fields(inner, f"{prefix}.{info.alias or name}")
            yield name

    assert len(list(fields(SpeculativeDeploymentSpec))) > 60


def test_names_columns_subresource(crds):
    sdep = crds["SpeculativeDeployment"]["spec"]
    assert sdep["names"]["shortNames"] == ["sdep"]
    assert "specpilot" in sdep["names"]["categories"]
    version = sdep["versions"][0]
    assert version["subresources"] == {"status": {}}
    columns = {c["name"]: c["jsonPath"] for c in version["additionalPrinterColumns"]}
    assert columns["Phase"] == ".status.phase"
    assert columns["Decision"] == ".status.decisionSummary"
    assert columns["Concurrency"] == ".status.observedConcurrency"
    assert columns["$/Mtok"] == ".status.costPerMtok"
    assert columns["Age"] == ".metadata.creationTimestamp"
    status_props = version["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]
    for path in columns.values():
        head = path.split(".")[2] if path.startswith(".status.") else None
        assert head is None or head in status_props, path
    sprof = crds["SpeculationProfile"]["spec"]
    assert sprof["names"]["shortNames"] == ["sprof"]
    rules = sprof["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["x-kubernetes-validations"]
    assert any(r["rule"] == "self == oldSelf" for r in rules)


def test_free_form_fields_are_deliberate(crds):
    schema = crds["SpeculativeDeployment"]["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    free = sorted(p for p, n in _walk(schema) if n.get("x-kubernetes-preserve-unknown-fields"))
    assert free == sorted([
        "$.spec.methods[].extraConfig", "$.spec.model.resources",
        "$.spec.profiling.podOverrides", "$.spec.serving.podOverrides",
    ])


def test_crd_yaml_round_trips(repo_root):
    for path in (repo_root / "crds").glob("*.yaml"):
        text = path.read_text()
        assert text.startswith("# Generated by `specpilot crds`")
        assert yaml.safe_load(text)["apiVersion"] == "apiextensions.k8s.io/v1"
