"""The demo's summary: per phase and pool, what specpilot's configuration delivered (measured by the
clients) against no speculation and always-on speculation at the same load, plus PNG plots and a
JSON/markdown report.

All three ms/token columns are the simulated GPU's: the clients time each request with the virtual clock of
the replica it went to (`demo.load`), and the no-SD and always-SD columns are what the same simulated engine
(its continuous batching over the twin, prefill and time to first token included) measures at that load per
client in a host-free replay (`engine_core.closed_loop_ms_per_token`). So they compare like for like, and the
only difference left is the speculative configuration. Every $/Mtok column is computed from the ms/token
beside it the same way (`COST_BASIS`)."""

from __future__ import annotations

import functools
import json
from dataclasses import asdict, dataclass
from pathlib import Path

from specpilot.api.methods import CandidateMethod
from specpilot.api.schedule import ScheduleRange, k_at
from specpilot.perf.catalog import DEFAULT_CATALOG
from specpilot.perf.cost import cost_per_million_tokens, tokens_per_second

from ..engine import build_config, make_core, tokenize
from ..engine_core import closed_loop_ms_per_token
from ..fidelity import FIDELITY_BOUND_PERCENT
from .load import demo_prompts
from .run import DemoResult, PhaseResult
from .scenario import DemoScenario

WITHIN_PERCENT = 3.0
"""How close (measured ms/token) the decided configuration must come to the better fixed policy at a phase's
load for its row to need no note."""
PROFILED = ("profile", "live-acceptance")
"""Decision sources made from the pool's own profiles (the others: none yet, or a prior)."""


@dataclass
class Row:
    phase: str
    pool: str
    sku: str
    concurrency_per_replica: float
    method: str | None
    """The method the decision in force serves (None: no speculation at all, the plain engine)."""
    k_specpilot: int
    drafts_per_request_step: float | None
    """What the engines did over the phase (their counters, `specdec.drafts_per_request_step`): 0 = off."""
    ms_per_token_measured: float | None
    """What the clients measured (each request on its replica's virtual clock): the mean over the phase's
    requests of end-to-end ms per output token."""
    ms_per_token_no_sd: float
    """What the same simulated engine measures at this load without speculation (host-free replay)."""
    ms_per_token_always_sd: float
    """... with speculation always on at the method's largest K."""
    ms_per_token_specpilot_engine: float
    """... with the configuration in force (the figure the measured column should match)."""
    ms_per_token_scheduled_off: float
    """... with the method loaded and its schedule at K=0 at every batch size: what the dynamic actuator's
    "off" costs (the drafter still prefills every prompt), against which a K=0 range is judged like for like."""
    cost_specpilot: float | None
    """From the measured ms/token, as the other two from theirs (`COST_BASIS`)."""
    cost_no_sd: float
    cost_always_sd: float
    profiled: bool = True
    """The decision in force came from the pool's profiles (False: it was still being profiled)."""
    settled: bool = True
    """No rollout during the phase (`PoolPhase.settled`)."""
    service_changed: bool = False
    """Other pods joined or left the Service during the phase (`PoolPhase.service_changed`)."""
    vs_better_fixed_percent: float | None = None
    """Measured ms/token against the better of the no-SD and always-SD columns, in percent (+ = slower)."""
    note: str = ""
    """Why the row is more than WITHIN_PERCENT from the better fixed policy ("" when it is not)."""
    phase_index: int = 0
    """Which of the trace's phases (phases may share a name)."""
    replicas: int = 1
    """The pool's replicas serving at the end of the phase."""
    price_per_gpu_hour: float = 0.0
    tokens_per_second_per_replica: float | None = None
    """What cost_specpilot is computed from (`COST_BASIS`): requests per replica x 1000 / measured ms/token."""


MAX_BATCH = 256
"""The simulated engines' --max-num-seqs default: the largest batch a schedule covers."""


