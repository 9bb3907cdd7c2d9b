"""specpilot-bench end to end against the real vLLM engine on the CPU, with tiny local models.

Each profile runs the real CLI in a subprocess (as the Job does) at two levels with a few short
requests; module fixtures share the runs between tests so the suite pays for each engine start once.
The tiny models' weights make acceptance meaningless as a number, so only its mechanics are checked
(`profile_checks`), never a speed.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from profile_checks import check_speculative_run, requests_at
from specpilot.api.validate import validate_custom_resource

pytestmark = pytest.mark.vllm

BENCH = [sys.executable, "-m", "specpilot_bench"]
ENGINE_ARGS = ["--engine-args", "--enforce-eager --max-num-seqs 8 --kv-cache-memory-bytes 67108864",
               "--max-model-len", "512"]
LEVELS = ["--levels", "1,2", "--requests-per-level", "3", "--output-len", "24", "--workload", "json-extraction",
          "--engine-start-timeout", "240", "--no-calibration"]


def bench(args: list[str], output: Path, env: dict[str, str],
          timeout_s: float = 400) -> tuple[subprocess.CompletedProcess, list[dict]]:
    proc = subprocess.run([*BENCH, *args, "--output", str(output)], env=env, capture_output=True,
                          text=True, timeout=timeout_s)
    if not output.exists():
        return proc, []
    text = output.read_text()
    docs = json.loads(text) if output.suffix == ".json" else list(yaml.safe_load_all(text))
    return proc, docs


def check_valid(crds: dict, doc: dict) -> None:
    assert validate_custom_resource(crds["SpeculationProfile"], doc) == []


SCHEDULE = [[1, 1, 3], [2, 256, 2]]
"""ngram's per-batch-size schedule in the shared profiles: K=3 alone in the batch, 2 from two requests on."""


