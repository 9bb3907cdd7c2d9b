"""`specpilot validate` warns when a deployment names a model likely gated on Hugging Face (its organisation gates
its models) without spec.model.hfTokenSecretRef: a warning under the resource's `valid` line, the exit status
unchanged; a hint from the name, not a lookup."""

from __future__ import annotations

from specpilot.cli import main
from tests.unit.test_cli_validate import run, write

DEPLOYMENT = """\
apiVersion: specpilot.io/v1alpha1
kind: SpeculativeDeployment
metadata:
  name: llama-8b
spec:
  model:
    id: {model}{token}
  methods:
    - method: ngram
    - method: draft_model
      model: {drafter}
  gpuPools:
    - name: default
      nodeSelector:
        nvidia.com/gpu.present: "true"
"""
TOKEN = "\n    hfTokenSecretRef:\n      name: hf-token"


def test_a_gated_model_without_a_token_is_valid_with_a_warning(capsys, tmp_path):
    path = write(tmp_path, "llama.yaml", DEPLOYMENT.format(model="meta-llama/Llama-3.1-8B-Instruct", token="",
                                                           drafter="meta-llama/Llama-3.2-1B-Instruct"))
    code, out, err = run(capsys, path)
    assert code == 0 and err == [], out + err
    assert out[0] == f"{path}: SpeculativeDeployment/llama-8b: valid"
    [warning] = out[1:]
    assert warning.startswith(f"{path}: SpeculativeDeployment/llama-8b: warning: likely gated on Hugging Face (a hint "
                              "from the organisation's name, not a lookup), and spec.model.hfTokenSecretRef is not set: "
                              "spec.model.id meta-llama/Llama-3.1-8B-Instruct (meta-llama gates its models), "
                              "spec.methods[1].model meta-llama/Llama-3.2-1B-Instruct (meta-llama gates its models). "
                              "If gated, the benchmark Jobs fail with ModelAccessDenied (HTTP 401): set "
                              "spec.model.hfTokenSecretRef to a Secret"), warning
    assert "kubectl create secret generic hf-token --from-literal=token=hf_..." in warning


def test_a_token_or_an_open_model_gets_no_warning(capsys, tmp_path):
    with_token = write(tmp_path, "token.yaml", DEPLOYMENT.format(model="meta-llama/Llama-3.1-8B-Instruct", token=TOKEN,
                                                                 drafter="meta-llama/Llama-3.2-1B-Instruct"))
    open_model = write(tmp_path, "qwen.yaml", DEPLOYMENT.format(model="Qwen/Qwen3-8B", token="",
                                                                drafter="Qwen/Qwen3-0.6B"))
    code, out, err = run(capsys, with_token, open_model)
    assert code == 0 and err == [], out + err
    assert out == [f"{with_token}: SpeculativeDeployment/llama-8b: valid", f"{open_model}: SpeculativeDeployment/"
                   "llama-8b: valid"]


def test_the_warning_leaves_an_error_an_error(capsys, tmp_path):
    """A resource the operator would refuse still fails; the hint is not added to its problems."""
    bad = DEPLOYMENT.format(model="meta-llama/Llama-3.1-8B-Instruct", token="", drafter="meta-llama/Llama-3.2-1B"
                            ).replace("kind: SpeculativeDeployment", "kind: SpeculativeDeployment\nbogus: 1")
    code, out, _ = run(capsys, write(tmp_path, "bad.yaml", bad))
    assert code == 1 and not any("likely gated" in line for line in out), out
    assert main(["validate", str(write(tmp_path, "good.yaml", DEPLOYMENT.format(
        model="google/gemma-3-27b-it", token="", drafter="google/gemma-3-1b-it")))]) == 0
