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

from .mixed import ATTAINMENT_TOLERANCE_POINTS, PLACEMENT_WORDS, MixedComparison, PlacementResult
from .report import jsonable as _jsonable

__all__ = ["ATTAINMENT_TOLERANCE_POINTS", "Against", "FleetVerdict", "fleet_verdict", "slo_words", "table_rows",
           "write_fleet_reports"]


def slo_words(comparison: MixedComparison) -> str:
    """How attainment is counted, with the scenario's SLOs."""
    s = comparison.scenario
    return (f"within SLO: per request, TTFT <= {s.slo_ttft_ms:g} ms and TPOT <= {s.slo_tpot_ms:g} ms; a request "
            "unfinished at the end is a miss")


def _cost(value: float) -> str:
    return f"{value:.4f}" if math.isfinite(value) else "-"


def table_rows(comparison: MixedComparison) -> list[list[str]]:
    """Per placement: $/Mtok over every token and over the tokens of requests within both SLOs, attainment per
    SLO, GPU-hours, replica changes per pool per hour and the mean traffic shares."""
    names = [p.spec.name for p in comparison.prepared]
    pools = "/".join(names)
    # two-line headers (a newline; the markdown report joins them) keep the table within 132 columns
    rows = [["placement", "$/Mtok", "$/Mtok\nin SLO", "in\nTTFT", "in\nTPOT", "in\nboth", "GPU-\nhours",
             f"replica changes/h\n{pools}", f"mean share\n{pools}"]]
    for result in comparison.results:
        shares = result.mean_shares()
        changes = result.timeline.replica_changes_per_hour()
        rows.append([result.placement, _cost(result.cost_per_mtok), _cost(result.cost_per_mtok_within_slo),
                     f"{result.ttft_attainment:.1%}", f"{result.tpot_attainment:.1%}",
                     f"{result.slo_attainment:.1%}", f"{result.gpu_hours:.1f}",
                     "/".join(f"{changes[n]:.0f}" for n in names),
                     "/".join(f"{shares[n]:.0%}" for n in names)])
    return rows


SAVING_SOURCES = {
    "even-split": "placing traffic by cost per token across GPU types with weighted routing",
    "specpilot-service": "weighted routing alone",
    "cost-optimal-no-sd": "speculation",
}
"""What separates specpilot from each baseline, in the order the verdict takes them: today's even split differs in
placement and routing, specpilot-service (the same plan behind one Service) in routing alone, cost-optimal-no-sd
(the same placement by cost per token) in speculation alone."""
TIE = 0.005
"""Savings and changes under half a percent are ties: the simulation's own noise is about that size."""


@dataclasses.dataclass(frozen=True)
class Against:
    """specpilot against one baseline placement: its $/Mtok saving split into GPU-hours and price per GPU-hour."""

    placement: str
    saving: float
    """$/Mtok saving (0.2: 20% lower)."""
    gpu_hours_saving: float
    """GPU-hours saving: fewer replicas over the trace."""
    price_saving: float
    """Saving in dollars per GPU-hour: cheaper GPU types carrying the load."""
    slo_attainment: float
    """The baseline's share of requests within both SLOs."""


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
    vs_even_split_hpa: float | None = None
    """specpilot's $/Mtok saving over the even split tuned to its attainment (None: not run)."""
    hpa_reached: bool = True
    """Whether the tuned even split reached specpilot's attainment."""
    over_oracle: float | None = None
    """How much more specpilot's $/Mtok within SLO is than the clairvoyant oracle's (0.05: 5% more)."""
    cost_per_mtok: float = math.nan
    slo_attainment: float = math.nan
    """specpilot's $/Mtok and share of requests within both SLOs."""
    against: tuple[Against, ...] = ()
    """specpilot against each baseline of SAVING_SOURCES that ran, in that order."""

    def words(self) -> str:
        text = f"specpilot pays ${self.cost_per_mtok:.4f}/Mtok with {self.slo_attainment:.1%} of requests within SLO"
        clauses = [self._against_words(a) for a in self.against]
        if clauses:
            text += ": " + "; ".join(clauses)
        if self.vs_even_split_hpa is not None:
            text += (f"; {_relative(self.vs_even_split_hpa)} even-split-hpa "
                     + ("tuned to reach its attainment" if self.hpa_reached else "(which never reaches it)"))
        if self.over_oracle is not None:
            text += f"; $/Mtok in SLO {self.over_oracle:+.1%} against the oracle's"
        return text

    def _against_words(self, a: Against) -> str:
        figures = []
        if abs(a.gpu_hours_saving) >= TIE:
            fewer = "fewer" if a.gpu_hours_saving > 0 else "more"
            figures.append(f"{abs(a.gpu_hours_saving):.1%} {fewer} GPU-hours")
        if abs(a.price_saving) >= TIE:
            figures.append(f"{abs(a.price_saving):.1%} {'cheaper' if a.price_saving > 0 else 'dearer'} per GPU-hour")
        gap = (a.slo_attainment - self.slo_attainment) * 100
        source = SAVING_SOURCES[a.placement]
        if a.saving < TIE:
            level = "as much as" if a.saving > -TIE else _relative(a.saving)
            shown = f" ({', '.join(figures)})" if figures else ""
            if gap < -ATTAINMENT_TOLERANCE_POINTS:  # the baseline is cheaper by missing the SLO
                return (f"{level} {a.placement}, which keeps only {a.slo_attainment:.1%} within SLO: specpilot pays "
                        f"for keeping the rest within it{shown}")
            return f"{level} {a.placement}: {source.removesuffix(' alone')} saves nothing here{shown}"
        if abs(gap) > ATTAINMENT_TOLERANCE_POINTS:
            figures.append(f"{'but ' if gap > 0 else ''}{a.slo_attainment:.1%} within SLO there")
        shown = f" ({', '.join(figures)})" if figures else ""
        if a.placement == "cost-optimal-no-sd":
            why = ["each replica holds more requests within the SLO"] if a.gpu_hours_saving >= TIE else []
            if self.carriers[0] != self.carriers[1]:
                why.append(f"the most traffic moves from {self.carriers[1]} to {self.carriers[0]}")
            elif a.price_saving >= TIE:
                why.append("more of the load goes to cheaper GPU types")
            source += f", as {' and '.join(why)}" if why else ""
        return f"{_relative(a.saving)} {a.placement}, from {source}{shown}"


