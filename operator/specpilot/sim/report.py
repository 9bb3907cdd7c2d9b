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
PLAIN_AUTOSCALE_POLICY = "no-sd+autoscale"
"""No speculation, autoscaled to the same TPOT SLO: what specpilot+autoscale's cost is judged against."""
FIXED_POLICY = "specpilot"
PLAIN_FIXED_POLICY = "no-sd"
"""At the same fixed replicas: what specpilot's latency is judged against (their cost is the same)."""
BASELINE_POLICIES = ("no-sd", "always-on", "static<32", "restart-toggle")
"""The fixed policies (fixed replicas, no specpilot schedule) report.json compares specpilot+autoscale with."""
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


def _change_percent(ours: float, theirs: float) -> float:
    return (ours / theirs - 1.0) * 100.0


def _hours(gpu_hours: float) -> str:
    return f"{gpu_hours:.2f}" if gpu_hours < 10 else f"{gpu_hours:.1f}"


def _attainments(ours: SimResult, theirs: SimResult) -> str:
    a, b = f"{ours.slo_attainment * 100:.1f}%", f"{theirs.slo_attainment * 100:.1f}%"
    return f"{a} of requests within SLO for both" if a == b else f"{a} of requests within SLO against {b}"


@dataclasses.dataclass(frozen=True)
class Verdict:
    """What speculation buys in one comparison, like with like. A replica costs the same per hour whatever it
    runs, so at fixed replicas speculation changes latency, not cost; it saves money only through the replicas:
    lower latency per token lets a replica hold more requests within the TPOT SLO, and the SD-aware autoscaler
    runs fewer. Hence specpilot+autoscale is judged on $/Mtok against no SD autoscaled to the same SLO, and
    specpilot on latency against no SD at the same fixed replicas.

    `rows` and `beats_all` compare specpilot+autoscale with the fixed-replica policies (the autoscaler's saving
    and speculation's together); report.json keeps them."""

    beats_all: bool
    rows: tuple[tuple[str, float, float, bool], ...]
    """(fixed policy, $/Mtok change in %, attainment change in percentage points, beaten)."""
    autoscaled: tuple[SimResult, SimResult] | None = None
    """(specpilot+autoscale, no-sd+autoscale)."""
    fixed: tuple[SimResult, SimResult] | None = None
    """(specpilot, no-sd) at the same fixed replicas."""

    @property
    def wins(self) -> bool:
        """specpilot+autoscale costs at least MIN_COST_GAIN_PERCENT less per token than no SD autoscaled to the
        same SLO, with as many requests within the SLO or more."""
        if self.autoscaled is None:
            return False
        ours, plain = self.autoscaled
        return (_change_percent(ours.cost_per_mtok, plain.cost_per_mtok) <= -MIN_COST_GAIN_PERCENT
                and (ours.slo_attainment - plain.slo_attainment) * 100 >= -ATTAINMENT_TOLERANCE_POINTS)

    def words(self) -> str:
        parts = [text for text in (self._autoscaled_words(), self._fixed_words()) if text]
        return "; ".join(parts) or "no policies to compare like with like"

    def _autoscaled_words(self) -> str | None:
        if self.autoscaled is None:
            return None
        ours, plain = self.autoscaled
        cost = _change_percent(ours.cost_per_mtok, plain.cost_per_mtok)
        hours = _change_percent(ours.gpu_hours, plain.gpu_hours)
        baseline = f"no SD autoscaled to the same {ours.slo_tpot_ms:g} ms TPOT SLO"
        replica_hours = f"{_hours(ours.gpu_hours)} against {_hours(plain.gpu_hours)} GPU-hours"
        if self.wins:
            head = (f"{AUTOSCALE_POLICY} pays ${ours.cost_per_mtok:.4f}/Mtok against ${plain.cost_per_mtok:.4f} for "
                    f"{baseline} ({-cost:.1f}% less, {_attainments(ours, plain)})")
            if hours <= -MIN_COST_GAIN_PERCENT:
                return (f"{head}: speculation lets each replica hold more requests within the SLO, so it runs "
                        f"{-hours:.1f}% fewer replica-hours ({replica_hours})")
            tokens = _change_percent(ours.output_tokens, plain.output_tokens)
            return (f"{head}: it runs as many replica-hours ({replica_hours}) and serves {tokens:.1f}% more tokens "
                    f"in them, as without speculation the replicas fall behind the load")
        if cost <= -MIN_COST_GAIN_PERCENT:  # cheaper, but by missing requests the baseline serves within the SLO
            return (f"{AUTOSCALE_POLICY} pays ${ours.cost_per_mtok:.4f}/Mtok against ${plain.cost_per_mtok:.4f} for "
                    f"{baseline} ({-cost:.1f}% less) but keeps fewer requests within the SLO "
                    f"({_attainments(ours, plain)}): it saves by running too few replicas for the load, not a "
                    f"like-for-like saving")
        than = "no less than" if cost < MIN_COST_GAIN_PERCENT else f"{cost:.1f}% more than"
        head = (f"{AUTOSCALE_POLICY} does not save: it pays ${ours.cost_per_mtok:.4f}/Mtok, {than} "
                f"${plain.cost_per_mtok:.4f} for {baseline}")
        if np.array_equal(ours.timeseries.get("replicas"), plain.timeseries.get("replicas")):
            return (f"{head}, because both autoscalers ran the same replicas throughout: this load never needed a "
                    f"replica that speculation could save")
        return (f"{head}, because speculation did not let it run fewer replicas ({replica_hours}): at this load "
                f"and SLO it does not raise what a replica holds within the SLO enough to save one")

    def _fixed_words(self) -> str | None:
        if self.fixed is None:
            return None
        ours, plain = self.fixed
        replicas = plain.timeseries.get("replicas")
        count = f" {round(float(np.max(replicas)))}" if replicas is not None and len(replicas) else ""
        text = (f"at the same{count} fixed replicas speculation changes latency, not cost: TPOT p50 "
                f"{ours.tpot_p50_ms:.1f} ms with {FIXED_POLICY}'s schedule against {plain.tpot_p50_ms:.1f} ms "
                f"without SD")
        if ours.tpot_p50_ms > plain.tpot_p50_ms * (1 + MIN_COST_GAIN_PERCENT / 100):
            text += " (slower: at this load the drafter costs more time per step than its accepted tokens save)"
        text += f", {_attainments(ours, plain)}"
        if abs(_change_percent(ours.cost_per_mtok, plain.cost_per_mtok)) < MIN_COST_GAIN_PERCENT:
            a, b = f"${ours.cost_per_mtok:.4f}", f"${plain.cost_per_mtok:.4f}"
            return text + (f", at the same {a}/Mtok" if a == b else f", at the same cost ({a} and {b}/Mtok)")
        text += f", ${ours.cost_per_mtok:.4f} against ${plain.cost_per_mtok:.4f}/Mtok"
        if abs(_change_percent(ours.gpu_hours, plain.gpu_hours)) >= MIN_COST_GAIN_PERCENT:
            return text + " as its rollouts add replica-hours"
        tokens = _change_percent(ours.output_tokens, plain.output_tokens)
        return text + f" as the same replica-hours serve {tokens:+.1f}% tokens"


