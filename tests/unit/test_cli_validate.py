"""`specpilot validate`: every file it cannot check gets one clear line naming it, and a non-zero exit."""

from __future__ import annotations

from pathlib import Path

import pytest

from specpilot.cli import main
from tests.conftest import REPO

MINIMAL = (REPO / "examples" / "minimal.yaml").read_text()


def run(capsys, *files: str | Path) -> tuple[int, list[str], list[str]]:
    code = main(["validate", *map(str, files)])
    out = capsys.readouterr()
    return code, out.out.splitlines(), out.err.splitlines()


def one_line(lines: list[str]) -> str:
    assert len(lines) == 1, lines
    assert "Traceback" not in lines[0] and "<unicode string>" not in lines[0]
    return lines[0]


def write(tmp_path: Path, name: str, text: str | bytes) -> Path:
    path = tmp_path / name
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return path


def test_examples_are_valid(capsys, tmp_path):
    files = sorted((REPO / "examples").glob("*.yaml"))
    # the operator reads a deployment's own Prometheus only when the admin allows its URL
    config = write(tmp_path, "values.yaml", "config:\n  allowedPrometheusUrls: ['http://prometheus-operated.monitoring"
                                            ".svc:9090']\n")
    code, out, err = run(capsys, "--operator-config", config, *files)
    assert code == 0, out + err
    assert err == []
    assert len(out) == len(files) and all(line.endswith(": valid") for line in out)


def test_missing_file(capsys, tmp_path):
    path = tmp_path / "nope.yaml"
    code, out, err = run(capsys, path)
    assert code != 0 and out == []
    assert one_line(err) == f"specpilot validate: {path}: no such file"


def test_invalid_yaml_names_file_line_and_column(capsys, tmp_path):
    path = write(tmp_path, "bad.yaml", "apiVersion: specpilot.io/v1alpha1\nkind: SpeculativeDeployment\n"
                                       "metadata:\n  name: x\n spec: [\n")
    code, out, err = run(capsys, path)
    assert code != 0 and out == []
    line = one_line(err)
    assert line.startswith(f"specpilot validate: {path}:5:2: not valid YAML: "), line


def test_unclosed_flow_sequence_points_at_the_end(capsys, tmp_path):
    path = write(tmp_path, "bad.yaml", "kind: SpeculationProfile\nspec: {sku: [H100\n")
    code, _, err = run(capsys, path)
    assert code != 0
    assert f"{path}:3:1: not valid YAML" in one_line(err)


@pytest.mark.parametrize("text", ["", "\n\n", "# only a comment\n", "---\n---\n"])
def test_empty_file(capsys, tmp_path, text):
    path = write(tmp_path, "empty.yaml", text)
    code, out, err = run(capsys, path)
    assert code != 0 and out == []
    assert one_line(err) == f"specpilot validate: no resources found in {path}"


@pytest.mark.parametrize("others", [[], ["histogram.csv", "notes.txt"]], ids=["empty", "no-yaml"])
def test_a_directory_without_yaml_files_is_an_error(capsys, tmp_path, others):
    for name in others:
        write(tmp_path, name, "concurrency,share\n")
    code, out, err = run(capsys, tmp_path)
    assert code == 1 and out == []
    assert one_line(err) == (f"specpilot validate: {tmp_path}: no YAML files (.yaml, .yml, .json) in this directory "
                             f"or below")


def test_not_utf8(capsys, tmp_path):
    path = write(tmp_path, "bin.yaml", b"\xff\xfe\x00")
    code, _, err = run(capsys, path)
    assert code != 0
    assert one_line(err).startswith(f"specpilot validate: {path}: not UTF-8 text")


@pytest.mark.parametrize("text, what", [("- a\n- b\n", "a list"), ("just words\n", "a string"), ("42\n", "a number")])
def test_document_that_is_not_a_mapping(capsys, tmp_path, text, what):
    path = write(tmp_path, "x.yaml", MINIMAL + "---\n" + text)
    code, out, err = run(capsys, path)
    assert code != 0 and err == []
    assert out[0] == f"{path}: SpeculativeDeployment/llama-8b: valid"
    line = MINIMAL.count("\n") + 2
    assert one_line(out[1:]) == (f"{path}: document 2 (line {line}): is {what}, not a resource: each document must "
                                 f"be a mapping with apiVersion, kind, metadata and spec")