def summary_rows(result: DemoResult, scenario: DemoScenario) -> list[Row]:
    """A row per phase and pool that served load with a GPU type, the joined pool's included."""
    pools = {p["name"]: p for p in result.status.get("pools") or []}
    spec = scenario.deployment()["spec"]
    prompt_tokens = tuple(len(tokenize(p)) for p in demo_prompts())
    rows = []
    for index, phase in enumerate(result.phases):
        for name, measured in sorted(phase.pools.items()):
            pool = pools.get(name) or {}
            decision = phase.decisions.get(name) or {}
            sku = pool.get("sku")
            if not sku or measured.concurrency_per_replica <= 0:
                continue
            # A pool without a method in force (none decided yet, or no speculation) is compared with the
            # first listed method's always-on SD.
            chosen = decision.get("method")
            candidate = CandidateMethod.model_validate(next(
                (m for m in spec["methods"] if (m.get("name") or m["method"].replace("_", "-")) == chosen),
                spec["methods"][0]))
            price = DEFAULT_CATALOG.resolve(sku).default_price_per_gpu_hour
            batch = max(1, round(measured.concurrency_per_replica))
            schedule = [ScheduleRange.model_validate(r) for r in decision.get("schedule") or []]
            k = (k_at(schedule, batch) if schedule else int(decision.get("numSpeculativeTokens") or 0)) if chosen else 0
            configs = {
                "none": None,
                "always": candidate.speculative_config(),
                "specpilot": candidate.speculative_config(decision.get("numSpeculativeTokens") or None, schedule)
                if chosen and (schedule or k) else None,
                "scheduled_off": candidate.speculative_config(None, [ScheduleRange(
                    from_batch_size=1, to_batch_size=MAX_BATCH, num_speculative_tokens=0)]),
            }
            # What the same simulated engine measures at this load under each configuration, host-free: a burst
            # of `batch` requests, then as many requests as each replica's clients measured, the same prompts
            # in the same turn (`demo.load`).
            ms = {key: _ms_per_token(spec["model"]["id"], sku, config, scenario.sim.workload, batch, prompt_tokens,
                                     scenario.output_len, measured.requests_per_replica or None)
                  for key, config in configs.items()}
            row = Row(
                phase=phase.phase.name, pool=name, sku=sku,
                concurrency_per_replica=round(measured.concurrency_per_replica, 1), method=chosen, k_specpilot=k,
                drafts_per_request_step=measured.drafts_per_request_step,
                # Simulated ms already (the replica's virtual clock): no time scale to apply.
                ms_per_token_measured=measured.ms_per_token,
                ms_per_token_no_sd=ms["none"], ms_per_token_always_sd=ms["always"],
                ms_per_token_specpilot_engine=ms["specpilot"], ms_per_token_scheduled_off=ms["scheduled_off"],
                cost_specpilot=None if measured.ms_per_token is None
                else _cost_per_mtok(price, batch, measured.ms_per_token),
                cost_no_sd=_cost_per_mtok(price, batch, ms["none"]),
                cost_always_sd=_cost_per_mtok(price, batch, ms["always"]),
                profiled=decision.get("source") in PROFILED, settled=measured.settled,
                service_changed=measured.service_changed, phase_index=index, replicas=max(1, measured.replicas),
                price_per_gpu_hour=price, tokens_per_second_per_replica=None if measured.ms_per_token is None
                else tokens_per_second(batch, measured.ms_per_token))
            if row.ms_per_token_measured is not None:
                better = min(row.ms_per_token_no_sd, row.ms_per_token_always_sd)
                row.vs_better_fixed_percent = round(100 * (row.ms_per_token_measured / better - 1), 1)
            row.note = _note(row, decision)
            rows.append(row)
    return rows


def _cost_per_mtok(price_per_gpu_hour: float, requests_per_replica: int, ms_per_token: float) -> float:
    """COST_BASIS: one GPU per replica, over the output tokens/s one replica delivers with `requests_per_replica`
    requests in flight at `ms_per_token` each."""
    return cost_per_million_tokens(price_per_gpu_hour, 1, tokens_per_second(requests_per_replica, ms_per_token))


NOTES = {
    "profiling": ("not profiled yet",
                  "not profiled yet: the pool's profiles were not in (a GPU type that joined), so it served without "
                  "speculation, as the operator does until a pool is profiled"),
    "rollout": ("rollout", "rollout: the pool's pods did not all run the configuration in force for the whole phase"),
    "service": ("pods joined",
                "pods joined: another pool's pods joined the Service during the phase, so the load per replica "
                "moved (the row's concurrency is its time-average)"),
    "unmeasured": ("no request measured", "no request measured: none of the pool's requests both began after its "
                   "first burst and ended within the phase"),
    "drafter": ("K=0, drafter loaded",
                "K=0, drafter loaded: the schedule turns speculation off at this load, but the method stays loaded "
                "and its drafter prefills every prompt (the same engine's replay with K=0 at every batch size is "
                f"within {WITHIN_PERCENT:g}% of the measured figure)"),
    "crossover": ("crossover ±{u:.0f}%",
                  "crossover ±N%: the load sits where the decision itself says speculation's gain is known only to "
                  "±N%, and twice that covers the difference: what a profile of a few requests per level cannot "
                  "settle"),
}
"""key -> (the note a row carries, short enough for a column; the note in full, printed under the table)."""


