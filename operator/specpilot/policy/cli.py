"""`specpilot plan`: decide method and schedule per SKU from SpeculationProfile files, offline.

Reads profiles (YAML or JSON, several documents per file, or a `kubectl get sprof -o yaml` List), groups
them by SKU + model + workload, takes the profile without a method (or any K=0 run) as the baseline, and
prints per group the chosen method, the ready-to-paste `--speculative-config`, each method's crossover,
predicted goodput and $/Mtok, and k per concurrency, and what it is unsure of: the schedule's changes of k
and crossover whose gain the profiles do not pin down within the minimum gain, with the measurements that
would settle them (`refine`, policy.refine; `-o json` shows the entries, the table says it in words and
gives the `specpilot-bench` flags). Exit code 2 with the file and the fix on bad input.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import sys
from pathlib import Path
from typing import Any

__all__ = ["register"]

_TABLE_LEVELS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


class PlanInputError(Exception):
    """Bad input; the message names the file and the fix."""


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("plan", help="choose method and speculation schedule per SKU from profile files",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--profile", nargs="+", required=True, metavar="FILE",
                   help="SpeculationProfile files (YAML/JSON; several documents or a List allowed)")
    p.add_argument("--slo-tpot-ms", type=float, default=None, help="p95 TPOT SLO in ms (none by default)")
    p.add_argument("--min-gain", type=float, default=None, metavar="PCT",
                   help="noise guard: speculate at a batch size only where k>0 beats k=0 on the method's engine "
                        "by this much, and deploy a method only when it beats no speculation by this much over "
                        "the load (default: the API's policy.minGainPercent default, 2)")
    p.add_argument("--price-per-gpu-hour", type=float, default=None,
                   help="USD per GPU-hour (default: the SKU's catalog price)")
    p.add_argument("--gpus-per-replica", type=int, default=None,
                   help="GPUs per replica (default: the profiles' tensorParallelSize)")
    p.add_argument("--concurrency-histogram", metavar="FILE", default=None,
                   help="per-replica load as CSV or JSON rows of concurrency,weight (default: uniform over levels)")
    p.add_argument("--objective", choices=("goodput", "cost"), default="goodput")
    p.add_argument("--strategy", choices=("auto", "dynamic", "restart"), default="auto")
    p.add_argument("--max-batch-size", type=int, default=256, help="largest batch size of the schedule (vLLM max_num_seqs)")
    p.add_argument("--refine-budget", type=int, default=None, metavar="LEVELS",
                   help="refinement budget in measured levels (default: 2 times the levels the group's profiles "
                        "measured in their first sweep); what the profiles already repeated counts as spent")
    p.add_argument("-o", "--output", choices=("table", "json"), default="table")
    p.set_defaults(func=cmd_plan)


def _documents(path: Path) -> list[dict[str, Any]]:
    import yaml

    try:
        text = path.read_text()
    except OSError as exc:
        raise PlanInputError(f"{path}: cannot read it ({exc.strerror or exc}): pass an existing, readable file")
    try:
        # libyaml's loader when PyYAML has it: the pure-Python one dominates `plan` on many profiles
        loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
        docs = [d for d in yaml.load_all(text, Loader=loader) if d is not None]
    except yaml.YAMLError as exc:
        raise PlanInputError(f"{path}: not valid YAML or JSON ({exc}): pass SpeculationProfile files as written "
                             f"by specpilot-bench or `kubectl get sprof -o yaml`")
    out: list[dict[str, Any]] = []
    for doc in docs:
        if isinstance(doc, dict) and (doc.get("kind") == "List" or ("items" in doc and "kind" not in doc)):
            out.extend(doc.get("items") or [])
        else:
            out.append(doc)
    return out


def load_profiles(paths: list[str]):
    from pydantic import ValidationError

    from ..api.base import format_validation_error
    from ..api.profile import SpeculationProfile

    profiles = []
    for name in paths:
        path = Path(name)
        for i, doc in enumerate(_documents(path)):
            kind = doc.get("kind") if isinstance(doc, dict) else type(doc).__name__
            if kind != "SpeculationProfile":
                raise PlanInputError(f"{path}: document {i} is {kind!r}, not a SpeculationProfile: pass profile files "
                                     f"only (`kubectl get sprof -o yaml` writes them)")
            try:
                profiles.append((path, SpeculationProfile.model_validate(doc)))
            except ValidationError as exc:
                raise PlanInputError(f"{path}: document {i}: {format_validation_error(exc, root='')}")
    if not profiles:
        raise PlanInputError(f"{', '.join(paths)}: no SpeculationProfile found: pass at least one profile file")
    return profiles


def load_histogram(name: str) -> list[tuple[float, float]]:
    path = Path(name)
    try:
        text = path.read_text()
    except OSError as exc:
        raise PlanInputError(f"{path}: cannot read it ({exc.strerror or exc}): pass an existing, readable file")
    rows: list[tuple[float, float]] = []
    try:
        if text.lstrip().startswith(("[", "{")):
            data = json.loads(text)
            if isinstance(data, dict):
                data = data.get("histogram", data.get("items", []))
            for entry in data:
                if isinstance(entry, dict):
                    rows.append((float(entry["concurrency"]), float(entry["weight"])))
                else:
                    rows.append((float(entry[0]), float(entry[1])))
        else:
            for line in csv.reader(io.StringIO(text)):
                if not line or line[0].strip().lower() in ("concurrency", "") or line[0].startswith("#"):
                    continue
                rows.append((float(line[0]), float(line[1])))
    except (ValueError, KeyError, IndexError, TypeError) as exc:
        raise PlanInputError(f"{path}: cannot read a concurrency histogram ({exc}): write CSV lines "
                             f"`concurrency,weight` or JSON [[concurrency, weight], ...]")
    if not any(c > 0 and w > 0 for c, w in rows):
        raise PlanInputError(f"{path}: the histogram has no row with concurrency > 0 and weight > 0")
    return rows


def _group_key(profile) -> tuple[str, str, str]:
    spec = profile.spec
    return spec.sku, spec.model.id, json.dumps(spec.workload.dump(), sort_keys=True)


def plan_groups(profiles, args: argparse.Namespace, histogram) -> list[dict[str, Any]]:
    from ..api.deployment_spec import Policy
    from ..perf import DEFAULT_CATALOG, UnknownGpuError
    from .choose import decide_pool
    from .refine import refine_pool_plan

    groups: dict[tuple[str, str, str], list] = {}
    for path, profile in profiles:
        groups.setdefault(_group_key(profile), []).append((path, profile))
    guard = {} if args.min_gain is None else {"min_gain_percent": args.min_gain}
    policy = Policy(objective=args.objective, tpot_slo_ms=args.slo_tpot_ms, strategy=args.strategy, **guard)
    results = []
    for (sku, model, _), members in groups.items():
        baseline = next((p for _, p in members if p.spec.method is None), None)
        with_k0 = next((p for _, p in members if p.status and p.status.run(0) is not None), None)
        if baseline is None and with_k0 is None:
            files = ", ".join(sorted({str(path) for path, _ in members}))
            raise PlanInputError(f"{files}: no baseline for {sku} / {model}: add the baseline SpeculationProfile "
                                 f"of that SKU, model and workload (the one without spec.method) to --profile")
        candidates = []
        by_key = {}
        for _, p in members:
            if p.spec.method is not None and p.spec.method.key not in by_key:
                candidates.append(p.spec.method)
                by_key[p.spec.method.key] = p
        price = args.price_per_gpu_hour
        if price is None:
            try:
                price = DEFAULT_CATALOG.resolve(sku).default_price_per_gpu_hour
            except UnknownGpuError:
                price = 0.0
        gpus = args.gpus_per_replica or members[0][1].spec.model.tensor_parallel_size
        plan = decide_pool(policy, candidates, baseline or with_k0, by_key, price, gpus,
                           concurrency_histogram=histogram, max_batch_size=args.max_batch_size)
        result = _group_result(sku, model, members[0][1].spec.workload.name, candidates, plan, price, gpus)
        result["minGainPercent"] = policy.min_gain_percent
        result["refine"] = refine_pool_plan(plan, policy, baseline or with_k0, by_key,
                                            getattr(args, "refine_budget", None)).to_dict()
        results.append(result)
    return results


def _group_result(sku, model, workload, candidates, plan, price, gpus) -> dict[str, Any]:
    from ..api.schedule import summary

    decision = plan.decision
    config = None
    if decision.method is not None:
        candidate = next(c for c in candidates if c.key == decision.method)
        config = candidate.speculative_config(decision.num_speculative_tokens, decision.schedule or None)
    rows = []
    for row in plan.candidates:
        schedule = row.schedule
        rows.append({
            "candidate": row.key, "ready": row.ready, "strategy": getattr(row.strategy, "value", row.strategy),
            "numSpeculativeTokens": row.num_speculative_tokens,
            "schedule": summary(schedule.ranges) if schedule and schedule.ok and schedule.ranges else "",
            "crossoverConcurrency": row.crossover_concurrency,
            "crossoverUncertaintyPercent": row.crossover_uncertainty_percent,
            "kvMaxConcurrency": row.kv_max_concurrency,
            "expectedGoodputTokS": row.expected_goodput_tok_s, "costPerMtok": row.cost_per_mtok,
            "capacityConcurrency": row.capacity_concurrency, "note": row.note,
            "kByConcurrency": {str(c): schedule.k_at(c) for c in _TABLE_LEVELS if c <= schedule.max_batch_size}
            if schedule and schedule.ok else {},
            "goodputByConcurrency": {str(c): schedule.goodput_at(c) for c in _TABLE_LEVELS
                                     if c <= schedule.max_batch_size} if schedule and schedule.ok else {},
        })
    return {"sku": sku, "model": model, "workload": workload, "pricePerGpuHour": price, "gpusPerReplica": gpus,
            "decision": decision.dump(), "speculativeConfig": config,
            "capacityConcurrencyPerReplica": plan.capacity_concurrency_per_replica, "candidates": rows}


def _fmt(value, spec: str = ".0f") -> str:
    return "-" if value is None else format(value, spec)


def render_table(results: list[dict[str, Any]]) -> str:
    out = io.StringIO()
    for group in results:
        d = group["decision"]
        out.write(f"== {group['sku']}  {group['model']}  ({group['workload']}, "
                  f"${group['pricePerGpuHour']:g}/GPU-h x {group['gpusPerReplica']})\n")
        out.write(f"chosen: {d.get('method') or 'no speculation'}  strategy={d.get('strategy')}  "
                  f"speedup={_fmt(d.get('expectedSpeedup'), '.2f')}x  "
                  f"capacity={_fmt(group['capacityConcurrencyPerReplica'])} req/replica\n")
        out.write(f"reason: {d.get('reason')}\n")
        if group["speculativeConfig"]:
            out.write(f"--speculative-config '{json.dumps(group['speculativeConfig'], separators=(',', ':'))}'\n")
        header = (f"{'candidate':<14}{'strategy':<9}{'K':>3} {'crossover':>14} {'goodput tok/s':>14} {'$/Mtok':>8}"
                  f"  schedule")
        out.write(header + "\n")
        imprecise = []
        for row in group["candidates"]:
            if not row["ready"]:
                out.write(f"{row['candidate']:<14}{'-':<9}{'-':>3} {'-':>14} {'-':>14} {'-':>8}  {row['note']}\n")
                continue
            crossover = _fmt(row["crossoverConcurrency"])
            uncertainty = row.get("crossoverUncertaintyPercent")
            if row["crossoverConcurrency"] is not None and uncertainty is not None:
                crossover += f" ±{uncertainty:.1f}%"
                if uncertainty > group.get("minGainPercent", 0):
                    imprecise.append(f"±{uncertainty:.1f}% ({row['candidate']})")
            out.write(f"{row['candidate']:<14}{row['strategy']:<9}{row['numSpeculativeTokens']:>3} "
                      f"{crossover:>14} {_fmt(row['expectedGoodputTokS']):>14} "
                      f"{_fmt(row['costPerMtok'], '.3f'):>8}  {row['schedule']}\n")
        if imprecise:
            out.write(f"note: the gain at the crossover is known to {', '.join(imprecise)} (one standard error), "
                      f"more than the {group['minGainPercent']:g}% minimum gain: the crossover may be off by a "
                      f"profiled level; more requests per level narrow it (four times as many halve it)\n")
        refine = group.get("refine")
        if refine:
            out.write(_refine_text(refine))
        methods = [r for r in group["candidates"] if r["kByConcurrency"]]
        if methods:
            out.write(f"{'concurrency':<12}" + "".join(f"{r['candidate'] + ' k/tok/s':>22}" for r in methods) + "\n")
            for c in _TABLE_LEVELS:
                cells = []
                for r in methods:
                    if str(c) in r["kByConcurrency"]:
                        cells.append(f"{r['kByConcurrency'][str(c)]}/{r['goodputByConcurrency'][str(c)]:.0f}")
                    else:
                        cells.append("-")
                out.write(f"{c:<12}" + "".join(f"{cell:>22}" for cell in cells) + "\n")
        out.write("\n")
    return out.getvalue()


def _refine_text(refine: dict[str, Any]) -> str:
    """The refinement in words: which boundaries are uncertain, and the measurements that would settle them."""
    lines = []
    uncertain = refine["uncertain"]
    for b in uncertain:
        where = (f"SD off above {b['batchSize']} concurrent requests" if b["crossover"]
                 else f"k {b['fromK']} -> {b['toK']} at {b['batchSize']}")
        known = "unknown" if b["uncertaintyPercent"] is None else f"±{b['uncertaintyPercent']:.1f}%"
        lines.append(f"uncertain: {b['candidate']} {where}: the gain there is known to {known}, and the "
                     f"{b['thresholdPercent']:g}% minimum gain needs ±{b['neededPercent']:.1f}% (measuring at "
                     f"concurrency {', '.join(map(str, b['levels']))} settles it)")
    if refine["jobs"]:
        left = refine.get("unaddressed") or []
        tail = (f"; the budget does not reach the change{'s' if len(left) > 1 else ''} at "
                f"{', '.join(map(str, left))}" if left else "")
        lines.append(f"refine: measuring these narrows it ({refine['requestedLevels']} levels of the "
                     f"{refine['budgetLevels'] - refine['spentLevels']} left in the budget{tail}):")
        for job in refine["jobs"]:
            name = job["profileName"] or job["profile"]
            lines.append(f"  {job['profile']}: k={','.join(map(str, job['ks']))} at concurrency "
                         f"{','.join(map(str, job['levels']))}, {job['repeat']} time"
                         f"{'s' if job['repeat'] != 1 else ''} each: specpilot-bench --profile-name {name} "
                         f"--levels {','.join(map(str, job['levels']))} --ks {','.join(map(str, job['ks']))} "
                         f"--repeat {job['repeat']} --append")
    elif uncertain:
        lines.append(f"refine: nothing more to measure: {refine['reason']}")
    return "".join(line + "\n" for line in lines)


def cmd_plan(args: argparse.Namespace) -> int:
    try:
        profiles = load_profiles(args.profile)
        histogram = load_histogram(args.concurrency_histogram) if args.concurrency_histogram else None
        results = plan_groups(profiles, args, histogram)
    except PlanInputError as exc:
        print(f"specpilot plan: {exc}", file=sys.stderr)
        return 2
    if args.output == "json":
        print(json.dumps(results, indent=2, default=str))
    else:
        sys.stdout.write(render_table(results))
    return 0
