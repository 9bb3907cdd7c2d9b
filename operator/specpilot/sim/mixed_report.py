"""Reports of a mixed-fleet comparison (`specpilot simulate --fleet`): table rows, verdict, plot, markdown, JSON.

The plot (`fleet-SCENARIO.png`, matplotlib Agg) shows over the trace, per placement policy, the arrival rate,
each pool's replicas and each pool's share of traffic (and, for a pool that joins mid-trace, when it joined
(dotted) and when it started serving (dash-dot)).
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

from .mixed import PLACEMENT_WORDS, MixedComparison

__all__ = ["FleetVerdict", "fleet_verdict", "table_rows", "write_fleet_reports"]

ATTAINMENT_TOLERANCE_POINTS = 0.1
"""SLO attainments within this many percentage points count as equal."""


def table_rows(comparison: MixedComparison) -> list[list[str]]:
    names = [p.spec.name for p in comparison.prepared]
    rows = [["placement", "$/Mtok", "within SLO", "GPU-hours", "worst pool TPOT p95 ms",
             "mean share " + " / ".join(names)]]
    for result in comparison.results:
        shares = result.mean_shares()
        rows.append([result.placement, f"{result.cost_per_mtok:.4f}", f"{result.slo_attainment:.1%}",
                     f"{result.gpu_hours:.1f}", f"{result.tpot_p95_ms:.1f}",
                     " / ".join(f"{shares[n]:.0%}" for n in names)])
    return rows


@dataclasses.dataclass(frozen=True)
class FleetVerdict:
    vs_even_split: float
    """specpilot's $/Mtok saving over today's even split (0.2: 20% lower)."""
    vs_no_sd: float
    """specpilot's $/Mtok saving over SD-unaware cost-optimal placement."""
    attainment_ok: bool
    """specpilot's SLO attainment is at least both others' (within ATTAINMENT_TOLERANCE_POINTS)."""
    carriers: tuple[str, str]
    """The pool carrying the most traffic under specpilot and under the SD-unaware placement."""

    def words(self) -> str:
        carried = (f"speculation moves the most traffic from {self.carriers[1]} to {self.carriers[0]}"
                   if self.carriers[0] != self.carriers[1] else f"{self.carriers[0]} carries the most traffic")
        return (f"specpilot: {_relative(self.vs_even_split)} than even-split, {_relative(self.vs_no_sd)} than "
                f"cost-optimal-no-sd, SLO attainment {'equal or better' if self.attainment_ok else 'LOWER'}; "
                f"{carried}")


def _relative(saving: float) -> str:
    return f"{saving:.1%} lower $/Mtok" if saving >= 0 else f"{-saving:.1%} HIGHER $/Mtok"


def fleet_verdict(comparison: MixedComparison) -> FleetVerdict:
    spec = comparison.result("specpilot")
    others = [comparison.result(p) for p in ("even-split", "cost-optimal-no-sd")]
    ok = all(spec.slo_attainment * 100 >= o.slo_attainment * 100 - ATTAINMENT_TOLERANCE_POINTS for o in others)
    return FleetVerdict(comparison.savings("specpilot", "even-split"),
                        comparison.savings("specpilot", "cost-optimal-no-sd"), ok,
                        (comparison.carrier("specpilot"), comparison.carrier("cost-optimal-no-sd")))


def plot_fleet(comparison: MixedComparison, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    results = comparison.results
    fig, axes = plt.subplots(2, len(results), figsize=(4.2 * len(results), 6.5), sharex=True, squeeze=False)
    for j, result in enumerate(results):
        timeline = result.timeline
        hours = timeline.times_s / 3600.0
        top, bottom = axes[0][j], axes[1][j]
        for name, replicas in timeline.replicas.items():
            top.step(hours, replicas, where="post", label=name)
        top.set_title(f"{result.placement}\n${result.cost_per_mtok:.4f}/Mtok, {result.slo_attainment:.1%} in SLO",
                      fontsize=9)
        top.set_ylabel("replicas")
        bottom.stackplot(hours, *[timeline.shares[n] for n in timeline.shares], labels=list(timeline.shares),
                         step="post")
        bottom.set_ylim(0, 1)
        bottom.set_ylabel("share of traffic")
        bottom.set_xlabel("hours")
        rate = comparison.trace.rate_rps(timeline.times_s)
        twin = top.twinx()
        twin.plot(hours, rate, color="grey", linewidth=0.8, linestyle="--")
        twin.set_ylabel("arrivals req/s", color="grey", fontsize=8)
        for pool in comparison.prepared:
            if pool.joining is not None:  # joined, then serving once profiled
                for ax in (top, bottom):
                    ax.axvline(pool.joining.joined_at_s / 3600.0, color="black", linewidth=0.6, linestyle=":")
                    ax.axvline(pool.joining.serving_at_s / 3600.0, color="black", linewidth=0.6, linestyle="-.")
    axes[0][0].legend(fontsize=8, loc="upper left")
    fig.suptitle(f"mixed fleet '{comparison.scenario.name}': {comparison.scenario.description}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def _jsonable(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


def write_fleet_reports(comparisons: list[MixedComparison], out_dir: Path) -> list[Path]:
    """fleet-SCENARIO.png per scenario, fleet-report.md and fleet-report.json; returns the paths written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written, lines, report = [], ["# Mixed-fleet placement comparison", ""], []
    for comparison in comparisons:
        scenario = comparison.scenario
        plot = out_dir / f"fleet-{scenario.name}.png"
        plot_fleet(comparison, plot)
        written.append(plot)
        rows = table_rows(comparison)
        verdict = fleet_verdict(comparison)
        lines += [f"## {scenario.name}", "", scenario.description, "",
                  "| " + " | ".join(rows[0]) + " |", "|" + "---|" * len(rows[0])]
        lines += ["| " + " | ".join(row) + " |" for row in rows[1:]]
        lines += ["", verdict.words(), ""]
        joined = [f"Joined: {p.joining.words()}." for p in comparison.prepared if p.joining is not None]
        lines += [*joined, *([""] if joined else []), f"![shares and replicas]({plot.name})", ""]
        report.append({"scenario": scenario.name, "description": scenario.description, "trace": scenario.trace,
                       "slo_tpot_ms": scenario.slo_tpot_ms,
                       "pools": [{"name": p.spec.name, "sku": p.spec.sku, "gpus": p.spec.gpus,
                                  "min_replicas": p.spec.min_replicas,
                                  "price_per_gpu_hour": p.setup.gpu_price_per_hour, "method": p.sd_method,
                                  "schedule": p.planning.dynamic.decision.schedule_summary}
                                 for p in comparison.prepared],
                       "placements": {r.placement: r.summary() for r in comparison.results},
                       **({"joins": [p.joining.to_dict() for p in comparison.prepared if p.joining is not None]}
                          if any(p.joining for p in comparison.prepared) else {}),
                       "verdict": dataclasses.asdict(verdict)})
    lines += ["## Placements", ""] + [f"- `{name}`: {words}" for name, words in PLACEMENT_WORDS.items()]
    md, js = out_dir / "fleet-report.md", out_dir / "fleet-report.json"
    md.write_text("\n".join(lines) + "\n")
    js.write_text(json.dumps(_jsonable(report), indent=2) + "\n")
    return [*written, md, js]