def _noted(key: str, **values: float) -> str:
    return NOTES[key][0].format(**values)


def note_keys(rows: list[Row]) -> list[str]:
    """The NOTES keys the rows carry, in NOTES' order."""
    return [key for key, (short, _) in NOTES.items()
            if any(r.note.startswith(short.split("{")[0]) for r in rows if r.note)]


def _note(row: Row, decision: dict) -> str:
    """Why the row's measured ms/token is more than WITHIN_PERCENT off the better fixed policy, or ""."""
    gap = row.vs_better_fixed_percent
    if gap is not None and gap <= WITHIN_PERCENT:
        return ""
    if not row.profiled:
        return _noted("profiling")
    if not row.settled:
        return _noted("rollout")
    if row.service_changed:
        return _noted("service")
    if gap is None:
        return _noted("unmeasured")
    if row.method and row.k_specpilot == 0 and \
            row.ms_per_token_measured <= (1 + WITHIN_PERCENT / 100) * row.ms_per_token_scheduled_off:
        return _noted("drafter")
    uncertainty = decision.get("crossoverUncertaintyPercent") or 0.0
    if gap <= 2 * uncertainty:
        return _noted("crossover", u=uncertainty)
    return ""


@functools.lru_cache(maxsize=256)
def _ms_per_token_cached(model: str, sku: str, config: str, workload: str, concurrency: int,
                         prompt_tokens: tuple[int, ...], output_len: int, num_requests: int | None) -> float:
    argv = ["--model", model, f"--sku={sku}", f"--workload={workload}"]
    if config != "null":
        argv += ["--speculative-config", config]
    return closed_loop_ms_per_token(make_core(build_config(argv)), concurrency, prompt_tokens, output_len,
                                    num_requests=num_requests)


def _ms_per_token(model: str, sku: str, config: dict | None, workload: str, concurrency: int,
                  prompt_tokens: tuple[int, ...], output_len: int, num_requests: int | None = None) -> float:
    """Mean end-to-end ms per output token that clients keeping `concurrency` requests in flight, with the
    clients' prompts in turn, see on one simulated engine of `sku` started with `--speculative-config config`
    (None: no speculation), over `num_requests` requests after the first burst (None: the replay's default)."""
    return _ms_per_token_cached(model, sku, json.dumps(config, sort_keys=True), workload, concurrency,
                                prompt_tokens, max(2, output_len), num_requests)


COST_BASIS = ("$/Mtok: the GPU type's list price per GPU-hour (the catalog's) for one GPU per replica, over "
              "the output tokens per second one replica delivers at that phase's requests per replica (rounded) "
              "and the ms/token beside it (requests x 1000 / ms per token): specpilot's from the measured "
              "figure, the others from theirs.")
"""How the summary's cost columns are computed, in words, printed wherever they are."""


def fidelity_lines(result: DemoResult) -> list[str]:
    """Per pool, how far its measured profiles sit from the twin, and whether the results are valid."""
    lines = [f"Simulated GPUs vs the twin (profiled output throughput, worst level; bound "
             f"{FIDELITY_BOUND_PERCENT:g}%):"]
    for pool, f in sorted(result.fidelity.items()):
        lines.append(f"  {pool} ({f.sku}): {f.worst_percent:.1f}% off at {f.where}, over {f.levels} levels")
    if not result.fidelity:
        lines.append("  no profile was measured")
    if not result.faithful:
        lines.append(f"These results are NOT valid: a profile sits more than {FIDELITY_BOUND_PERCENT:g}% from the "
                     "twin, so its decisions are not the ones the GPU it stands for implies. The host was too "
                     "slow or too busy for the simulated GPUs: close other work, or run again with a smaller "
                     "--time-scale (e.g. 0.5: the simulated GPUs run at half speed and the host gets twice the "
                     "wall time per step).")
    return lines


def _shares(shares: dict[str, float]) -> str:
    return ", ".join(f"{pool} {share:.0%}" for pool, share in sorted(shares.items())) or "none yet"


def _cost(value: float | None) -> str:
    return "-" if value is None else f"${value:.3f}/Mtok"


def _replicas(replicas: int | None) -> str:
    """A pool's fleet target in words; None: the fleet holds the pool at its own count (no profile yet)."""
    if replicas is None:
        return "its own replicas until profiled"
    return f"{replicas} replica{'s' if replicas != 1 else ''}"


