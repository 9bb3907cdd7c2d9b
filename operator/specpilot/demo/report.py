"""The demo's summary: per phase and pool, what specpilot's configuration delivered (measured by the
clients) against no speculation and always-on speculation at the same load (predicted by the twin the
simulated GPUs run on), plus PNG plots and a JSON/markdown report."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from ..api.methods import method_family
from ..api.schedule import ScheduleRange, k_at
from ..perf.catalog import DEFAULT_CATALOG
from ..perf.cost import cost_per_million_tokens
from ..perf.models import resolve_model
from ..perf.twin import Twin
from .run import DemoResult
from .scenario import DemoScenario

PROMPT_TOKENS = 60


@dataclass
class Row:
    phase: str
    pool: str
    sku: str
    concurrency_per_replica: float
    k_specpilot: int
    sd_share: float | None
    ms_per_token_measured: float | None
    ms_per_token_no_sd: float
    ms_per_token_always_sd: float
    ms_per_token_specpilot_twin: float
    cost_specpilot: float
    cost_no_sd: float
    cost_always_sd: float


def summary_rows(result: DemoResult, scenario: DemoScenario) -> list[Row]:
    pools = {p["name"]: p for p in result.status.get("pools") or []}
    spec = scenario.deployment()["spec"]
    model = resolve_model(spec["model"]["id"])
    context = PROMPT_TOKENS + scenario.output_len / 2
    rows = []
    for phase in result.phases:
        for name, measured in sorted(phase.pools.items()):
            pool = pools.get(name) or {}
            decision = phase.decisions.get(name) or {}
            sku = pool.get("sku")
            if not sku or not decision.get("method") or measured.concurrency_per_replica <= 0:
                continue
            candidate = next(m for m in spec["methods"]
                             if (m.get("name") or m["method"].replace("_", "-")) == decision["method"])
            gpu = DEFAULT_CATALOG.resolve(sku)
            price = gpu.default_price_per_gpu_hour
            baseline = Twin(gpu, model, workload="sharegpt")
            speculative = Twin(gpu, model, method=method_family(candidate["method"]), workload="sharegpt")
            batch = max(1.0, measured.concurrency_per_replica)
            schedule = [ScheduleRange.model_validate(r) for r in decision.get("schedule") or []]
            k = k_at(schedule, max(1, round(batch))) if schedule else decision.get("numSpeculativeTokens", 0)
            big_k = candidate["numSpeculativeTokens"]
            tpot = {
                "none": baseline.tpot_s(batch, 0, context),
                "always": speculative.tpot_s(batch, big_k, context),
                "specpilot": speculative.tpot_s(batch, k, context) if k else baseline.tpot_s(batch, 0, context),
            }
            cost = {key: cost_per_million_tokens(price, 1, batch / value) for key, value in tpot.items()}
            rows.append(Row(
                phase=phase.phase.name, pool=name, sku=sku, concurrency_per_replica=round(batch, 1),
                k_specpilot=k, sd_share=measured.drafts_per_generated_token,
                # The simulated GPUs run time_scale times faster than the GPUs they stand for.
                ms_per_token_measured=None if measured.ms_per_token_p50 is None
                else measured.ms_per_token_p50 * scenario.sim.time_scale,
                ms_per_token_no_sd=1000 * tpot["none"], ms_per_token_always_sd=1000 * tpot["always"],
                ms_per_token_specpilot_twin=1000 * tpot["specpilot"],
                cost_specpilot=cost["specpilot"], cost_no_sd=cost["none"], cost_always_sd=cost["always"]))
    return rows


def write_reports(result: DemoResult, scenario: DemoScenario, rows: list[Row], out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    written = []
    report = {
        "wall_s": round(result.wall_s, 1),
        "profiles": [{"name": p["metadata"]["name"], "sku": p["spec"]["sku"],
                      "method": (p["spec"].get("method") or {}).get("method", "baseline"),
                      "phase": (p.get("status") or {}).get("phase")} for p in result.profiles],
        "decisions": {p["name"]: p.get("decision") for p in result.status.get("pools") or []},
        "joined_pool": result.joined_pool, "joined_pool_profiled": result.joined_pool_profiled,
        "client_errors": result.errors, "processes_left": result.processes_left,
        "rows": [asdict(r) for r in rows],
    }
    path = out / "demo.json"
    path.write_text(json.dumps(report, indent=2, default=str))
    written.append(path)
    lines = ["# specpilot demo", "", f"Wall time: {result.wall_s:.0f} s. New GPU pool `{result.joined_pool}` "
             f"profiled: {result.joined_pool_profiled}.", "",
             "| phase | pool | GPU | conc./replica | K | drafts/token | ms/token measured | ms/token no SD | "
             "ms/token always SD | $/Mtok specpilot | $/Mtok no SD | $/Mtok always SD |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r.phase} | {r.pool} | {r.sku} | {r.concurrency_per_replica} | {r.k_specpilot} | "
                     f"{_fmt(r.sd_share, 2)} | {_fmt(r.ms_per_token_measured, 1)} | {r.ms_per_token_no_sd:.1f} | "
                     f"{r.ms_per_token_always_sd:.1f} | {r.cost_specpilot:.3f} | {r.cost_no_sd:.3f} | "
                     f"{r.cost_always_sd:.3f} |")
    path = out / "demo.md"
    path.write_text("\n".join(lines) + "\n")
    written.append(path)
    written += _plots(result, rows, out)
    return written


def _fmt(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _plots(result: DemoResult, rows: list[Row], out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    if result.timeline:
        fig, ax_load = plt.subplots(figsize=(10, 4.5))
        times = [t for t, _, _ in result.timeline]
        ax_load.fill_between(times, [c for _, c, _ in result.timeline], step="post", alpha=0.2, color="grey",
                             label="requests in flight")
        ax_load.set_xlabel("seconds since the load began")
        ax_load.set_ylabel("requests in flight")
        ax_ms = ax_load.twinx()
        for pool in sorted({p for _, _, per in result.timeline for p in per}):
            points = [(t, per[pool]) for t, _, per in result.timeline if pool in per]
            ax_ms.plot([t for t, _ in points], [v for _, v in points], label=f"{pool}: ms/token")
        ax_ms.set_ylabel("ms per output token (clients)")
        ax_ms.legend(loc="upper left")
        ax_load.set_title("Load and latency per pool during the demo")
        fig.tight_layout()
        path = out / "demo-timeline.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    if rows:
        fig, ax = plt.subplots(figsize=(10, 4.5))
        labels = [f"{r.phase}\n{r.pool}" for r in rows]
        x = range(len(rows))
        width = 0.27
        ax.bar([i - width for i in x], [r.cost_no_sd for r in rows], width, label="no SD")
        ax.bar(list(x), [r.cost_always_sd for r in rows], width, label="always SD (max K)")
        ax.bar([i + width for i in x], [r.cost_specpilot for r in rows], width, label="specpilot schedule")
        ax.set_xticks(list(x), labels, fontsize=8)
        ax.set_ylabel("$ per million output tokens")
        ax.set_title("Cost per token at each phase's load (twin of each GPU type)")
        ax.legend()
        fig.tight_layout()
        path = out / "demo-cost.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    return paths