def verdict(results: list[SimResult]) -> Verdict:
    by_policy = {r.policy: r for r in results}
    ours = by_policy.get(AUTOSCALE_POLICY)
    rows = []
    for r in results:
        if ours is None or r.policy not in BASELINE_POLICIES:
            continue
        cost_change = _change_percent(ours.cost_per_mtok, r.cost_per_mtok)
        attainment_change = (ours.slo_attainment - r.slo_attainment) * 100.0
        beaten = cost_change <= -MIN_COST_GAIN_PERCENT and attainment_change >= -ATTAINMENT_TOLERANCE_POINTS
        rows.append((r.policy, cost_change, attainment_change, beaten))

    def pair(a: str, b: str) -> tuple[SimResult, SimResult] | None:
        return (by_policy[a], by_policy[b]) if a in by_policy and b in by_policy else None

    return Verdict(bool(rows) and all(row[3] for row in rows), tuple(rows),
                   pair(AUTOSCALE_POLICY, PLAIN_AUTOSCALE_POLICY), pair(FIXED_POLICY, PLAIN_FIXED_POLICY))


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


def _pair_json(pair: tuple[SimResult, SimResult] | None) -> dict | None:
    """A like-for-like pair of the verdict: which policy against which, and the changes its words give."""
    if pair is None:
        return None
    ours, theirs = pair
    return jsonable({"policy": ours.policy, "against": theirs.policy,
                     "cost_per_mtok_change_percent": _change_percent(ours.cost_per_mtok, theirs.cost_per_mtok),
                     "gpu_hours_change_percent": _change_percent(ours.gpu_hours, theirs.gpu_hours),
                     "tpot_p50_ms": [ours.tpot_p50_ms, theirs.tpot_p50_ms],
                     "slo_attainment_change_points": (ours.slo_attainment - theirs.slo_attainment) * 100.0})


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
            "verdict": {"words": v.words(), "wins": v.wins, "autoscaled": _pair_json(v.autoscaled),
                        "fixed_replicas": _pair_json(v.fixed), "beats_all_fixed": v.beats_all,
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