def measured_fleet_cost(rows: list[Row]) -> float | None:
    """The fleet's $/Mtok over one phase's rows, on the table's basis (`COST_BASIS`): every serving replica's GPU
    price over the output tokens per second they delivered together (None when a pool's was not measured). With
    one pool it is that pool's specpilot column."""
    if not rows or any(r.tokens_per_second_per_replica is None for r in rows):
        return None
    return cost_per_million_tokens(sum(r.replicas * r.price_per_gpu_hour for r in rows), 1,
                                   sum(r.replicas * r.tokens_per_second_per_replica for r in rows))


def phase_rows(rows: list[Row]) -> dict[int, dict[str, Row]]:
    """Phase index -> pool -> its row."""
    out: dict[int, dict[str, Row]] = {}
    for r in rows:
        out.setdefault(r.phase_index, {})[r.pool] = r
    return out


def fleet_costs_words(window_s: float) -> str:
    """What the fleet lines' two $/Mtok are, in words."""
    return (f"  $/Mtok above: measured in the phase, on the table's basis: each pool's is its row's specpilot "
            f"column, the fleet's is every serving replica's GPU price over the output tokens per second they "
            f"delivered together. The operator's estimate (status.fleet.costPerMtok, what it plans with) prices "
            f"every replica it runs, serving yet or not, over the output tokens per second it scraped from the "
            f"pods over its metrics window (the last {window_s:g} s, per wall second): it lags a change of load, "
            f"dearer than measured after a quieter phase and cheaper after a busier one, and it counts the idle "
            f"moment between phases.")


def metrics_window_s(scenario: DemoScenario) -> float:
    """The operator's metrics window in the scenario's deployment: what its observed load averages over."""
    return float(scenario.deployment()["spec"]["metrics"]["windowSeconds"])


def fleet_lines(result: DemoResult, rows: list[Row], window_s: float) -> list[str]:
    """The fleet placement in words: at the end of each phase, each pool's planned share of the traffic and the
    replicas the fleet wants of it, with the phase's measured $/Mtok (each pool's is its table row's, the fleet's
    `measured_fleet_cost`) beside the operator's estimate; then the new GPU type's join, before and after, in the
    same figures as the phases' lines, and what came after the trace. `window_s`: the operator's metrics window.
    Under the demo's `service` routing and external autoscaling the shares are what the operator plans and
    publishes (desiredReplicas per pool), the Service's even split over the ready pods."""
    placed = [(i, phase) for i, phase in enumerate(result.phases) if phase.placement]
    if not placed:
        return []
    by_phase = phase_rows(rows)
    lines = ["Fleet placement at the end of each phase (the operator's plan: each pool's share of the traffic and "
             "the replicas it wants, published as its desiredReplicas; $/Mtok measured in the phase, and the "
             "operator's estimate of the fleet's):"]
    for i, phase in placed:
        lines.append(f"  {phase.phase.name}: {_placement_words(phase, by_phase.get(i, {}))}")
    lines.append(fleet_costs_words(window_s))
    if result.joined_pool and result.joined_at_s is not None:
        lines += _join_lines(result, by_phase)
    return lines


def _placement_words(phase: PhaseResult, rows: dict[str, Row]) -> str:
    pools = "; ".join(
        f"{pool} {p['share']:.0%} ({_replicas(p['replicas'])}, "
        f"{_cost(rows[pool].cost_specpilot) if pool in rows else 'served nothing measured'}"
        f"{', full' if p['full'] else ''})"
        for pool, p in sorted(phase.placement.items()))
    return (f"{pools}; fleet {_cost(measured_fleet_cost(list(rows.values())))} measured, the operator's "
            f"estimate {_cost(phase.fleet.get('costPerMtok'))}")