def _relative(saving: float) -> str:
    return f"{saving:.1%} less than" if saving >= 0 else f"{-saving:.1%} more than"


def _against(spec: PlacementResult, base: PlacementResult) -> Against:
    return Against(base.placement, 1.0 - spec.cost_per_mtok / base.cost_per_mtok,
                   1.0 - spec.gpu_hours / base.gpu_hours,
                   1.0 - (spec.cost_usd / spec.gpu_hours) / (base.cost_usd / base.gpu_hours), base.slo_attainment)


def fleet_verdict(comparison: MixedComparison) -> FleetVerdict:
    spec = comparison.result("specpilot")
    others = [comparison.result(p) for p in ("even-split", "cost-optimal-no-sd")]
    ok = all(spec.slo_attainment * 100 >= o.slo_attainment * 100 - ATTAINMENT_TOLERANCE_POINTS for o in others)
    hpa = comparison.result("even-split-hpa") if comparison.has("even-split-hpa") else None
    oracle = comparison.result("oracle") if comparison.has("oracle") else None
    over_oracle = (spec.cost_per_mtok_within_slo / oracle.cost_per_mtok_within_slo - 1.0
                   if oracle is not None and math.isfinite(oracle.cost_per_mtok_within_slo) else None)
    return FleetVerdict(comparison.savings("specpilot", "even-split"),
                        comparison.savings("specpilot", "cost-optimal-no-sd"), ok,
                        (comparison.carrier("specpilot"), comparison.carrier("cost-optimal-no-sd")),
                        comparison.savings("specpilot", "even-split-hpa") if hpa is not None else None,
                        hpa.tuning.reached if hpa is not None and hpa.tuning is not None else True,
                        over_oracle, spec.cost_per_mtok, spec.slo_attainment,
                        tuple(_against(spec, comparison.result(p)) for p in SAVING_SOURCES if comparison.has(p)))


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
        top.set_title(f"{result.placement}\n${result.cost_per_mtok:.4f}/Mtok, {result.slo_attainment:.1%} in both SLOs",
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
                  "| " + " | ".join(c.replace("\n", " ") for c in rows[0]) + " |", "|" + "---|" * len(rows[0])]
        lines += ["| " + " | ".join(row) + " |" for row in rows[1:]]
        lines += ["", slo_words(comparison) + ".", "", verdict.words(), ""]
        lines += [f"even-split-hpa: {r.tuning.words()}." for r in comparison.results if r.tuning is not None]
        joined = [f"Joined: {p.joining.words()}." for p in comparison.prepared if p.joining is not None]
        lines += [*joined, *([""] if joined else []), f"![shares and replicas]({plot.name})", ""]
        report.append({"scenario": scenario.name, "description": scenario.description, "trace": scenario.trace,
                       "trace_described": comparison.trace.describe(),
                       "slo_tpot_ms": scenario.slo_tpot_ms, "slo_ttft_ms": scenario.slo_ttft_ms,
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
