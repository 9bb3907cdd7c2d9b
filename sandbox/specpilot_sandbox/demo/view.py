"""The demo's terminal view: what a platform team would watch with `kubectl get sdep,sprof -w`, plus the
load and latency the clients see."""

from __future__ import annotations

import statistics
import time

from rich.console import Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from specpilot.api.schedule import ScheduleRange, k_at

from .run import Demo


def _k_now(pool: dict, concurrency: float | None) -> str:
    decision = pool.get("decision") or {}
    if not decision.get("method"):
        return "off"
    if not pool.get("speculationEnabled"):
        return "off (toggled)"
    schedule = [ScheduleRange.model_validate(r) for r in decision.get("schedule") or []]
    if not schedule:
        return f"k={decision.get('numSpeculativeTokens')}"
    if concurrency is None:
        return "schedule"
    k = k_at(schedule, max(1, round(concurrency)))
    return f"k={k}" if k else "off (k=0)"


def render(demo: Demo) -> Group:
    status = demo.status()
    elapsed = time.monotonic() - demo.started
    load = f"{demo.driver.concurrency} requests in flight" if demo.driver else "no load"
    header = Text.assemble(("specpilot demo", "bold"), f"  {elapsed:5.0f} s  ", (demo.stage, "cyan"),
                           f"  |  {load}  |  phase {status.get('phase', '-')}, {status.get('progress', '')}")

    table = Table(expand=True)
    for column in ("pool", "GPU", "profiles", "decision", "SD now", "replicas (desired)", "conc./replica",
                   "ms/token", "$/Mtok"):
        table.add_column(column, overflow="fold")
    in_flight: dict[str, list[int]] = {}
    if demo.driver is not None:
        for pool, url in demo.endpoints():
            in_flight.setdefault(pool, []).append(demo.driver._outstanding.get(url, 0))
    for pool in status.get("pools") or []:
        name = pool["name"]
        decision = pool.get("decision") or {}
        live = in_flight.get(name)
        concurrency = sum(live) / len(live) if live else (pool.get("observed") or {}).get("concurrency")
        recent = demo.driver.recent(5, name) if demo.driver else []
        ms = f"{statistics.median(s.ms_per_token for s in recent):.1f}" if recent else "-"
        profiles = pool.get("profiles") or {}
        cost = decision.get("costPerMtokWithSd")
        method = decision.get("method") or "none"
        summary = decision.get("scheduleSummary") or ""
        table.add_row(
            name, pool.get("sku") or "(no nodes)",
            f"{profiles.get('ready', 0)}/{profiles.get('total', 0)}" + (
                f" ({profiles['failed']} failed)" if profiles.get("failed") else ""),
            f"{method} {summary}".strip(), _k_now(pool, concurrency),
            f"{pool.get('replicas', 0)} ({pool.get('desiredReplicas', '-')})",
            f"{concurrency:.1f}" if concurrency is not None else "-", ms,
            f"{cost:.3f}" if cost else "-")

    events = sorted(demo.events(), key=lambda e: e.get("metadata", {}).get("creationTimestamp", ""))[-6:]
    lines = Text()
    for event in events:
        style = "yellow" if event.get("type") == "Warning" else "dim"
        lines.append(f"{event.get('reason', '')}: {event.get('message', '')}\n", style=style)
    return Group(header, table, Panel(lines, title="events", border_style="dim"))
