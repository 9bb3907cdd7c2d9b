"""Reports of a `specpilot simulate` comparison: verdict, PNG plots, markdown and JSON.

Plots (matplotlib, Agg backend, so no display is needed):
- `speedup-SKU.png`: per candidate method, goodput speedup over no speculation vs concurrency for each k,
  as the planner sees it from the profiles, with the schedule specpilot picked drawn on top;
- `timeline-SKU.png`: over the trace, per policy: arrival rate, replicas, cost per hour and TPOT SLO
  attainment.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import numpy as np

from .fleet import SimResult
from .policies import PlanningInputs, PoolPlanning
from .traces import LoadTrace

__all__ = ["Comparison", "Verdict", "jsonable", "verdict", "write_reports"]

AUTOSCALE_POLICY = "specpilot+autoscale"
BASELINE_POLICIES = ("no-sd", "always-on", "static<32", "restart-toggle")
"""The fixed policies (fixed replicas, no specpilot schedule) specpilot+autoscale is judged against."""
ATTAINMENT_TOLERANCE_POINTS = 0.1
"""SLO attainments within this many percentage points count as equal (a request in a thousand)."""


@dataclasses.dataclass
class Comparison:
    """One SKU's comparison: what was planned, the policies' results and how long it took."""

    inputs: PlanningInputs
    trace: LoadTrace
    planning: PoolPlanning
    results: list[SimResult]
    descriptions: dict[str, str]
    seconds: float

    @property
    def sku(self) -> str:
        return self.inputs.setup.sku

    def result(self, policy: str) -> SimResult | None:
        return next((r for r in self.results if r.policy == policy), None)


MIN_COST_GAIN_PERCENT = 0.5
"""Cheaper by less than this is a tie, not a win: the simulation's own noise is about that size."""


@dataclasses.dataclass(frozen=True)
class Verdict:
    """Whether specpilot+autoscale costs less per token than every fixed policy at equal or better SLO
    attainment, and by how much against each."""

    beats_all: bool
    rows: tuple[tuple[str, float, float, bool], ...]
    """(fixed policy, $/Mtok change in %, attainment change in percentage points, beaten)."""

    def words(self) -> str:
        if not self.rows:
            return "no fixed policy to compare with"
        lost = [name for name, *_, beaten in self.rows if not beaten]
        cheapest = min(self.rows, key=lambda r: r[1])
        dearest = max(self.rows, key=lambda r: r[1])
        if self.beats_all:
            low, high = -dearest[1], -cheapest[1]
            span = f"{low:.0f}%" if round(low) == round(high) else f"{low:.0f}-{high:.0f}%"
            return (f"{AUTOSCALE_POLICY} beats every fixed policy: {span} lower $/Mtok at equal or better "
                    f"SLO attainment")
        return (f"{AUTOSCALE_POLICY} does not beat {', '.join(lost)} by {MIN_COST_GAIN_PERCENT:g}% or more on $/Mtok "
                f"at equal or better SLO attainment")


def verdict(results: list[SimResult]) -> Verdict:
    ours = next((r for r in results if r.policy == AUTOSCALE_POLICY), None)
    if ours is None:
        return Verdict(False, ())
    rows = []
    for r in results:
        if r.policy not in BASELINE_POLICIES:
            continue
        cost_change = (ours.cost_per_mtok / r.cost_per_mtok - 1.0) * 100.0
        attainment_change = (ours.slo_attainment - r.slo_attainment) * 100.0
        beaten = cost_change <= -MIN_COST_GAIN_PERCENT and attainment_change >= -ATTAINMENT_TOLERANCE_POINTS
        rows.append((r.policy, cost_change, attainment_change, beaten))
    return Verdict(bool(rows) and all(row[3] for row in rows), tuple(rows))