def _join_lines(result: DemoResult, by_phase: dict[int, dict[str, Row]]) -> list[str]:
    """The join in the phases' own figures: the plan before it, when the new pool took a share, the plan at the
    end of the phase it joined in; then what came after the trace (its load held while the pool was profiled)."""
    pool, joined = result.joined_pool, result.joined_at_s
    start = result.trace_started_s or 0.0
    index = next((i for i, ph in enumerate(result.phases) if ph.ended_at - start > joined), None)
    head = f"  {pool} joined at {joined:.0f} s"
    if index is None:
        return [head + " after the trace ended"]
    phase = result.phases[index]
    head += f", as the {phase.phase.name} phase began" if phase.started_at - start >= joined else \
        f", during the {phase.phase.name} phase"
    before = result.phases[index - 1] if index > 0 else None
    if before is not None and before.placement:
        head += (f": before, {_shares({p: v['share'] for p, v in before.placement.items()})} (the "
                 f"{before.phase.name} line above)")
    first = next((s for s in result.timeline if s.at_s >= joined and s.share.get(pool, 0.0) > 0), None)
    if first is not None:
        head += (f"; it took a share {first.at_s - joined:.0f} s after joining, when a pod of it was ready (the "
                 f"Service splits evenly over the ready pods)")
    else:
        head += f"; it took no share by the end of the run (no pod of {pool} was ready)"
    if phase.placement:
        head += (f"; at the end of that phase, {_shares({p: v['share'] for p, v in phase.placement.items()})}, "
                 f"fleet {_cost(measured_fleet_cost(list(by_phase.get(index, {}).values())))} measured, the "
                 f"operator's estimate {_cost(phase.fleet.get('costPerMtok'))} (the {phase.phase.name} line above)")
    lines = [head]
    trace_end = result.phases[-1].ended_at - start
    after = [s for s in result.timeline if s.at_s > trace_end]
    if after and after[-1].at_s - trace_end >= 1:
        end = after[-1]
        lines.append(
            f"  After the trace: its last load ({result.phases[-1].phase.concurrency} requests in flight) held "
            f"{end.at_s - trace_end:.0f} s more while {pool} was profiled"
            f"{'' if result.joined_pool_profiled else ' (not decided by the end)'}; no phase was measured then. "
            f"The operator's plan at the end: {_shares(end.share)}, its estimate {_cost(end.fleet_cost)}.")
    return lines


def stage_durations(result: DemoResult) -> list[tuple[str, float]]:
    """(stage, wall seconds it lasted), in order: where the demo's wall time went."""
    ends = [t for _, t in result.stages[1:]] + [result.wall_s]
    return [(stage, round(end - start, 1)) for (stage, start), end in zip(result.stages, ends, strict=True)]