def test_document_without_kind(capsys, tmp_path):
    path = write(tmp_path, "x.yaml", "apiVersion: specpilot.io/v1alpha1\nmetadata: {name: x}\n")
    code, out, _ = run(capsys, path)
    assert code != 0
    assert one_line(out) == (f"{path}: document 1 (line 1): has no kind: "
                             f"set kind: SpeculationProfile or SpeculativeDeployment")


def test_misspelt_kind_is_an_error_with_a_suggestion(capsys, tmp_path):
    path = write(tmp_path, "x.yaml", MINIMAL.replace("kind: SpeculativeDeployment", "kind: SpeculativeDeploymnet"))
    code, out, _ = run(capsys, path)
    assert code != 0
    assert one_line(out) == (f"{path}: SpeculativeDeploymnet/llama-8b: unknown kind 'SpeculativeDeploymnet': "
                             f"did you mean SpeculativeDeployment?")


def test_unknown_kind_of_specpilots_group(capsys, tmp_path):
    path = write(tmp_path, "x.yaml", "apiVersion: specpilot.io/v1alpha1\nkind: Widget\nmetadata: {name: w}\n")
    code, out, _ = run(capsys, path)
    assert code != 0
    assert one_line(out) == (f"{path}: Widget/w: unknown kind 'Widget': specpilot.io's kinds are "
                             f"SpeculationProfile, SpeculativeDeployment")


def test_other_groups_kinds_are_skipped_beside_a_specpilot_resource(capsys, tmp_path):
    path = write(tmp_path, "x.yaml", "apiVersion: v1\nkind: Namespace\nmetadata: {name: llm}\n---\n" + MINIMAL)
    code, out, err = run(capsys, path)
    assert code == 0 and err == []
    assert out == [f"{path}: SpeculativeDeployment/llama-8b: valid",
                   f"{path}: skipped Namespace/llm: not specpilot kinds "
                   f"(validate checks SpeculationProfile or SpeculativeDeployment)"]


def test_file_without_any_specpilot_resource(capsys, tmp_path):
    path = write(tmp_path, "x.yaml", "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: web}\n")
    code, out, err = run(capsys, path)
    assert code != 0 and out == []
    assert one_line(err) == (f"specpilot validate: no SpeculationProfile or SpeculativeDeployment found in {path} "
                             f"(it holds Deployment/web)")


def test_wrong_api_version(capsys, tmp_path):
    path = write(tmp_path, "x.yaml", MINIMAL.replace("specpilot.io/v1alpha1", "specpilot.io/v1"))
    code, out, _ = run(capsys, path)
    assert code != 0
    assert one_line(out) == (f"{path}: SpeculativeDeployment/llama-8b: apiVersion: expected specpilot.io/v1alpha1 "
                             f"(got 'specpilot.io/v1')")