# ---- plots -------------------------------------------------------------------------------------------------
def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_speedup(comparison: Comparison, path: Path) -> None:
    """Speedup over no speculation vs concurrency per candidate and k, with the picked schedule."""
    plt = _pyplot()
    rows = [r for r in comparison.planning.dynamic.candidates[1:] if r.ready and r.schedule and r.schedule.surface]
    chosen_key = comparison.planning.dynamic.decision.method
    fig, axes = plt.subplots(1, max(len(rows), 1), figsize=(5.2 * max(len(rows), 1), 4.2), squeeze=False,
                             sharey=True)
    c = np.unique(np.geomspace(1, comparison.inputs.max_num_seqs, 120).round().astype(int))
    for ax, row in zip(axes[0], rows, strict=False):
        surface = row.schedule.surface
        cmap = plt.get_cmap("viridis")
        ks = [k for k in surface.available_k() if k > 0]
        for i, k in enumerate(ks):
            ax.plot(c, [surface.speedup(k, float(x)) for x in c], color=cmap(i / max(len(ks) - 1, 1)),
                    lw=1.2, label=f"k={k}")
        scheduled = [row.schedule.k_at(int(x)) for x in c]
        ax.plot(c, [surface.speedup(k, float(x)) if k else 1.0 for k, x in zip(scheduled, c, strict=True)],
                color="black", lw=2.6, alpha=0.8, label="schedule")
        ax.axhline(1.0, color="grey", lw=0.8, ls="--")
        if row.crossover_concurrency:
            ax.axvline(row.crossover_concurrency, color="tab:red", lw=0.8, ls=":", label="crossover")
        for level in surface.levels:
            ax.axvline(level, color="grey", lw=0.3, alpha=0.4)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrent requests per replica (batch size)")
        chosen = " (chosen)" if row.key == chosen_key else ""
        ax.set_title(f"{row.key}{chosen}\n{_schedule_text(row)}", fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="upper right")
    axes[0][0].set_ylabel("goodput speedup over k=0")
    fig.suptitle(f"{comparison.inputs.setup.model_id} on {comparison.sku}, {comparison.inputs.setup.workload}: "
                 f"speedup per k from the profiles", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _schedule_text(row) -> str:
    from ..api.schedule import summary

    return "schedule " + (summary(row.schedule.ranges) if row.schedule.ranges else "none")


def plot_timeline(comparison: Comparison, path: Path) -> None:
    """Load, replicas, cost per hour and SLO attainment over the trace, per policy."""
    plt = _pyplot()
    fig, axes = plt.subplots(4, 1, figsize=(10, 10), sharex=True)
    first = comparison.results[0].timeseries
    hours = first["t_s"] / 3600.0
    axes[0].plot(hours, first["arrival_rps"], color="black", lw=1.0, label="arrivals")
    t = np.linspace(0, comparison.trace.duration_s, 400)
    axes[0].plot(t / 3600.0, comparison.trace.rate_rps(t), color="tab:grey", lw=1.0, ls="--", label="trace")
    axes[0].set_ylabel("requests/s")
    axes[0].legend(fontsize=8)
    styles = ["-", "--", "-.", ":"]
    for i, result in enumerate(comparison.results):
        ts = result.timeseries
        style = dict(lw=2.2 if result.policy.startswith("specpilot") else 1.2, ls=styles[i % len(styles)],
                     label=result.policy)
        axes[1].plot(hours, ts["replicas"], **style)
        axes[2].plot(hours, ts["cost_usd_per_hour"], **style)
        axes[3].plot(hours, ts["slo_attainment"] * 100.0, **style)
    axes[1].set_ylabel("replicas (billed)")
    axes[2].set_ylabel("cost, $/hour")
    slo = comparison.inputs.slo_tpot_ms
    axes[3].set_ylabel(f"requests within\nTPOT {slo:g} ms (and TTFT), %" if slo else "completed, %")
    axes[3].set_xlabel("hours into the trace")
    axes[1].legend(fontsize=7, ncol=2)
    for ax in axes:
        ax.grid(alpha=0.3)
    fig.suptitle(f"{comparison.inputs.setup.model_id} on {comparison.sku}: {comparison.trace.describe()}",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ---- text reports ------------------------------------------------------------------------------------------
def _num(value: float, spec: str) -> str:
    return "-" if value is None or (isinstance(value, float) and not math.isfinite(value)) else format(value, spec)


def table_rows(comparison: Comparison) -> list[list[str]]:
    """Rows of the comparison table (header first), shared by the terminal and the markdown report."""
    slo = comparison.inputs.slo_tpot_ms
    ttft = next((r.slo_ttft_ms for r in comparison.results if r.slo_ttft_ms), None)
    within = f"within {slo:g} ms SLO" if slo else "completed"
    if ttft:
        within = f"TPOT {slo:g} & TTFT {ttft:g} ms" if slo else f"within TTFT {ttft:g} ms"
    header = ["policy", "output tok/s", "TPOT p50 / p95 ms", "TTFT p50 / p95 ms", within, "GPU-hours", "$/Mtok"]
    rows = [header]
    for r in comparison.results:
        rows.append([r.policy, _num(r.output_tok_s, ",.0f"),
                     f"{_num(r.tpot_p50_ms, '.1f')} / {_num(r.tpot_p95_ms, '.1f')}",
                     f"{_num(r.ttft_p50_ms, ',.0f')} / {_num(r.ttft_p95_ms, ',.0f')}",
                     _num(r.slo_attainment * 100, ".1f") + "%", _num(r.gpu_hours, ".1f"),
                     _num(r.cost_per_mtok, ".4f")])
    return rows


def _markdown_table(rows: list[list[str]]) -> str:
    align = "|".join("---" if i == 0 else "---:" for i in range(len(rows[0])))
    lines = ["| " + " | ".join(rows[0]) + " |", f"|{align}|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows[1:]]
    return "\n".join(lines)


def markdown(comparisons: list[Comparison], files: dict[str, list[str]]) -> str:
    parts = ["# specpilot simulate", ""]
    for comp in comparisons:
        setup, inputs, decision = comp.inputs.setup, comp.inputs, comp.planning.dynamic.decision
        parts += [
            f"## {setup.model_id} on {comp.sku} (tensor parallel {setup.tensor_parallel_size})", "",
            f"- workload: {setup.workload}; trace: {comp.trace.describe()}",
            f"- candidates: {', '.join(f'{c.method} (K<={c.max_k})' for c in inputs.candidates)}",
            f"- replicas: {inputs.replicas} fixed; autoscaling between {inputs.min_replicas} and "
            f"{inputs.max_replicas}; TPOT SLO: {_num(inputs.slo_tpot_ms, 'g')} ms; "
            f"${setup.gpu_price_per_hour:g} per GPU-hour",
            f"- specpilot's decision: {decision.reason}",
            f"- schedule: `{decision.schedule_summary or 'no speculation'}`",
            f"- capacity per replica within the SLO: "
            f"{_num(comp.planning.dynamic.capacity_concurrency_per_replica, 'g')} concurrent requests",
            "", _markdown_table(table_rows(comp)), "",
            f"**Verdict:** {verdict(comp.results).words()}.", "",
            "### Policies", "",
        ]
        parts += [f"- `{name}`: {text}" for name, text in comp.descriptions.items()]
        parts += ["", "### Plots", ""]
        parts += [f"![{Path(f).stem}]({Path(f).name})" for f in files.get(comp.sku, [])]
        ours = comp.result(AUTOSCALE_POLICY)
        if ours and ours.events:
            parts += ["", f"### {AUTOSCALE_POLICY} scaling events", ""]
            parts += [f"- {t / 60:.1f} min: {what}" for t, what in ours.events[:40]]
            if len(ours.events) > 40:
                parts.append(f"- ... {len(ours.events) - 40} more")
        parts += ["", f"Simulated in {comp.seconds:.1f} s.", ""]
    return "\n".join(parts)


def jsonable(value):
    """`value` with every non-finite float, in dicts, lists and tuples too, made None (JSON has no inf or NaN)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    return value


def report_json(comparisons: list[Comparison]) -> dict:
    out = []
    for comp in comparisons:
        decision = comp.planning.dynamic.decision
        v = verdict(comp.results)
        out.append({
            "model": comp.inputs.setup.model_id, "sku": comp.sku, "workload": comp.inputs.setup.workload,
            "tensor_parallel_size": comp.inputs.setup.tensor_parallel_size,
            "trace": comp.trace.describe(), "duration_s": comp.trace.duration_s,
            "candidates": [dataclasses.asdict(c) for c in comp.inputs.candidates],
            "replicas": comp.inputs.replicas, "min_replicas": comp.inputs.min_replicas,
            "max_replicas": comp.inputs.max_replicas, "slo_tpot_ms": comp.inputs.slo_tpot_ms,
            "price_per_gpu_hour": comp.inputs.setup.gpu_price_per_hour,
            "decision": {"method": decision.method, "schedule": decision.schedule_summary,
                         "crossover_concurrency": decision.crossover_concurrency, "reason": decision.reason,
                         "capacity_concurrency_per_replica": comp.planning.dynamic.capacity_concurrency_per_replica},
            "policies": [{**jsonable(r.summary()),
                          "description": comp.descriptions.get(r.policy, ""),
                          "events": [[t, what] for t, what in r.events],
                          "timeseries": {k: jsonable([float(x) for x in a]) for k, a in r.timeseries.items()}}
                         for r in comp.results],
            "verdict": {"beats_all_fixed": v.beats_all, "words": v.words(),
                        "against": [{"policy": p, "cost_per_mtok_change_percent": c, "slo_attainment_change_points": a,
                                     "beaten": b} for p, c, a, b in v.rows]},
            "seconds": comp.seconds,
        })
    return {"comparisons": out}


def write_reports(comparisons: list[Comparison], out_dir: Path) -> list[Path]:
    """Write the plots, report.md and report.json into `out_dir`; returns the paths written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    files: dict[str, list[str]] = {}
    for comp in comparisons:
        speedup = out_dir / f"speedup-{comp.sku}.png"
        timeline = out_dir / f"timeline-{comp.sku}.png"
        plot_speedup(comp, speedup)
        plot_timeline(comp, timeline)
        files[comp.sku] = [str(speedup), str(timeline)]
        written += [speedup, timeline]
    md = out_dir / "report.md"
    md.write_text(markdown(comparisons, files))
    js = out_dir / "report.json"
    js.write_text(json.dumps(report_json(comparisons), indent=1))
    return written + [md, js]
