"""One home for each idea (issue 26): vLLM's metric names are written once (`specpilot.vllm_page`), the
speculative-decoding arithmetic once (`specpilot.specdec`), and every default of the policy once, in the API
models."""

from __future__ import annotations

import ast
import inspect
import re
import subprocess
import sys
from pathlib import Path

from specpilot import specdec, vllm_page
from specpilot.api.deployment_spec import Policy, Profiling
from specpilot.policy import refine, schedule

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ("operator", "sandbox", "benchmark-job", "benchmarks", "scripts")
METRIC_LITERAL = re.compile(r"""["']vllm:[a-z]+_[a-z_]*""")
"""A vLLM metric name in quotes (every one has an underscore; an image tag such as "vllm:x" has none)."""


def _sources() -> list[Path]:
    return sorted(p for top in SOURCES for p in (ROOT / top).rglob("*.py") if "tests" not in p.parts)


def test_vllm_metric_names_are_written_only_in_vllm_page():
    home = Path(inspect.getfile(vllm_page)).resolve()
    found = [f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
             for path in _sources() if path.resolve() != home
             for n, line in enumerate(path.read_text().splitlines(), 1) if METRIC_LITERAL.search(line)]
    assert not found, "vLLM metric names outside specpilot/vllm_page.py:\n" + "\n".join(found)


def test_the_grep_sees_the_home_of_the_names():
    assert METRIC_LITERAL.search(Path(inspect.getfile(vllm_page)).read_text())
    assert vllm_page.SPEC_DECODE_DRAFTS_TOTAL == "vllm:spec_decode_num_drafts_total"


def test_the_shared_modules_import_nothing_of_specpilot():
    """The benchmark Job, the observer, the planner and the twin all import them: they must sit below every layer."""
    for module in (specdec, vllm_page):
        tree = ast.parse(Path(inspect.getfile(module)).read_text())
        imported = [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
        imported += [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
        assert not [m for m in imported if m.startswith("specpilot") or m == ""], (module.__name__, imported)


def test_the_benchmark_job_reads_them_without_the_operator_framework():
    code = ("import sys, specpilot_bench.metrics, specpilot_bench.sweep, specpilot_bench.profiles;"
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'kopf', 'kubernetes', 'kmock'}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_signature_defaults_are_the_api_models_defaults():
    min_gain = Policy.model_fields["min_gain_percent"].default
    for function in (schedule.plan_schedule, schedule.plan_from_runs):
        assert inspect.signature(function).parameters["min_gain_percent"].default == min_gain, function.__name__
    assert refine.DEFAULT_BUDGET_SHARE * 100 == Profiling.model_fields["refine_budget_percent"].default


def test_the_arithmetic_as_vllm_defines_it():
    # 1000 drafts of k = 3, accepted 700 / 450 / 250 at positions 0..2: 1400 accepted tokens
    per_position = specdec.acceptance_per_position(1000, [700, 450, 250])
    assert per_position == [0.7, 0.45, 0.25]
    assert specdec.mean_acceptance_length(1000, 1400) == 2.4
    # 100 requests, 3500 generated tokens: 3500 - 1400 - 100 = 2000 request-steps, half of them drafted
    assert specdec.drafts_per_request_step(1000, 3500, 1400, 100) == 0.5
    assert specdec.tokens_per_step(per_position, 0.5, 2) == 1.0 + 0.5 * (0.7 + 0.45)
    # positions past the measured ones accept nothing
    assert specdec.tokens_per_step_curve(per_position, 1.0, 4) == tuple(1.0 + sum(per_position[:k]) for k in range(5))
    assert specdec.verified_tokens_per_step(0.5, 3) == 2.5


def test_history_lives_in_git_and_docs_not_in_the_product_code():
    """The operator's, the bench's and the sandbox's sources say why, not which issue or which past run: no
    "issue N" reference (vLLM's own issue numbers, cited as `#N`, are sources, not history)."""
    found = [f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
             for path in _sources() if path.parts[len(ROOT.parts)] in ("operator", "sandbox", "benchmark-job")
             for n, line in enumerate(path.read_text().splitlines(), 1)
             if re.search(r"\bissue \d+", line, re.IGNORECASE)]
    assert not found, "\n".join(found)