def test_kubectl_list_is_expanded(capsys, tmp_path):
    import yaml

    doc = yaml.safe_load(MINIMAL)
    path = write(tmp_path, "list.yaml", yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": [doc, doc]}))
    code, out, _ = run(capsys, path)
    assert code == 0
    assert out == [f"{path}: SpeculativeDeployment/llama-8b: valid"] * 2


def test_invalid_resource_names_the_field(capsys, tmp_path):
    path = write(tmp_path, "x.yaml", MINIMAL + "  policy:\n    tpotSloMs: -5\n")
    code, out, _ = run(capsys, path)
    assert code == 1
    assert out and all(line.startswith(f"{path}: SpeculativeDeployment/llama-8b: ") for line in out)
    assert "tpotSloMs" in "\n".join(out)


def test_wrong_shape_inside_a_resource_is_one_line(capsys, tmp_path):
    path = write(tmp_path, "x.yaml", MINIMAL.split("  gpuPools:")[0] + "  gpuPools: [a]\n")
    code, out, err = run(capsys, path)
    assert code != 0
    assert out and all(line.startswith(f"{path}: SpeculativeDeployment/llama-8b: ") for line in out), out + err
    assert not any("Traceback" in line for line in out + err)


def test_every_file_is_reported_after_a_bad_one(capsys, tmp_path):
    good = REPO / "examples" / "minimal.yaml"
    code, out, err = run(capsys, tmp_path / "missing.yaml", write(tmp_path, "empty.yaml", ""), good)
    assert code != 0
    assert out == [f"{good}: SpeculativeDeployment/llama-8b: valid"]
    assert err == [f"specpilot validate: {tmp_path / 'missing.yaml'}: no such file",
                   f"specpilot validate: no resources found in {tmp_path / 'empty.yaml'}"]


def test_console_script_prints_no_traceback(tmp_path):
    import subprocess
    import sys

    path = write(tmp_path, "bad.yaml", "a: [\n")
    result = subprocess.run([sys.executable, "-m", "specpilot.cli", "validate", str(path)],
                            capture_output=True, text=True, cwd=REPO, timeout=60)
    assert result.returncode == 1
    assert result.stdout == ""
    assert result.stderr.strip().startswith(f"specpilot validate: {path}:2:1: not valid YAML")
    assert "Traceback" not in result.stderr


# ----- directories, globs and files that are not YAML (issue 28) -----

def test_a_directory_is_validated_file_by_file_and_other_files_are_skipped_silently(capsys, tmp_path):
    write(tmp_path, "a.yaml", MINIMAL)
    (tmp_path / "sub").mkdir()
    write(tmp_path / "sub", "b.yml", MINIMAL)
    write(tmp_path, "histogram.csv", "concurrency,share\n1,0.5\n")
    write(tmp_path / "sub", "README", "not a resource\n")
    code, out, err = run(capsys, tmp_path)
    assert code == 0, out + err
    assert out == [f"{tmp_path / 'a.yaml'}: SpeculativeDeployment/llama-8b: valid",
                   f"{tmp_path / 'sub' / 'b.yml'}: SpeculativeDeployment/llama-8b: valid"]
    assert err == []


def test_a_file_named_that_is_not_yaml_is_an_error(capsys, tmp_path):
    csv = write(tmp_path, "histogram.csv", "concurrency,share\n1,0.5\n")
    code, out, err = run(capsys, csv)
    assert code == 1 and out == []
    assert one_line(err) == (f"specpilot validate: {csv}: not a YAML file (validate reads .yaml, .yml, .json): name "
                             f"only resource files, or their directory (its other files are skipped)")


def test_a_file_named_without_an_extension_is_read_as_yaml(capsys, tmp_path):
    good = write(tmp_path, "deployment", MINIMAL)
    bad = write(tmp_path, "notes", "a: [\n")
    code, out, err = run(capsys, good, bad)
    assert code == 1
    assert out == [f"{good}: SpeculativeDeployment/llama-8b: valid"]
    assert one_line(err).startswith(f"specpilot validate: {bad}:2:1: not valid YAML")


def test_the_examples_as_the_shell_expands_examples_star(capsys):
    files = sorted((REPO / "examples").iterdir())
    assert any(f.suffix == ".csv" for f in files)  # what the shell gives for examples/*
    code, out, err = run(capsys, *files)
    assert code == 1, out + err  # the CSV was named: an error, the others are still checked
    csv = next(f for f in files if f.suffix == ".csv")
    assert one_line(err).startswith(f"specpilot validate: {csv}: not a YAML file")
    assert sum(": valid" in line for line in out) == len(files) - 1


def test_the_examples_folder_skips_its_csv(capsys):
    code, out, err = run(capsys, REPO / "examples")
    assert code == 0 and err == [], out + err
    assert sum(line.endswith(": valid") for line in out) == len(list((REPO / "examples").glob("*.yaml")))


def test_the_help_documents_the_exit_status(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["validate", "--help"])
    assert exit_.value.code == 0
    text = capsys.readouterr().out
    assert "skipped silently" in text
    status = text[text.index("exit status:"):]
    for code, what in (("0", "every resource is valid"), ("1", "not YAML or does not parse"),
                       ("2", "--operator-config cannot be used")):
        assert f"  {code}  " in status and what in " ".join(status.split()), status


def test_a_quoted_glob_is_expanded(capsys, tmp_path):
    write(tmp_path, "a.yaml", MINIMAL)
    write(tmp_path, "b.yaml", MINIMAL)
    code, out, _ = run(capsys, str(tmp_path / "*.yaml"))
    assert code == 0 and len(out) == 2
    write(tmp_path, "c.csv", "concurrency,share\n")
    code, out, err = run(capsys, str(tmp_path / "*"))
    assert code == 0 and len(out) == 2 and err == []  # the glob found the CSV, not the user: skipped silently
    code, _, err = run(capsys, str(tmp_path / "*.json"))
    assert code == 1 and one_line(err) == (f"specpilot validate: {tmp_path / '*.json'}: matches no YAML file (.yaml, "
                                           f".yml, .json)")


def test_an_unknown_field_gets_the_nearest_known_one(capsys, tmp_path):
    path = write(tmp_path, "x.yaml", MINIMAL + "  serving:\n    minReplica: 2\n")
    code, out, _ = run(capsys, path)
    assert code == 1
    assert f"{path}: SpeculativeDeployment/llama-8b: spec.serving.minReplica: unknown field (did you mean " \
           f"`minReplicas`?)" in out


# ----- the operator's tenancy bounds (issue 25) -----

HOSTILE = MINIMAL + """  serving:
    podOverrides:
      hostNetwork: true
      securityContext: {runAsUser: "0"}
      serviceAccountName: cluster-admin
"""


def test_what_the_operator_refuses_is_not_valid(capsys, tmp_path):
    path = write(tmp_path, "x.yaml", HOSTILE)
    code, out, err = run(capsys, path)
    assert code == 1 and err == []
    prefix = f"{path}: SpeculativeDeployment/llama-8b: the operator would refuse it (Valid=False, InvalidSpec; nothing " \
             f"created): "
    assert out == [
        prefix + "spec.serving.podOverrides.hostNetwork is not allowed (the pod would share the node's network): "
                 "remove it, or ask the cluster admin to list hostNetwork in the operator's "
                 "tenancy.allowedPodOverrideFields",
        prefix + "spec.serving.podOverrides.securityContext.runAsUser must be a uid written as an integer (got '0'): "
                 "write it without quotes",
        prefix + "spec.serving.podOverrides.serviceAccountName is not allowed (the pod would run with another "
                 "identity's rights): remove it, or ask the cluster admin to list serviceAccountName in the "
                 "operator's tenancy.allowedPodOverrideFields",
    ]


@pytest.mark.parametrize("values", [
    "config:\n  tenancy:\n    allowedPodOverrideFields: [hostNetwork, serviceAccountName]\n",
    "tenancy:\n  allowedPodOverrideFields: [hostNetwork, serviceAccountName]\n",
], ids=["chart-values", "operator-config"])
def test_the_admins_bounds_come_from_the_operator_config(capsys, tmp_path, values):
    path = write(tmp_path, "x.yaml", HOSTILE.replace('{runAsUser: "0"}', "{runAsUser: 4242}"))
    config = write(tmp_path, "values.yaml", values)
    assert run(capsys, path)[0] == 1
    code, out, err = run(capsys, "--operator-config", config, path)
    assert code == 0 and err == []
    assert out == [f"{path}: SpeculativeDeployment/llama-8b: valid"]


def test_the_charts_own_values_are_an_operator_config(capsys):
    code, out, err = run(capsys, "--operator-config", REPO / "charts" / "specpilot" / "values.yaml",
                         REPO / "examples" / "minimal.yaml")
    assert code == 0 and err == [] and out[0].endswith(": valid")


def test_a_refused_prometheus_url_is_a_warning(capsys):
    path = REPO / "examples" / "llama-70b-h100-h200.yaml"
    code, out, _ = run(capsys, path)
    assert code == 0
    assert out[0] == f"{path}: SpeculativeDeployment/llama-70b: valid"
    assert out[1].startswith(f"{path}: SpeculativeDeployment/llama-70b: warning: the operator would run it without "
                             f"reading its Prometheus (MetricsAvailable=False, PrometheusUrlNotAllowed): "
                             f"spec.metrics.prometheusUrl is refused")


@pytest.mark.parametrize("text,expected", [
    ("a: [\n", ":2:1: not valid YAML"), ("- 1\n", ": is a list: pass the chart's values file"),
    ("config:\n  tenancy:\n    allowedSecretNames: 5\n",
     ": not a valid operator config: config.tenancy.allowedSecretNames: Input should be a valid list"),
])
def test_an_unusable_operator_config_is_one_line(capsys, tmp_path, text, expected):
    config = write(tmp_path, "values.yaml", text)
    code, out, err = run(capsys, "--operator-config", config, REPO / "examples" / "minimal.yaml")
    assert code == 2 and out == []
    assert one_line(err).startswith(f"specpilot validate: --operator-config {config}{expected}"), err