@pytest.fixture(scope="module")
def ngram_profiles(tiny_models, tmp_path_factory, engine_env) -> tuple[subprocess.CompletedProcess, list[dict], Path]:
    """Standalone: the baseline and ngram K=3 on a per-batch-size schedule, with hardware calibration (3 engine
    starts, shared by the tests of the baseline, the method's runs and the schedule)."""
    out = tmp_path_factory.mktemp("ngram") / "profiles.yaml"
    config = json.dumps({"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3,
                         "num_speculative_tokens_per_batch_size": SCHEDULE})
    proc, docs = bench(["--launch", "--model", str(tiny_models.target), "--speculative-config", config,
                        *ENGINE_ARGS, *[a for a in LEVELS if a != "--no-calibration"],
                        "--log-dir", str(out.parent / "logs")], out, engine_env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc, docs, out


def test_baseline_profile(ngram_profiles, crds):
    proc, docs, _ = ngram_profiles
    baseline = docs[0]
    check_valid(crds, baseline)
    assert "method" not in baseline["spec"]
    status = baseline["status"]
    assert status["phase"] == "Succeeded" and status["engineStarts"] == 1
    assert status["kvCapacityTokens"] > 0 and status["engineVersion"] == "0.32.0"
    assert status["hardware"]["backend"] == "cpu" and status["hardware"]["copyBandwidthGbS"] > 0
    (run,) = status["runs"]
    assert run["numSpeculativeTokens"] == 0
    assert [p["concurrency"] for p in run["points"]] == [1, 2]
    for point in run["points"]:
        assert point["completed"] == requests_at(point["concurrency"]) and point["outputThroughput"] > 0
        assert point["generationTokens"] >= requests_at(point["concurrency"]) * 24
        assert "numDrafts" not in point and point["acceptedPerPosition"] == []
        assert point["tpotMs"]["p50"] > 0 and point["ttftMs"]["p90"] >= point["ttftMs"]["p50"]
    # The same result went to stdout as JSON.
    assert json.loads(proc.stdout) == docs


def test_ngram_profile_runs_k1_and_k(ngram_profiles, crds):
    _, docs, _ = ngram_profiles
    method = docs[1]
    check_valid(crds, method)
    assert method["spec"]["method"]["method"] == "ngram"
    status = method["status"]
    assert status["phase"] == "Succeeded" and status["engineStarts"] == 2
    assert [r["numSpeculativeTokens"] for r in status["runs"]] == [1, 3]
    check_speculative_run(status["runs"][0], 1)
    check_speculative_run(status["runs"][1], 3)
    config = json.loads(method["metadata"]["annotations"]["specpilot.io/speculative-config"])
    assert config["num_speculative_tokens"] == 3 and config["prompt_lookup_max"] == 3


def test_profile_file_feeds_specpilot_plan(ngram_profiles):
    _, _, out = ngram_profiles
    cli = [sys.executable, "-c", "import sys; from specpilot.cli import main; sys.exit(main())"]
    help_text = subprocess.run([*cli, "--help"], capture_output=True, text=True).stdout
    if " plan" not in help_text:
        pytest.skip("`specpilot plan` does not exist yet")
    proc = subprocess.run([*cli, "plan", "--profile", str(out)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_ngram_with_dynamic_schedule(ngram_profiles):
    _, docs, out = ngram_profiles
    doc = docs[1]
    config = json.loads(doc["metadata"]["annotations"]["specpilot.io/speculative-config"])
    assert config["num_speculative_tokens_per_batch_size"] == SCHEDULE
    runs = doc["status"]["runs"]
    assert [r["numSpeculativeTokens"] for r in runs] == [1, 3]
    # At concurrency 1 every step has one request: the K=3 branch drafts at all three positions.
    k_run = runs[1]
    assert k_run["points"][0]["numDrafts"] > 0
    assert len(k_run["acceptance"]["perPosition"]) == 3
    assert k_run["acceptance"]["perPosition"] == sorted(k_run["acceptance"]["perPosition"], reverse=True)
    # The k=1 run started with the schedule capped at 1 (it would not start otherwise).
    engine_log = next((out.parent / "logs").glob("*-k1.log")).read_text()
    assert '"num_speculative_tokens_per_batch_size":[[1,1,1],[2,256,1]]' in engine_log


def test_bad_speculative_config_fails_with_the_engine_log(tiny_models, tmp_path, crds, engine_env):
    missing = tmp_path / "no-such-draft"
    config = json.dumps({"method": "draft_model", "model": str(missing), "num_speculative_tokens": 2})
    proc, docs = bench(["--launch", "--model", str(tiny_models.target), "--speculative-config", config,
                        "--skip-baseline", *ENGINE_ARGS, *LEVELS, "--log-dir", str(tmp_path / "logs")],
                       tmp_path / "bad.json", engine_env)
    assert proc.returncode == 1
    assert "the engine exited with code" in proc.stderr
    assert "Engine log" in proc.stderr and str(missing) in proc.stderr
    (doc,) = docs
    check_valid(crds, doc)
    assert doc["status"]["phase"] == "Failed" and doc["status"]["reason"] == "EngineStartFailed"
    assert str(missing) in doc["status"]["message"]
    assert list((tmp_path / "logs").glob("*.log"))


async def test_sidecar_run_states_the_engine_k(tiny_models, tmp_path, launch_engine, cpu_engine_args,
                                               engine_serves, engine_env, crds):
    config = {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 1, "prompt_lookup_max": 4}
    async with launch_engine(tiny_models.target, cpu_engine_args, speculative_config=config) as info:
        await engine_serves(info.base_url, info.model_id)
        common = ["--engine-url", info.base_url, "--model", str(tiny_models.target),
                  "--speculative-config", json.dumps(config), *LEVELS]
        wrong, _ = await asyncio.to_thread(bench, [*common, "--num-speculative-tokens", "3"], tmp_path / "w.json",
                                          engine_env)
        proc, docs = await asyncio.to_thread(bench, common, tmp_path / "sidecar.json", engine_env)
    assert wrong.returncode == 1 and "runs with num_speculative_tokens=2" in wrong.stderr
    assert proc.returncode == 0, proc.stderr[-3000:]
    (doc,) = docs
    check_valid(crds, doc)
    status = doc["status"]
    assert status["engineStarts"] == 0
    check_speculative_run(status["runs"][0], 2)
    # One of the method's two runs is in: the profile waits for the other Job.
    assert status["phase"] == "Running"


def test_the_engine_container_shape_measures_the_real_engine(tiny_models, tmp_path, crds, engine_env,
                                                             cpu_engine_args):
    """The benchmark pod's shape: the engine supervisor (the engine container, its own process and environment)
    starts the real vLLM engine for each k the bench asks for; the bench, which alone has the result token,
    measures it over loopback. Neither process shares the other's environment. The method is a draft model (the
    target drafts for itself: with random weights a different drafter would never be accepted, and the counters
    must move to show the mechanics); ngram's runs are the module's shared profiles'."""
    from specpilot.api import seal
    from specpilot_bench.engine import free_port, launch_command

    config = {"method": "draft_model", "model": str(tiny_models.target), "num_speculative_tokens": 2}
    control, engine_port = free_port(), free_port()
    engine_command = launch_command(str(tiny_models.target), engine_port, engine_args=list(cpu_engine_args))
    configs = [a for k in (1, 2) for a in
               ("--config-for-k", f"{k}={json.dumps({**config, 'num_speculative_tokens': k})}")]
    engine_container_env = {k: v for k, v in engine_env.items() if k != seal.TOKEN_ENV}
    log = tmp_path / "supervisor.log"
    with log.open("w") as out:
        supervisor = subprocess.Popen(
            [*BENCH, "engine-supervisor", "--listen", f"127.0.0.1:{control}", "--log-dir", str(tmp_path / "logs"),
             *configs, "--", *engine_command], stdout=out, stderr=subprocess.STDOUT, env=engine_container_env)
    try:
        proc, docs = bench(["--supervisor-url", f"http://127.0.0.1:{control}", "--engine-port", str(engine_port),
                            "--model", str(tiny_models.target), "--speculative-config", json.dumps(config),
                            "--skip-baseline", *LEVELS], tmp_path / "supervised.json",
                           {**engine_env, seal.TOKEN_ENV: "only-the-bench-has-it"})
        assert proc.returncode == 0, proc.stderr[-3000:] + log.read_text()[-3000:]
        assert supervisor.wait(60) == 0  # the bench said it was done: the engine stopped, the pod completes
    finally:
        if supervisor.poll() is None:
            supervisor.kill()
    (doc,) = docs
    check_valid(crds, doc)
    status = doc["status"]
    assert status["phase"] == "Succeeded" and status["engineStarts"] == 2
    assert [r["numSpeculativeTokens"] for r in status["runs"]] == [1, 2]
    check_speculative_run(status["runs"][0], 1)
    check_speculative_run(status["runs"][1], 2)
    # A model drafter drafts at every request-step.
    assert status["runs"][1]["acceptance"]["draftsPerStep"] > 0.8
    started = sorted((tmp_path / "logs").glob("*.log"))
    assert [p.name for p in started] == ["01-k1.log", "02-k2.log"]
    assert '"num_speculative_tokens":2' in started[1].read_text().splitlines()[0].replace(" ", "")
