"""Writes operator/specpilot/data/request-log.csv: the request log `specpilot simulate --fleet log` replays.

A synthetic log, made here (nothing downloaded) and the same on every run (fixed seed), in the column names of
Azure's public LLM inference traces (`TIMESTAMP,ContextTokens,GeneratedTokens`). Its arrivals are bursty at
the 10-second scale: a Poisson process whose rate switches between a quiet and a busy level (a two-state
Markov-modulated Poisson process, as production chat traffic is often modelled), so the arrivals per
10 s vary far more across windows than Poisson's. Lengths are log-normal and long (a reasoning-style chat
service: outputs of a thousand tokens and more), so a few thousand requests are a load for a fleet of GPUs.

    python scripts/make_request_log.py            # rewrite the shipped log
    python scripts/make_request_log.py --check    # exit 1 if the shipped log differs from what this writes
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from datetime import datetime, timedelta
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
LOG = REPO / "operator" / "specpilot" / "data" / "request-log.csv"


@dataclasses.dataclass(frozen=True)
class LogShape:
    requests: int = 6000
    seed: int = 7
    quiet_rps: float = 3.5
    busy_rps: float = 12.0
    quiet_mean_s: float = 80.0
    """Mean time the rate stays quiet before a burst."""
    busy_mean_s: float = 25.0
    """Mean length of a burst."""
    input_median_tokens: float = 1000.0
    input_sigma: float = 1.0
    output_median_tokens: float = 1000.0
    output_sigma: float = 0.9
    start: datetime = datetime(2024, 5, 14, 9, 0, 0)


def make_log(shape: LogShape) -> str:
    """The CSV text: a header, then one row per request in arrival order."""
    rng = np.random.default_rng(shape.seed)
    arrivals: list[float] = []
    t, busy = 0.0, False
    while len(arrivals) < shape.requests:
        length = rng.exponential(shape.busy_mean_s if busy else shape.quiet_mean_s)
        rate = shape.busy_rps if busy else shape.quiet_rps
        n = rng.poisson(rate * length)
        arrivals.extend(np.sort(t + rng.uniform(0.0, length, n)).tolist())
        t, busy = t + length, not busy
    arrival = np.array(arrivals[: shape.requests])
    context = np.clip(np.rint(rng.lognormal(np.log(shape.input_median_tokens), shape.input_sigma,
                                            shape.requests)), 8, 16384).astype(int)
    generated = np.clip(np.rint(rng.lognormal(np.log(shape.output_median_tokens), shape.output_sigma,
                                              shape.requests)), 2, 8192).astype(int)
    lines = ["TIMESTAMP,ContextTokens,GeneratedTokens"]
    for a, c, g in zip(arrival, context, generated, strict=True):
        stamp = shape.start + timedelta(microseconds=int(round(a * 1e6)))
        lines.append(f"{stamp:%Y-%m-%d %H:%M:%S.%f},{c},{g}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="compare with the shipped log instead of writing it")
    args = parser.parse_args(argv)
    text = make_log(LogShape())
    if args.check:
        same = LOG.exists() and LOG.read_text() == text
        print(f"{LOG.relative_to(REPO)}: {'up to date' if same else 'differs; rerun without --check'}")
        return 0 if same else 1
    LOG.parent.mkdir(parents=True, exist_ok=True)
    LOG.write_text(text)
    print(f"wrote {LOG.relative_to(REPO)}: {LogShape().requests} requests")
    return 0


if __name__ == "__main__":
    sys.exit(main())
