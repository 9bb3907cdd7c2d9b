"""Engine arguments, environment and config hash; the pod-override merge rules."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specpilot.api import CandidateMethod, ScheduleRange, SpeculativeDeploymentSpec
from specpilot.manifests.engine import (
    ENGINE_COMMAND,
    engine_args,
    engine_config_hash,
    engine_env,
    speculative_config_json,
)
from specpilot.manifests.merge import deep_merge
from tests.conftest import load_example

SCHEDULE = [
    ScheduleRange(from_batch_size=1, to_batch_size=16, num_speculative_tokens=5),
    ScheduleRange(from_batch_size=17, to_batch_size=64, num_speculative_tokens=3),
    ScheduleRange(from_batch_size=65, to_batch_size=512, num_speculative_tokens=0),
]


@pytest.fixture(scope="module")
def realistic() -> SpeculativeDeploymentSpec:
    return SpeculativeDeploymentSpec.model_validate(load_example("llama-70b-h100-h200.yaml")["spec"])


@pytest.fixture(scope="module")
def minimal() -> SpeculativeDeploymentSpec:
    return SpeculativeDeploymentSpec.model_validate(load_example("minimal.yaml")["spec"])


def flag_value(args: list[str], flag: str) -> str:
    return args[args.index(flag) + 1]


def test_command_runs_the_openai_server_module():
    assert ENGINE_COMMAND == ["python3", "-m", "vllm.entrypoints.openai.api_server"]


def test_realistic_args_with_a_schedule(realistic):
    eagle3 = realistic.methods[1]
    args = engine_args(realistic, method=eagle3, num_speculative_tokens=5, schedule=SCHEDULE, port=8000)
    assert args == [
        "--model", "meta-llama/Llama-3.3-70B-Instruct",
        "--served-model-name", "llama-3.3-70b",
        "--tensor-parallel-size", "4",
        "--max-model-len", "16384",
        "--gpu-memory-utilization", "0.9",
        "--port", "8000",
        "--speculative-config",
        '{"method":"eagle3","model":"yuhuili/EAGLE3-LLaMA3.3-Instruct-70B","num_speculative_tokens":5,'
        '"num_speculative_tokens_per_batch_size":[[1,16,5],[17,64,3],[65,512,0]]}',
        "--enable-prefix-caching", "--max-num-seqs=256",
    ]
    assert json.loads(flag_value(args, "--speculative-config")) == eagle3.speculative_config(5, SCHEDULE)


def test_ngram_config_carries_the_lookup_window(realistic):
    args = engine_args(realistic, method=realistic.methods[0], num_speculative_tokens=2, port=8000)
    assert json.loads(flag_value(args, "--speculative-config")) == {
        "method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 2, "prompt_lookup_max": 5}


def test_no_method_or_k_zero_means_no_speculative_config(realistic):
    assert "--speculative-config" not in engine_args(realistic, method=None, port=8000)
    assert "--speculative-config" not in engine_args(realistic, method=realistic.methods[1],
                                                     num_speculative_tokens=0, port=8000)
    assert speculative_config_json(realistic.methods[1], 0) is None


def test_method_without_k_uses_its_maximum(realistic):
    args = engine_args(realistic, method=realistic.methods[2], port=8000)
    config = json.loads(flag_value(args, "--speculative-config"))
    assert config["num_speculative_tokens"] == 4
    assert config["method"] == "draft_model" and config["draft_tensor_parallel_size"] == 1
    assert "num_speculative_tokens_per_batch_size" not in config


def test_schedule_above_k_is_refused(realistic):
    with pytest.raises(ValueError, match="numSpeculativeTokens"):
        engine_args(realistic, method=realistic.methods[1], num_speculative_tokens=3, schedule=SCHEDULE, port=8000)


def test_minimal_args_have_no_flags_it_did_not_configure(minimal):
    args = engine_args(minimal, method=minimal.methods[0], port=minimal.serving.port)
    flags = [a for a in args if a.startswith("--")]
    assert flags == ["--model", "--served-model-name", "--tensor-parallel-size", "--gpu-memory-utilization",
                     "--port", "--speculative-config"]
    assert flag_value(args, "--port") == "8000"
    assert flag_value(args, "--served-model-name") == "meta-llama/Llama-3.1-8B-Instruct"


def test_revision_and_data_parallel(minimal):
    spec = minimal.model_copy(update={"model": minimal.model.model_copy(
        update={"revision": "abc123", "data_parallel_size": 2})})
    args = engine_args(spec, method=None, port=9000)
    assert flag_value(args, "--revision") == "abc123"
    assert flag_value(args, "--data-parallel-size") == "2"
    assert "--data-parallel-size" not in engine_args(minimal, method=None, port=9000)


def test_extra_args_come_last(realistic):
    args = engine_args(realistic, method=realistic.methods[0], port=8000)
    assert args[-2:] == ["--enable-prefix-caching", "--max-num-seqs=256"]


def test_env_has_the_token_and_the_users_variables(realistic, minimal):
    assert engine_env(realistic) == [
        {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf-token", "key": "token"}}}]
    assert engine_env(minimal) == [
        {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf-token", "key": "token"}}}]
    assert engine_env(minimal.model.model_copy(update={"hf_token_secret_ref": None})) == []
    model = realistic.model.model_validate({**realistic.model.dump(), "env": [
        {"name": "VLLM_LOGGING_LEVEL", "value": "DEBUG"}, {"name": "HF_TOKEN", "value": "inline"}]})
    assert engine_env(model) == [{"name": "VLLM_LOGGING_LEVEL", "value": "DEBUG"},
                                 {"name": "HF_TOKEN", "value": "inline"}]


args_lists = st.lists(st.text(max_size=12), max_size=8)


@settings(max_examples=200, deadline=None)
@given(a=args_lists, b=args_lists)
def test_config_hash_changes_iff_args_change(a, b):
    assert (engine_config_hash(a) == engine_config_hash(b)) == (a == b)


def test_config_hash_tells_flag_boundaries_apart():
    assert engine_config_hash(["--a", "b c"]) != engine_config_hash(["--a b", "c"])
    assert engine_config_hash(["x"]) == engine_config_hash(["x"])


# ----- merge -----

def test_merge_recurses_into_dicts_and_null_removes():
    base = {"nodeSelector": {"a": "1"}, "priorityClassName": "low", "hostIPC": True}
    merged = deep_merge(base, {"nodeSelector": {"b": "2"}, "priorityClassName": "high", "hostIPC": None})
    assert merged == {"nodeSelector": {"a": "1", "b": "2"}, "priorityClassName": "high"}
    assert base == {"nodeSelector": {"a": "1"}, "priorityClassName": "low", "hostIPC": True}


def test_merge_named_lists_by_key_and_replace_the_others():
    base = {
        "containers": [{"name": "engine", "image": "i", "args": ["--x"],
                        "env": [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}],
                        "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}]}],
        "volumes": [{"name": "dshm", "emptyDir": {"medium": "Memory"}}],
        "tolerations": [{"key": "a", "operator": "Exists"}],
    }
    override = {
        "containers": [
            {"name": "engine", "args": ["--y"], "env": [{"name": "B", "value": "two"}, {"name": "C", "value": "3"}],
             "volumeMounts": [{"name": "weights", "mountPath": "/models"}]},
            {"name": "log-shipper", "image": "fluent-bit"},
        ],
        "volumes": [{"name": "weights", "persistentVolumeClaim": {"claimName": "llama"}}],
        "tolerations": [{"key": "b", "operator": "Exists"}],
    }
    merged = deep_merge(base, override)
    engine, shipper = merged["containers"]
    assert engine["image"] == "i"
    assert engine["args"] == ["--y"]
    assert engine["env"] == [{"name": "A", "value": "1"}, {"name": "B", "value": "two"}, {"name": "C", "value": "3"}]
    assert [m["mountPath"] for m in engine["volumeMounts"]] == ["/dev/shm", "/models"]
    assert shipper == {"name": "log-shipper", "image": "fluent-bit"}
    assert [v["name"] for v in merged["volumes"]] == ["dshm", "weights"]
    assert merged["tolerations"] == [{"key": "b", "operator": "Exists"}]


def test_merge_with_no_overrides_is_a_copy():
    base = {"containers": [{"name": "engine"}]}
    merged = deep_merge(base, None)
    assert merged == base
    merged["containers"][0]["image"] = "x"
    assert base == {"containers": [{"name": "engine"}]}
