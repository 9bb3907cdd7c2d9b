"""`specpilot simulate`: compare serving policies on a simulated fleet over a load trace, no cluster needed.

With no arguments it runs the default scenario: Llama-3.1-8B on H100-SXM serving ShareGPT-like traffic,
candidates ngram, eagle3 and draft_model, a day's diurnal load compressed into three hours, 4 replicas
(1-8 when autoscaling), TPOT SLO 15 ms. It prints the comparison and writes plots and reports to --out.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

DEFAULT_MODEL = "meta-llama/Llama-3.1-8B-Instruct"
DEFAULT_GPU = "H100-SXM"
DEFAULT_METHODS = "ngram:4,eagle3:4,draft_model:4"
DEFAULT_TRACE = "diurnal:100:20:3"
DEFAULT_SLO_TTFT_MS = 2000.0
"""sim.fleet.DEFAULT_SLO_TTFT_MS (kept here so --help needs no numpy import)."""
FAST_TRACE = "diurnal:40:8:0.25"
FLEET_SCENARIOS = ("default", "owned-a100", "loose-slo", "code", "join", "bursty", "log")
"""The mixed-fleet scenarios of `--fleet` (sim.mixed.SCENARIOS)."""
FLEET_FAST_STARTUP_S = 15.0
"""Replica start-up under --fleet --fast: a day in a quarter-hour is 96x faster than real time, and 120 s
there would be over three hours of a real day."""


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "simulate", help="compare serving policies (no SD, fixed k, static rule, restart, specpilot) on a "
                         "simulated fleet over a load trace",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=DEFAULT_MODEL, help=f"built-in model id (default {DEFAULT_MODEL})")
    p.add_argument("--gpu", action="append", metavar="SKU",
                   help=f"GPU SKU or node label; repeat to compare SKUs (default {DEFAULT_GPU})")
    p.add_argument("--tensor-parallel-size", type=int, default=1, metavar="N", help="GPUs per replica (default 1)")
    p.add_argument("--workload", default="sharegpt", choices=("sharegpt", "humaneval", "json-extraction", "random"),
                   help="request lengths and acceptance (default sharegpt)")
    p.add_argument("--methods", default=DEFAULT_METHODS, metavar="M[:K],...",
                   help=f"candidate methods with their largest k (default {DEFAULT_METHODS})")
    p.add_argument("--trace", metavar="SPEC",
                   help="constant:RPS[:SECONDS] | diurnal:PEAK:TROUGH[:HOURS] | "
                        "bursts:BASE:PEAK[:EVERY_S[:LENGTH_S]] | FILE.csv with time_s,arrival_rate_rps | "
                        "FILE.csv request log (TIMESTAMP,ContextTokens,GeneratedTokens or arrival_s,input_tokens,"
                        f"output_tokens), replayed (default {DEFAULT_TRACE}; --fast: {FAST_TRACE}; with --fleet: "
                        "the scenario's)")
    p.add_argument("--trace-scale", type=float, default=1.0, metavar="X",
                   help="compress a request log's time by X (X times its rate; default 1)")
    p.add_argument("--duration", metavar="TIME", help="simulated time, e.g. 7200, 90m, 6h (default: the trace's)")
    p.add_argument("--replicas", type=int, help="replicas of the fixed-replica policies (default 4; --fast: 2)")
    p.add_argument("--min-replicas", type=int, default=1, help="autoscaling lower bound (default 1)")
    p.add_argument("--max-replicas", type=int, help="autoscaling upper bound (default 8; --fast: 4)")
    p.add_argument("--slo-tpot-ms", type=float, default=15.0,
                   help="per-token latency SLO in ms (default 15; --fleet: the scenario's)")
    p.add_argument("--slo-ttft-ms", type=float, metavar="MS",
                   help=f"time-to-first-token SLO in ms; a request is within SLO only within both "
                        f"(default {DEFAULT_SLO_TTFT_MS:g})")
    p.add_argument("--price-per-gpu-hour", type=float, help="USD per GPU-hour (default: the catalog's price)")
    p.add_argument("--max-num-seqs", type=int, default=256, help="vLLM --max-num-seqs per replica (default 256)")
    p.add_argument("--startup-s", type=float, default=120.0, help="seconds a new replica takes to serve (default 120)")
    p.add_argument("--seed", type=int, default=0, help="seed of arrivals, lengths and profile noise (default 0)")
    p.add_argument("--out", default="out/simulate", help="directory for plots and reports (default out/simulate)")
    p.add_argument("--quiet", action="store_true", help="no progress bar and no table: only the report paths")
    p.add_argument("--fast", action="store_true", help="a small scenario (a quarter-hour trace, 2 replicas) for tests")
    p.add_argument("--fleet", metavar="SCENARIO", choices=(*FLEET_SCENARIOS, "all"),
                   help="compare placements of a mixed fleet (A100, H100 and H200 pools sharing one load): today's "
                        "even split, SD-unaware cost-optimal, specpilot's fleet planner; one of "
                        f"{', '.join(FLEET_SCENARIOS)} or all (with --fast: a quarter of the load and GPUs "
                        "over a quarter-hour)")
    p.add_argument("--cold-start", action="store_true",
                   help="--fleet: the planners start with no demand history (a deployment that has never served); "
                        "by default they start with the history the metrics hold from before the trace (the trace "
                        "continued backwards), as the operator reads it from Prometheus")
    p.set_defaults(func=cmd_simulate)


def parse_duration(text: str) -> float:
    """Seconds from `7200`, `7200s`, `90m` or `6h`."""
    units = {"s": 1.0, "m": 60.0, "h": 3600.0}
    value, unit = (text[:-1], text[-1]) if text and text[-1] in units else (text, "s")
    try:
        seconds = float(value) * units[unit]
    except ValueError:
        raise ValueError(f"--duration {text!r} must be a number of seconds or end in s, m or h (e.g. 90m)") from None
    if not seconds > 0:
        raise ValueError(f"--duration must be > 0 (got {text!r})")
    return seconds


def cmd_simulate(args: argparse.Namespace) -> int:
    from ..perf import UnknownGpuError, UnknownModelError
    from .traces import TraceError

    try:
        return _run(args)
    except (ValueError, TraceError, UnknownGpuError, UnknownModelError) as exc:
        print(f"specpilot simulate: {exc}", file=sys.stderr)
        return 2


def _run(args: argparse.Namespace) -> int:
    from rich.console import Console

    if args.fleet:
        return _run_fleet(args)

    from ..perf import DEFAULT_CATALOG, resolve_model
    from .fleet import FleetConfig, FleetSetup
    from .policies import Candidate, PlanningInputs, build_policies, profile_and_decide_pool
    from .report import Comparison, write_reports
    from .traces import parse_trace

    console = Console()
    if not console.is_terminal:
        console = Console(width=max(console.width, 132))  # a piped table keeps its columns
    resolve_model(args.model)
    skus = [DEFAULT_CATALOG.resolve(g).sku for g in (args.gpu or [DEFAULT_GPU])]
    candidates = tuple(Candidate.parse(m.strip()) for m in args.methods.split(",") if m.strip())
    trace = parse_trace(args.trace or (FAST_TRACE if args.fast else DEFAULT_TRACE), scale=args.trace_scale)
    if args.duration:
        trace = trace.with_duration(parse_duration(args.duration))
    replicas = args.replicas or (2 if args.fast else 4)
    max_replicas = args.max_replicas or max(replicas, 4 if args.fast else 8)
    config = FleetConfig(max_num_seqs=args.max_num_seqs, startup_s=args.startup_s)
    show = not args.quiet and console.is_terminal

    comparisons = []
    for sku in skus:
        setup = FleetSetup(args.model, sku, args.workload, args.tensor_parallel_size, args.price_per_gpu_hour)
        inputs = PlanningInputs(setup, candidates, replicas=replicas, min_replicas=args.min_replicas,
                                max_replicas=max_replicas, slo_tpot_ms=args.slo_tpot_ms,
                                max_num_seqs=args.max_num_seqs, seed=args.seed)
        start = time.perf_counter()
        planning = profile_and_decide_pool(inputs, trace)
        policies = build_policies(inputs, planning)
        results = _simulate_all(policies, trace, setup, config, inputs, args.seed, show, console, sku,
                                _slo_ttft_ms(args))
        comparisons.append(Comparison(inputs, trace, planning, results, {p.name: p.description for p in policies},
                                      time.perf_counter() - start))
    out = Path(args.out)
    written = write_reports(comparisons, out)
    if not args.quiet:
        for comp in comparisons:
            _print_comparison(console, comp)
    console.print(f"plots and reports in [bold]{out}/[/]: " + ", ".join(p.name for p in written))
    return 0


def _run_fleet(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from .fleet import FleetConfig
    import dataclasses

    from .mixed import PLACEMENT_WORDS, SCENARIOS, compare
    from .mixed_report import fleet_verdict, slo_words, table_rows, write_fleet_reports

    console = Console(emoji=False)  # a trace such as bursts:100:300 is not an emoji code
    if not console.is_terminal:
        console = Console(width=max(console.width, 132), emoji=False)
    names = FLEET_SCENARIOS if args.fleet == "all" else (args.fleet,)
    config = FleetConfig(max_num_seqs=args.max_num_seqs,
                         startup_s=FLEET_FAST_STARTUP_S if args.fast else args.startup_s)
    comparisons = []
    for name in names:
        scenario = SCENARIOS[name].fast() if args.fast else SCENARIOS[name]
        if args.trace:  # the user's trace as given (--fast shrinks the fleet only)
            scenario = dataclasses.replace(scenario, trace=args.trace, trace_scale=args.trace_scale, thin_log=1,
                                           duration_s=None)
        elif args.trace_scale != 1:
            scenario = dataclasses.replace(scenario, trace_scale=args.trace_scale)
        if args.slo_ttft_ms is not None:
            scenario = dataclasses.replace(scenario, slo_ttft_ms=_slo_ttft_ms(args))
        if args.duration:
            scenario = dataclasses.replace(scenario, duration_s=parse_duration(args.duration))
        if args.cold_start:
            scenario = dataclasses.replace(scenario, warm=False)
        start = time.perf_counter()
        comparison = compare(scenario, config, seed=args.seed)
        comparisons.append(comparison)
        if args.quiet:
            continue
        given = " (--trace, in place of the scenario's)" if args.trace else ""
        start_words = ("cold start: no demand history" if not scenario.warm
                       else "the planners start with the demand history of the trace continued backwards")
        console.print(f"[bold]mixed fleet {scenario.name}[/]: {scenario.description}; trace {scenario.trace}{given}; "
                      f"{start_words}")
        if scenario.trace.lower().endswith(".csv"):
            console.print(f"  trace: {comparison.trace.describe()}")
        for pool in comparison.prepared:
            console.print(f"  {pool.spec.name}: {pool.spec.sku} x{pool.spec.gpus} GPUs at "
                          f"${pool.setup.gpu_price_per_hour:.2f}/GPU-h, min {pool.spec.min_replicas}; "
                          f"{pool.sd_method or 'no speculation'} "
                          f"{pool.planning.dynamic.decision.schedule_summary or ''}".rstrip())
            if pool.joining is not None:
                console.print(f"  joined: {pool.joining.words()}")
        rows = table_rows(comparison)
        table = Table(header_style="bold")
        for i, column in enumerate(rows[0]):
            table.add_column(column, justify="left" if i == 0 else "right", no_wrap=True)
        for row in rows[1:]:
            table.add_row(*row, style="bold green" if row[0] == "specpilot" else "")
        console.print(table)
        console.print(slo_words(comparison))
        for result in comparison.results:
            if result.tuning is not None:
                console.print(f"{result.placement}: {result.tuning.words()}")
        console.print(fleet_verdict(comparison).words() + f"  [dim]({time.perf_counter() - start:.1f} s)[/]")
    if not args.quiet:
        for placement, words in PLACEMENT_WORDS.items():
            console.print(f"  [dim]{placement}: {words}[/]")
    out = Path(args.out)
    written = write_fleet_reports(comparisons, out)
    console.print(f"plots and reports in [bold]{out}/[/]: " + ", ".join(p.name for p in written))
    return 0


def _slo_ttft_ms(args: argparse.Namespace) -> float:
    ttft = DEFAULT_SLO_TTFT_MS if args.slo_ttft_ms is None else args.slo_ttft_ms
    if not ttft > 0:
        raise ValueError(f"--slo-ttft-ms must be > 0 (got {ttft:g})")
    return ttft


def _simulate_all(policies, trace, setup, config, inputs, seed, show, console, sku, slo_ttft_ms):
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from .fleet import simulate

    results = []
    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), TextColumn("{task.percentage:>3.0f}%"),
                  TimeElapsedColumn(), console=console, disable=not show, transient=True) as progress:
        task = progress.add_task(f"{sku}", total=trace.duration_s * len(policies))
        for i, policy in enumerate(policies):
            offset = i * trace.duration_s
            last = [0.0]

            def advance(t_s: float, offset=offset, last=last, name=policy.name) -> None:
                if t_s - last[0] >= 300.0 or t_s >= trace.duration_s:
                    last[0] = t_s
                    progress.update(task, completed=offset + t_s, description=f"{sku}: {name}")

            results.append(simulate(policy, trace, setup, config, slo_tpot_ms=inputs.slo_tpot_ms,
                                    max_replicas=inputs.max_replicas, seed=seed,
                                    progress=advance if show else None, slo_ttft_ms=slo_ttft_ms))
    return results


def _print_comparison(console, comp) -> None:
    from rich.panel import Panel
    from rich.table import Table

    from .report import AUTOSCALE_POLICY, table_rows, verdict

    setup, decision = comp.inputs.setup, comp.planning.dynamic.decision
    capacity = comp.planning.dynamic.capacity_concurrency_per_replica
    console.print(Panel.fit(
        f"[bold]{setup.model_id}[/] on [bold]{comp.sku}[/] x{setup.tensor_parallel_size}, "
        f"{setup.workload} traffic, {comp.trace.describe()}\n"
        f"decision: {decision.reason}\n"
        f"schedule: [bold cyan]{decision.schedule_summary or 'no speculation'}[/]"
        + (f"   capacity within TPOT {comp.inputs.slo_tpot_ms:g} ms: {capacity:g} requests/replica"
           if capacity and comp.inputs.slo_tpot_ms else ""),
        title="specpilot simulate", border_style="cyan"))
    rows = table_rows(comp)
    table = Table(show_lines=False, header_style="bold")
    for i, name in enumerate(rows[0]):
        table.add_column(name, justify="left" if i == 0 else "right", no_wrap=True)
    best_cost = min(r.cost_per_mtok for r in comp.results)
    for result, row in zip(comp.results, rows[1:], strict=True):
        style = "bold green" if result.policy == AUTOSCALE_POLICY else ("bold" if result.policy == "specpilot" else "")
        if result.cost_per_mtok == best_cost:
            row = [*row[:-1], f"[green]{row[-1]}[/]"]
        table.add_row(*row, style=style)
    console.print(table)
    for name, text in comp.descriptions.items():
        console.print(f"  [dim]{name}: {text}[/]")
    v = verdict(comp.results)
    console.print(("[bold green]" if v.wins else "[bold yellow]") + v.words() + "[/]"
                  + f"  [dim]({comp.seconds:.1f} s)[/]")