def write_reports(result: DemoResult, scenario: DemoScenario, rows: list[Row], out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    written = []
    by_phase = phase_rows(rows)
    report = {
        "wall_s": round(result.wall_s, 1),
        "stages": [{"stage": stage, "seconds": seconds} for stage, seconds in stage_durations(result)],
        "profiles": [{"name": p["metadata"]["name"], "sku": p["spec"]["sku"],
                      "method": (p["spec"].get("method") or {}).get("method", "baseline"),
                      "phase": (p.get("status") or {}).get("phase"),
                      # "Interrupted" beside Failed: the demo ended while the profile's Job was measuring.
                      "reason": (p.get("status") or {}).get("reason")} for p in result.profiles],
        "decisions": {p["name"]: p.get("decision") for p in result.status.get("pools") or []},
        "joined_pool": result.joined_pool, "joined_pool_profiled": result.joined_pool_profiled,
        "client_errors": result.errors, "processes_left": result.processes_left,
        "fidelity": {"bound_percent": FIDELITY_BOUND_PERCENT, "valid": result.faithful,
                     "pools": {pool: asdict(f) for pool, f in result.fidelity.items()}},
        "rows": [asdict(r) for r in rows],
        # Each $/Mtok twice, named for what it is (`fleet_costs_words`): measured in the phase, and the operator's.
        "fleet": [{"phase": phase.phase.name,
                   "pools": {pool: {"share": p["share"], "replicas": p["replicas"], "full": p["full"], "sku": p["sku"],
                                    "cost_per_mtok_measured": by_phase.get(i, {}).get(pool) and
                                    by_phase[i][pool].cost_specpilot,
                                    "operator_cost_per_mtok": p["cost_per_mtok"]}
                             for pool, p in phase.placement.items()},
                   "fleet_cost_per_mtok_measured": measured_fleet_cost(list(by_phase.get(i, {}).values())),
                   "operator_fleet_cost_per_mtok": phase.fleet.get("costPerMtok"),
                   "operator_demand_tokens_per_second": phase.fleet.get("demandTokensPerSecond"),
                   "reason": phase.fleet.get("reason")}
                  for i, phase in enumerate(result.phases) if phase.placement],
    }
    path = out / "demo.json"
    path.write_text(json.dumps(report, indent=2, default=str))
    written.append(path)
    lines = ["# specpilot demo", "", f"Wall time: {result.wall_s:.0f} s. New GPU pool `{result.joined_pool}` "
             f"profiled: {result.joined_pool_profiled}.", "",
             "Where the time went: " + "; ".join(f"{stage} {seconds:g} s" for stage, seconds in stage_durations(result))
             + ".", "", *fidelity_lines(result), "",
             "| phase | pool | GPU | conc./replica | K | drafts/request-step | ms/token measured | ms/token no SD | "
             "ms/token always SD | vs better fixed | $/Mtok specpilot | $/Mtok no SD | $/Mtok always SD | note |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r.phase} | {r.pool} | {r.sku} | {r.concurrency_per_replica} | {r.k_specpilot} | "
                     f"{_fmt(r.drafts_per_request_step, 2)} | {_fmt(r.ms_per_token_measured, 1)} | "
                     f"{r.ms_per_token_no_sd:.1f} | {r.ms_per_token_always_sd:.1f} | "
                     f"{percent(r.vs_better_fixed_percent)} | {_fmt(r.cost_specpilot, 3)} | {r.cost_no_sd:.3f} | "
                     f"{r.cost_always_sd:.3f} | {r.note} |")
    lines += ["", *table_notes(rows), "", COST_BASIS]
    placement = fleet_lines(result, rows, metrics_window_s(scenario))
    if placement:
        lines += ["", *placement]
    path = out / "demo.md"
    path.write_text("\n".join(lines) + "\n")
    written.append(path)
    written += _plots(result, rows, out)
    return written


def _fmt(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def percent(value: float | None) -> str:
    # + 0.0 turns a -0.0 from rounding into 0.0: "+0.0%", not "-0.0%".
    return "-" if value is None else f"{round(value, 1) + 0.0:+.1f}%"


def table_notes(rows: list[Row]) -> list[str]:
    """What the table's columns are, and the notes its rows carry, in full."""
    lines = ["ms/token is the simulated GPU's throughout, time to first token included. measured: what the clients "
             "saw, each request timed by the virtual clock of the replica it went to (the mean over the phase's "
             "requests after each replica's first burst); no SD and always SD (max K): what the same simulated "
             "engine measures for the same requests at that load without speculation or with it always on, in a "
             "host-free replay. vs better fixed: measured against the better of the two (+ = slower); a row more "
             f"than {WITHIN_PERCENT:g}% slower carries a note. drafts/request-step: drafts the engines proposed per "
             "request and decode step over the phase (0 = speculation off)."]
    lines += [f"  {NOTES[key][1]}" for key in note_keys(rows)]
    return lines


def _log_ticks(ax, axis: str = "y") -> None:
    """A log axis with ticks at 1, 2 and 5 of every decade, in plain numbers: a decade or two of $/Mtok would
    otherwise get one or two ticks."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    target = ax.yaxis if axis == "y" else ax.xaxis
    target.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    target.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    target.set_minor_formatter(NullFormatter())


def _share_changes(result: DemoResult) -> list[tuple[float, str]]:
    """(when, why) for each move of the planned shares by SHARE_MOVE or more between two samples: a pool taking
    its first share (a pod of it ready: the Service splits evenly over the ready pods) or the plan moving."""
    from specpilot.policy.fleet import SHARE_MOVE

    out = []
    placed = [s for s in result.timeline if s.share]
    for prev, s in zip(placed, placed[1:], strict=False):
        if all(abs(s.share.get(p, 0.0) - prev.share.get(p, 0.0)) < SHARE_MOVE for p in {*s.share, *prev.share}):
            continue
        new = sorted(p for p in s.share if s.share[p] > 0 and prev.share.get(p, 0.0) == 0)
        why = (f"{', '.join(new)} ready: the Service splits over {len([p for p in s.share if s.share[p] > 0])} "
               "pools' pods" if new else "the operator moved the plan")
        out.append((s.at_s, f"{why}: {_shares(s.share)}"))
    return out


def _plots(result: DemoResult, rows: list[Row], out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    for name, figure in (("demo-timeline.png", timeline_figure(plt, result, rows) if result.timeline else None),
                         ("demo-cost.png", cost_figure(plt, rows) if rows else None)):
        if figure is not None:
            figure.savefig(out / name, dpi=110)
            plt.close(figure)
            paths.append(out / name)
    return paths


def timeline_figure(plt, result: DemoResult, rows: list[Row]):
    """Load and ms/token, K, and (with a fleet) the planned shares and the fleet's $/Mtok, over the run."""
    times = [s.at_s for s in result.timeline]
    pools = sorted({p for s in result.timeline for p in (*s.ms_per_token, *s.k, *s.share)})
    colours = {pool: f"C{i}" for i, pool in enumerate(pools)}
    styles = {pool: (("-", "--", ":")[i % 3], (4, 2, 2)[i % 3]) for i, pool in enumerate(pools)}
    start = result.trace_started_s or 0.0
    spans = [(ph.started_at - start, ph.ended_at - start, ph.phase.name) for ph in result.phases]
    shares = any(s.share for s in result.timeline)
    heights = [3, 2, 2, 2] if shares else [3, 2]
    fig, axes = plt.subplots(len(heights), 1, figsize=(10, 3 * sum(heights) / 2 + 1), sharex=True,
                             gridspec_kw={"height_ratios": heights})
    ax_load, ax_k = axes[0], axes[1]
    for ax in axes:
        for begin, end, _ in spans:
            ax.axvline(begin, color="grey", linewidth=0.5, alpha=0.5)
        if result.joined_at_s is not None:
            ax.axvline(result.joined_at_s, color="black", linestyle=":", linewidth=1,
                       label=f"{result.joined_pool} joins" if ax is ax_k else None)
        if spans and times[-1] > spans[-1][1] + 1:
            ax.axvspan(spans[-1][1], times[-1], color="grey", alpha=0.08)
    for begin, end, name in spans:  # phase names along the top
        ax_load.text((begin + end) / 2, 1.01, name, transform=ax_load.get_xaxis_transform(), ha="center",
                     va="bottom", fontsize=8)
    if spans and times[-1] > spans[-1][1] + 1:
        ax_load.text((spans[-1][1] + times[-1]) / 2, 1.01, f"after the trace: {result.joined_pool} profiled",
                     transform=ax_load.get_xaxis_transform(), ha="center", va="bottom", fontsize=8, color="grey")

    # Each sample closes the second before it: the load shown over (t - 1, t] is the one sampled at t.
    ax_load.fill_between(times, [s.in_flight for s in result.timeline], step="pre", alpha=0.2, color="grey",
                         label="requests in flight (left axis)")
    ax_load.set_ylabel("requests in flight")
    ax_ms = ax_load.twinx()
    for pool in pools:
        points = [(s.at_s, s.ms_per_token[pool]) for s in result.timeline if pool in s.ms_per_token]
        if points:
            ax_ms.plot([t for t, _ in points], [v for _, v in points], color=colours[pool],
                       label=f"{pool}: ms/token (right axis)")
    ax_ms.set_ylabel("ms per output token\n(clients, simulated GPU time)")
    handles = [h for ax in (ax_load, ax_ms) for h in ax.get_legend_handles_labels()[0]]
    ax_ms.legend(handles, [h.get_label() for h in handles], loc="upper left", fontsize=8)
    ax_load.set_title("Load and latency per pool during the demo", pad=16)

    # K of every pool that serves, 0 while it serves without speculation (`TimelineSample.k`). Pools often run
    # the same K: wide solid, dashed and dotted lines keep each one visible.
    for pool in pools:
        ks = [(s.at_s, s.k[pool]) for s in result.timeline if pool in s.k]
        if ks:
            ax_k.step([t for t, _ in ks], [k for _, k in ks], where="pre", color=colours[pool], label=pool,
                      linestyle=styles[pool][0], linewidth=styles[pool][1])
    ax_k.set_ylabel("K at the current batch")
    ax_k.set_title("Speculation each pool's engines run (decided schedule at the requests per pod; 0 = off, as "
                   "a pool serves until it is profiled)", fontsize=10)
    ax_k.yaxis.get_major_locator().set_params(integer=True)
    top_k = max((k for s in result.timeline for k in s.k.values()), default=1)
    ax_k.set_ylim(-0.3, top_k + 0.5)  # 0 (speculation off) on the axis, as its title says
    ax_k.legend(loc="upper left", fontsize=8)
    ax_k.set_xlabel("seconds since the load began")
    if shares:
        ax_k.set_xlabel("")
        _share_panel(result, axes[2], pools, colours, styles)
        _fleet_cost_panel(result, rows, axes[3], spans)
        axes[3].set_xlabel("seconds since the load began")
    fig.tight_layout()
    return fig


def _share_panel(result: DemoResult, ax, pools: list[str], colours: dict, styles: dict) -> None:
    """Each pool's planned share from when the plan holds it; each move of the shares labelled with why."""
    for pool in pools:
        points = [(s.at_s, 100 * s.share[pool] if pool in s.share else float("nan"))
                  for s in result.timeline if s.share]
        if any(v == v for _, v in points):
            ax.step([t for t, _ in points], [v for _, v in points], where="pre", color=colours[pool],
                    label=f"{pool}: planned share", linestyle=styles[pool][0], linewidth=styles[pool][1])
    end = result.timeline[-1].at_s
    for i, (at, why) in enumerate(_share_changes(result)):
        # Text on the side with room, low in the panel (the shares sit at 50% and below), a line to the change.
        left = at > 0.6 * end
        ax.annotate(why, (at, 100 / 3), xytext=(at + (-1 if left else 1) * 0.02 * end, 8 + 10 * (i % 4)),
                    ha="right" if left else "left", fontsize=7,
                    arrowprops={"arrowstyle": "-", "color": "grey", "linewidth": 0.5})
    ax.set_ylim(0, 105)
    ax.set_ylabel("% of traffic")
    ax.set_title("Fleet placement: each pool's planned share of the traffic (the Service's even split over the "
                 "ready pods)", fontsize=10)
    ax.legend(loc="upper left", fontsize=8)


def _fleet_cost_panel(result: DemoResult, rows: list[Row], ax, spans: list[tuple[float, float, str]]) -> None:
    """The fleet's $/Mtok both ways (`fleet_costs_words`): measured over each phase, the operator's estimate as it
    went."""
    by_phase = phase_rows(rows)
    labelled = False
    for i, (begin, end, _) in enumerate(spans):
        cost = measured_fleet_cost(list(by_phase.get(i, {}).values()))
        if cost is None:
            continue
        ax.hlines(cost, begin, end, color="black", linewidth=3,
                  label=None if labelled else "measured in the phase (the report's fleet $/Mtok)")
        ax.annotate(f"{cost:.2f}", ((begin + end) / 2, cost), xytext=(0, 4), textcoords="offset points",
                    ha="center", fontsize=7)
        labelled = True
    costs = [(s.at_s, s.fleet_cost) for s in result.timeline if s.fleet_cost]
    if costs:
        ax.step([t for t, _ in costs], [c for _, c in costs], where="pre", color="grey", linestyle="--", linewidth=1,
                label="the operator's estimate (its metrics window of scraped tokens/s, every replica it runs)")
    ax.set_yscale("log")
    _log_ticks(ax)
    ax.set_ylabel("fleet $ per million\noutput tokens (log)")
    ax.set_title("The fleet's $/Mtok: measured in each phase, and as the operator estimated it", fontsize=10)
    ax.legend(loc="upper right", fontsize=8)


def cost_figure(plt, rows: list[Row]):
    """Each row's $/Mtok under the three policies, with the table's 'vs better fixed' over specpilot's bar."""
    fig, ax = plt.subplots(figsize=(10, 5))
    labels = [f"{r.phase}\n{r.pool}" for r in rows]
    x = range(len(rows))
    width = 0.27
    ax.bar([i - width for i in x], [r.cost_no_sd for r in rows], width, label="no SD")
    ax.bar(list(x), [r.cost_always_sd for r in rows], width, label="always SD (max K)")
    ax.bar([i + width for i in x], [r.cost_specpilot or float("nan") for r in rows], width,
           label="specpilot (measured)")
    ax.set_xticks(list(x), labels, fontsize=8)
    # A log scale: the quiet phases cost several times the busy ones per token, and on a linear scale the
    # few percent between policies at the peak (where a loss would show) cannot be seen.
    ax.set_yscale("log")
    _log_ticks(ax)
    ax.set_ylabel("$ per million output tokens (log scale)")
    ax.set_title("Cost per token at each phase's load (specpilot: measured; the fixed policies: the same engine's "
                 "replay)", fontsize=10)
    for i, r in enumerate(rows):
        if r.cost_specpilot is None or r.vs_better_fixed_percent is None:
            continue
        # The table's "vs better fixed": at one load and price, cost per token goes as ms per token.
        ax.annotate(percent(r.vs_better_fixed_percent), (i + width, r.cost_specpilot), textcoords="offset points",
                    xytext=(0, 3), ha="center", fontsize=7,
                    color="firebrick" if r.vs_better_fixed_percent > WITHIN_PERCENT else "black")
    ax.legend(loc="upper center", fontsize=8, ncols=3)
    fig.text(0.01, 0.01, "Over each specpilot bar: its $/Mtok against the cheaper of no SD and always SD at that "
             "load, the table's 'vs better fixed'\n(+ = dearer; red beyond "
             f"{WITHIN_PERCENT:g}%, where the table's row carries a note saying why).", fontsize=8, ha="left",
             va="bottom")
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    return fig
