"""Physical plausibility of a profile's measured results, before any decision rests on them.

A SpeculationProfile's result is written by a benchmark pod, whose engine container runs code the tenant chose
(model code, plugins): that code cannot seal a result (it holds no token), but it can make the engine the bench
measures lie. A result no GPU can produce (10x the bandwidth roofline, concurrency 1e9, -0.0 tokens/s, an
acceptance rate of 3, NaN) must fail the profile with a reason naming the bound, never reach the planner. The
bounds are keyed on what the profile claims: its SKU's catalog entry (perf/catalog.py) and its model's shape
(perf/models.py):

- output tokens/s at concurrency c and K speculative tokens <= THROUGHPUT_MARGIN x min(
  memory roofline: c x (K+1) tokens per decode step (a step emits at most K+1 tokens per request), a step
  reading at least the model's weights (streamed parameters x bytes per weight: the model's dtype, `--dtype`'s
  when the engine sets it, or 4 bits where the weights are quantized: `--quantization`/`-q`, a quantized
  `--load-format`, or a quantisation marker in the model id or revision; never the KV cache's dtype, which
  leaves the weights as they are) from HBM at the datasheet bandwidth of tensorParallelSize GPUs;
  compute roofline: every output token costs at least 2 x parameters FLOPs, at the datasheet dense BF16
  throughput (twice that, FP8, when quantized)).
  THROUGHPUT_MARGIN (1.25) covers the timing noise of a short level; a real engine stays well below the
  datasheet roofline (about 70-90% of its bandwidth at batch 1). Llama-3.1-8B (bf16) at concurrency 1:
  A100-80GB-SXM 170 (K=0) / 849 (K=4) tokens/s; H100-SXM 279 / 1,395; H200 400 / 1,999; B200 666 / 3,331;
  L40S 72 / 360; MI300X 441 / 2,207 (docs/security.md has the table; `bound_table()` computes it; the old
  bound, 4 x a 4-bit roofline, allowed 17,850 tokens/s on an H100 at concurrency 1 and K=4).
  An unknown SKU (a CPU, a GPU the catalog lacks) or an unknown model (a local path) keeps a generous bound,
  UNKNOWN_SAFETY_FACTOR x the roofline of the fastest catalog GPU and a 50M-parameter 4-bit model, and the
  refusal says which it used;
- latencies at or above the step-time floor: a request's TPOT and every inter-token gap carry at most K+1
  tokens per step, so neither is below 1 / the bound at concurrency 1 (seconds per token); a TTFT or an
  end-to-end latency is at least one forward pass (1 / the K=0 bound at concurrency 1);
- token counts against what the streams carried (output throughput x duration): the engine's generated tokens
  agree with them, give or take TOKEN_TOLERANCE, the warm-up and the failed requests; the streams carry at
  most outputLen tokens per request; accepted tokens never exceed the draft tokens, draft tokens never
  exceed K per draft, a position is accepted at most once per draft, and a request-step carries at most one
  draft (drafts <= generated - accepted - completed, `specpilot.specdec`'s request-steps, + K per request: a
  last step may accept drafts past max_tokens);
- request counts against what was asked, the duration and the rate: completed + failed <= the requests a level
  sends (max(requestsPerLevel, MIN_WAVES x concurrency)), at most `concurrency` requests at a time each taking
  at least one forward pass, the request rate within TOKEN_TOLERANCE of completed / duration, goodput at most
  the request rate, at most `concurrency` requests running or waiting;
- only the concurrency levels the operator asked for: the spec's concurrencyLevels, or those of a refinement
  round, which the operator records in the profile's REFINE_LEVELS_ANNOTATION when it starts one (metadata:
  the benchmark's identity may write the status only); every output throughput positive and finite (0, -0.0,
  NaN and infinities are refused);
- acceptance per position within [0, 1], non-increasing (tolerance ACCEPTANCE_TOLERANCE), at most K
  positions; mean acceptance length at most K+1; per-position accepted counts non-increasing;
- KV capacity within the GPUs' memory at one byte per KV element (known models);
- every number finite and non-negative (-0.0 included); the status parses as the model says.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from ..api.args import flag_items
from ..api.base import cap, format_validation_error
from ..api.profile import LevelPoint, SpeculationProfile
from .bench_model import DEFAULT_WARMUP_REQUESTS, MIN_WAVES, default_warmup, level_requests
from .catalog import DEFAULT_CATALOG, GpuCatalog, GpuSpec, UnknownGpuError
from .models import ModelShape, UnknownModelError, resolve_model

THROUGHPUT_MARGIN = 1.25
"""How far above the datasheet roofline of the profile's claimed SKU and model a measurement may be (timing noise
of a short level) before it is refused."""
UNKNOWN_SAFETY_FACTOR = 4.0
"""The generous factor over the fastest catalog GPU's roofline for an unknown SKU or model; also the KV bound's."""
SAFETY_FACTOR = UNKNOWN_SAFETY_FACTOR
"""The generous bound's factor (kept under its old name for the KV-capacity check and its callers)."""
QUANTIZED_MARKERS = ("fp8", "int8", "int4", "awq", "gptq", "w8a8", "w4a16", "w8a16", "fp4", "nvfp4", "mxfp4",
                     "bnb", "gguf", "4bit", "8bit", "quant", "marlin", "exl2")
"""Words in a model id or revision that mean the weights may be read at fewer bytes than the dtype's."""
QUANTIZED_LOAD_FORMATS = ("bitsandbytes", "gguf", "sharded_state", "sharded-state")
"""`--load-format` values that may load weights at fewer bytes than the dtype's."""
DTYPE_BYTES = {"half": 2, "float16": 2, "bfloat16": 2, "float": 4, "float32": 4}
"""vLLM's `--dtype` values -> bytes per weight (`auto` keeps the model's)."""
TOKEN_TOLERANCE = 0.05
"""How far the engine's counters and the client's counts may disagree (counters are read a moment apart from
the level's edges); also the request rate's against completed / duration."""
REFINE_LEVELS_ANNOTATION = "specpilot.io/refine-levels"
"""Comma-separated concurrency levels the operator's refinement rounds asked for (written with a round's Job,
removed when the profile is measured again from scratch)."""
ACCEPTANCE_TOLERANCE = 0.02
"""How much per-position acceptance may rise from one position to the next (sampling of counters)."""
MIN_UNKNOWN_MODEL_PARAMS = 50_000_000
"""Parameters assumed for a model the catalog does not know (a lower bound: a higher ceiling)."""
MIN_BYTES_PER_WEIGHT = 0.5
"""4-bit weights: the fewest bytes a decode step can read per parameter."""
FP8_COMPUTE_FACTOR = 2.0
"""FP8 tensor cores do about twice the dense BF16 FLOPs."""
MAX_PROBLEMS = 5


REFINE_MAX_BATCH = 256
"""The largest concurrency a refinement round measures at (vLLM's default max_num_seqs, the largest batch a
schedule covers: policy.refine places a crossover up to it, beyond the spec's sweep when the gain lasts).
A point is accepted only at a level the operator asked for (`asked_levels`), never merely below this."""


def _non_finite_or_negative(node: Any, path: str, out: list[str]) -> None:
    if len(out) >= MAX_PROBLEMS:
        return
    if isinstance(node, bool):
        return
    if isinstance(node, int | float):
        if isinstance(node, float) and not math.isfinite(node):
            out.append(f"{path} is {node!r}: a measurement must be a finite number")
        elif node < 0 or (isinstance(node, float) and math.copysign(1.0, node) < 0):
            out.append(f"{path} is {node!r}: a measurement cannot be negative")
    elif isinstance(node, dict):
        for key, value in node.items():
            _non_finite_or_negative(value, f"{path}.{key}", out)
    elif isinstance(node, list):
        for i, value in enumerate(node):
            _non_finite_or_negative(value, f"{path}[{i}]", out)


def _gpu(sku: str, catalog: GpuCatalog) -> GpuSpec:
    try:
        return catalog.resolve(sku)
    except (UnknownGpuError, KeyError, ValueError):
        return max(catalog, key=lambda g: (g.hbm_bandwidth_gb_s, g.bf16_dense_tflops))


def _model(model_id: str) -> ModelShape | None:
    try:
        return resolve_model(model_id)
    except (UnknownModelError, KeyError, ValueError):
        return None


def throughput_ceiling(gpu: GpuSpec, params: float, tensor_parallel_size: int, concurrency: int, k: int,
                       bytes_per_weight: float = MIN_BYTES_PER_WEIGHT, quantized: bool = True) -> float:
    """Output tokens/s no engine can exceed at `concurrency` with K=`k` (before any margin): the memory roofline
    (a step reads the weights once and emits at most K+1 tokens per request) or the compute roofline (2 x
    params FLOPs per token, at BF16, or FP8 when `quantized`), whichever is lower."""
    tp = max(1, tensor_parallel_size)
    step_s = params * bytes_per_weight / (gpu.hbm_bandwidth_gb_s * 1e9 * tp)
    memory = concurrency * (k + 1) / step_s
    compute = gpu.bf16_dense_tflops * 1e12 * (FP8_COMPUTE_FACTOR if quantized else 1.0) * tp / (2 * params)
    return min(memory, compute)


@dataclass(frozen=True)
class WeightPrecision:
    """How the engine stores the target's weights, from the model id and the weights' own flags."""

    quantized: bool
    """Read at MIN_BYTES_PER_WEIGHT (4 bits) at best."""
    dtype_bytes: float | None
    """`--dtype`'s bytes per weight; None: the model's own."""
    basis: str
    """What said so ("" for the model's own dtype)."""


def _flag_values(args: list[str]) -> list[tuple[str, str | None]]:
    """(flag name in `-` spelling without dashes, or a short alias with its dash; its value or None) for each
    flag of vLLM arguments (api.args.flag_items: the value given after `=` or as the next argument)."""
    return [(name[2:].split(".", 1)[0].replace("_", "-") if name.startswith("--") else name, value)
            for _, _, name, value in flag_items(args)]


def weight_precision(model_id: str, revision: str | None, extra_args: list[str]) -> WeightPrecision:
    """The weights' precision: quantized where `--quantization` (`-q`, any abbreviation, a dotted sub-key of it,
    or any other flag about quantisation) sets a method, `--load-format` loads a quantized format, or the model
    id or revision carries a quantisation marker; else `--dtype`'s bytes when it sets one. The KV cache's dtype
    (`--kv-cache-dtype fp8`) says nothing about the weights, so it never counts."""
    for name, value in _flag_values(extra_args):
        method = (value or "").strip().lower()
        if name == "-q" or (len(name) >= 3 and "quantization".startswith(name)) or (
                "quant" in name and not name.startswith("kv-cache")):
            if method not in ("", "none", "null"):
                return WeightPrecision(True, None, f"--{name.lstrip('-')} {cap(method, 40)}")
        if name == "load-format" and method in QUANTIZED_LOAD_FORMATS:
            return WeightPrecision(True, None, f"--load-format {method}")
    for word in (model_id, revision or ""):
        marker = next((m for m in QUANTIZED_MARKERS if m in word.lower()), None)
        if marker:
            return WeightPrecision(True, None, f"{marker!r} in {cap(word, 80)!r}")
    dtype = next((DTYPE_BYTES[v.strip().lower()] for n, v in _flag_values(extra_args)
                  if n == "dtype" and v and v.strip().lower() in DTYPE_BYTES), None)
    return WeightPrecision(False, None if dtype is None else float(dtype),
                           "" if dtype is None else f"--dtype ({dtype} bytes)")


def _precision(profile: SpeculationProfile) -> WeightPrecision:
    engine = profile.spec.engine
    return weight_precision(profile.spec.model.id, profile.spec.model.revision, engine.extra_args if engine else [])


def _catalog_gpu(sku: str, catalog: GpuCatalog) -> GpuSpec | None:
    try:
        return catalog.resolve(sku)
    except (UnknownGpuError, KeyError, ValueError):
        return None


@dataclass(frozen=True)
class ThroughputBound:
    """The output-throughput bound a profile's claims give: ceiling(c, k) tokens/s, and how it was chosen."""

    gpu: GpuSpec
    params: float
    bytes_per_weight: float
    quantized: bool
    tensor_parallel_size: int
    factor: float
    basis: str

    def ceiling(self, concurrency: int, k: int) -> float:
        return self.factor * throughput_ceiling(self.gpu, self.params, self.tensor_parallel_size, concurrency, k,
                                                self.bytes_per_weight, self.quantized)

    def token_floor_ms(self, k: int) -> float:
        """The shortest time a request can take per output token at K=`k`: a step emits at most K+1 of its
        tokens, so one request alone (concurrency 1) at the bound."""
        return 1000.0 / self.ceiling(1, k)

    def pass_floor_ms(self) -> float:
        """The shortest forward pass (one step reading the weights, K=0): a first token, or a whole request."""
        return 1000.0 / self.ceiling(1, 0)


def throughput_bound(profile: SpeculationProfile, catalog: GpuCatalog = DEFAULT_CATALOG) -> ThroughputBound:
    """The bound for `profile`: tight (THROUGHPUT_MARGIN over the claimed SKU's and model's roofline) when the
    catalog knows both, generous (UNKNOWN_SAFETY_FACTOR over the fastest GPU's, a 50M-parameter 4-bit model)
    when it does not, saying which."""
    spec = profile.spec
    tp = spec.model.tensor_parallel_size
    gpu = _catalog_gpu(spec.sku, catalog)
    shape = _model(spec.model.id)
    if gpu is not None and shape is not None:
        precision = _precision(profile)
        quantized = precision.quantized
        per_weight = (MIN_BYTES_PER_WEIGHT if quantized else
                      precision.dtype_bytes if precision.dtype_bytes is not None else float(shape.dtype_bytes))
        why = f", quantized: {precision.basis}" if quantized else (f", {precision.basis}" if precision.basis else "")
        return ThroughputBound(gpu, float(shape.streamed_params), per_weight, quantized, tp, THROUGHPUT_MARGIN,
                               f"{THROUGHPUT_MARGIN:g} x the memory/compute roofline of {gpu.sku}, {shape.name} "
                               f"({shape.streamed_params / 1e9:.2g}B parameters at {per_weight:g} bytes{why}), "
                               f"TP {tp}")
    fastest = max(catalog, key=lambda g: (g.hbm_bandwidth_gb_s, g.bf16_dense_tflops))
    unknown = " and ".join(w for w in (f"SKU {cap(spec.sku, 60)!r}" if gpu is None else "",
                                       f"model {cap(spec.model.id, 80)!r}" if shape is None else "") if w)
    params = float(shape.streamed_params) if shape else float(MIN_UNKNOWN_MODEL_PARAMS)
    return ThroughputBound(fastest if gpu is None else gpu, params, MIN_BYTES_PER_WEIGHT, True, tp,
                           UNKNOWN_SAFETY_FACTOR,
                           f"{unknown} not in the catalog, so a generous bound: {UNKNOWN_SAFETY_FACTOR:g} x the "
                           f"roofline of {(fastest if gpu is None else gpu).sku} and a "
                           f"{params / 1e9:.2g}B-parameter 4-bit model, TP {tp}")


def bound_table(model_id: str = "meta-llama/Llama-3.1-8B-Instruct", ks: tuple[int, ...] = (0, 4),
                concurrency: int = 1, catalog: GpuCatalog = DEFAULT_CATALOG) -> dict[str, list[float]]:
    """SKU -> the tight output-throughput bound (tokens/s) of a bf16 `model_id` at `concurrency`, per k in
    `ks`: the figures docs/security.md quotes."""
    from ..api.profile import ProfileTarget, SpeculationProfileSpec

    out: dict[str, list[float]] = {}
    for gpu in catalog:
        spec = SpeculationProfileSpec(model=ProfileTarget(id=model_id), sku=gpu.sku, engine_image="vllm:x",
                                      concurrency_levels=[concurrency])
        bound = throughput_bound(SpeculationProfile(spec=spec))
        out[gpu.sku] = [bound.ceiling(concurrency, k) for k in ks]
    return out


def asked_levels(profile: SpeculationProfile) -> tuple[list[int], list[int]]:
    """The concurrency levels the operator asked this profile to be measured at: (its spec's concurrencyLevels,
    those its refinement rounds asked for, from REFINE_LEVELS_ANNOTATION: unreadable entries are left out)."""
    annotations = profile.metadata.get("annotations") or {}
    recorded = annotations.get(REFINE_LEVELS_ANNOTATION) if isinstance(annotations, dict) else None
    refine = sorted({int(w) for w in str(recorded or "").replace(",", " ").split() if w.isdigit() and 0 < int(w)
                     <= REFINE_MAX_BATCH * 64})
    return list(profile.spec.concurrency_levels), refine


def refine_levels_annotation(recorded: str | None, levels: list[int] | tuple[int, ...]) -> str:
    """REFINE_LEVELS_ANNOTATION's value with `levels` added to what it `recorded` (ascending, unique)."""
    kept = {int(w) for w in str(recorded or "").replace(",", " ").split() if w.isdigit()}
    return ",".join(str(c) for c in sorted(kept | {int(c) for c in levels}))


def level_problem(at: str, concurrency: int, spec_levels: list[int], refine_levels: list[int]) -> str | None:
    """Why a point's concurrency is not one the operator asked for (None: it is)."""
    if concurrency in spec_levels or concurrency in refine_levels:
        return None
    rounds = f" or a refinement round's {cap(str(refine_levels), 120)}" if refine_levels else " (no refinement round"\
        " asked for others)"
    return (f"{at}.concurrency is {concurrency}, not a level the operator asked for: spec.concurrencyLevels "
            f"{cap(str(spec_levels), 120)}{rounds}")


_LATENCIES = (("ttftMs", "ttft_ms", False), ("tpotMs", "tpot_ms", True), ("itlMs", "itl_ms", True),
              ("e2eLatencyMs", "e2e_latency_ms", False))


def latency_problems(at: str, point: LevelPoint, k: int, bound: ThroughputBound) -> list[str]:
    """Why a point's latencies are faster than a step can be: TPOT and inter-token gaps below the per-token
    floor (K+1 tokens per step at the bound), TTFT and end-to-end latency below one forward pass."""
    out: list[str] = []
    per_token, per_pass = bound.token_floor_ms(k), bound.pass_floor_ms()
    for field, attr, per_step in _LATENCIES:
        stats = getattr(point, attr)
        floor = per_token if per_step else per_pass
        for stat in ("mean", "p50", "p90", "p99"):
            value = getattr(stats, stat)
            if value is not None and value < floor:
                what = (f"the step-time floor {floor:.3g} ms per token at K={k}" if per_step else
                        f"one forward pass, {floor:.3g} ms")
                out.append(f"{at}.{field}.{stat} {value:.4g} ms is below {what} ({bound.basis})")
                break
    return out


def request_problems(at: str, point: LevelPoint, requests_per_level: int, bound: ThroughputBound) -> list[str]:
    """Why a point's request counts cannot be: more finished than the level sent, more than `concurrency`
    requests at a time of at least one forward pass each could finish in its duration, a request rate that is
    not completed / duration, a goodput above the rate, more requests running or waiting than were sent at
    once."""
    out: list[str] = []
    c = point.concurrency
    asked = level_requests(c, requests_per_level)
    if point.completed + point.failed > asked:
        out.append(f"{at}.completed + failed is {point.completed + point.failed}, more than the {asked} requests the "
                   f"level sends (max(spec.requestsPerLevel {requests_per_level}, {MIN_WAVES} x concurrency {c}))")
    pass_s = bound.pass_floor_ms() / 1000.0
    if point.duration_s > 0:
        most = c * (point.duration_s / pass_s + 1)
        if point.completed > most:
            out.append(f"{at}.completed is {point.completed}, more than {most:.4g} requests: {c} at a time, each at "
                       f"least one forward pass ({pass_s * 1000:.3g} ms), in durationS {point.duration_s:.4g} "
                       f"({bound.basis})")
        rate = point.completed / point.duration_s
        if point.request_throughput > rate * (1 + TOKEN_TOLERANCE) + 1e-9:
            out.append(f"{at}.requestThroughput is {point.request_throughput:.4g}/s, more than completed / durationS "
                       f"= {rate:.4g}/s (+{TOKEN_TOLERANCE:.0%})")
    elif point.request_throughput > c / pass_s:
        out.append(f"{at}.requestThroughput is {point.request_throughput:.4g}/s, more than {c} requests at a time of "
                   f"one forward pass ({pass_s * 1000:.3g} ms) each can finish ({bound.basis})")
    if point.goodput is not None and point.goodput > point.request_throughput * (1 + TOKEN_TOLERANCE) + 1e-9:
        out.append(f"{at}.goodput is {point.goodput:.4g}/s, more than the requestThroughput "
                   f"{point.request_throughput:.4g}/s (goodput counts the requests that met the SLO)")
    for field, value in (("meanRunning", point.mean_running), ("meanWaiting", point.mean_waiting)):
        if value is not None and value > c * (1 + TOKEN_TOLERANCE):
            out.append(f"{at}.{field} is {value:.4g}, more than the concurrency {c} the client kept in flight")
    return out


def token_problems(at: str, point: LevelPoint, k: int, output_len: int, requests_per_level: int) -> list[str]:
    """Why a point's token counts disagree with what its streams carried (outputThroughput x durationS) and
    with each other: generated tokens beyond the streams' (give or take TOKEN_TOLERANCE, the warm-up and the
    failed requests' outputLen each) or below them, streams carrying more than outputLen per completed request,
    accepted tokens beyond the draft tokens, draft tokens beyond K per draft, a position accepted more often
    than there were drafts, more drafts than request-steps."""
    out: list[str] = []
    c = point.concurrency
    warmup = default_warmup(c)  # the engine's counters include the warm-up
    generated = point.generation_tokens
    if point.duration_s > 0:
        streamed = point.output_throughput * point.duration_s
        carried = (point.completed + point.failed) * output_len
        if streamed > carried * (1 + TOKEN_TOLERANCE) + 1:
            out.append(f"{at}.outputThroughput x durationS is {streamed:.4g} tokens, more than the "
                       f"{point.completed + point.failed} requests (completed + failed) can carry at outputLen "
                       f"{output_len} each ({carried})")
        if generated is not None:
            most = streamed * (1 + TOKEN_TOLERANCE) + (warmup + point.failed) * output_len + point.completed
            least = streamed * (1 - TOKEN_TOLERANCE) - point.completed
            if generated > most:
                out.append(f"{at}.generationTokens is {generated}, more than the {streamed:.4g} tokens its streams "
                           f"carried (outputThroughput x durationS) allow: at most {most:.4g} with "
                           f"+{TOKEN_TOLERANCE:.0%}, {warmup} warm-up and {point.failed} failed requests of outputLen "
                           f"{output_len}")
            elif generated < least:
                out.append(f"{at}.generationTokens is {generated}, fewer than the {streamed:.4g} tokens its streams "
                           f"carried (outputThroughput x durationS; at least {least:.4g})")
    elif generated is not None:
        most = (level_requests(c, requests_per_level) + warmup) * output_len
        if generated > most:
            out.append(f"{at}.generationTokens is {generated}, more than the level's requests and warm-up can "
                       f"generate ({most} at outputLen {output_len})")
    drafts, draft_tokens, accepted = point.num_drafts, point.num_draft_tokens, point.num_accepted_tokens
    if k == 0 and any(x for x in (drafts, draft_tokens, accepted, *point.accepted_per_position)):
        out.append(f"{at} counts drafts or accepted tokens in a run without speculation (K=0)")
        return out
    if accepted is not None and draft_tokens is not None and accepted > draft_tokens:
        out.append(f"{at}.numAcceptedTokens is {accepted}, more than the numDraftTokens {draft_tokens}: only a "
                   f"drafted token can be accepted")
    if drafts is not None and draft_tokens is not None and draft_tokens > drafts * k:
        out.append(f"{at}.numDraftTokens is {draft_tokens}, more than K={k} per draft ({drafts} numDrafts)")
    if drafts is not None and point.accepted_per_position and max(point.accepted_per_position) > drafts:
        out.append(f"{at}.acceptedPerPosition {cap(str(point.accepted_per_position), 80)} exceeds the numDrafts "
                   f"{drafts}: a position is accepted at most once per draft")
    if accepted is not None and sum(point.accepted_per_position) > accepted * (1 + TOKEN_TOLERANCE) + 1:
        out.append(f"{at}.acceptedPerPosition sums to {sum(point.accepted_per_position)}, more than the "
                   f"numAcceptedTokens {accepted}")
    if generated is not None:
        accepted_all = accepted if accepted is not None else sum(point.accepted_per_position)
        # A request's last step may accept drafts past its max_tokens, which its output drops: up to K per
        # request (warm-up included) of accepted tokens that are not among the generated ones.
        steps = generated - accepted_all - point.completed + k * (point.completed + warmup)
        if steps < 0:
            out.append(f"{at}.generationTokens is {generated}, fewer than the accepted tokens {accepted_all} plus "
                       f"one first token per completed request ({point.completed}), less K={k} per request")
        elif drafts is not None and drafts > steps * (1 + TOKEN_TOLERANCE) + 1:
            out.append(f"{at}.numDrafts is {drafts}, more than the {steps} request-steps (generationTokens - "
                       f"accepted - completed, + K per request for the last step's drafts): a request-step "
                       f"carries at most one draft")
    return out


def result_problems(body: dict[str, Any], catalog: GpuCatalog = DEFAULT_CATALOG) -> list[str]:
    """Why the result in a SpeculationProfile object (as stored) cannot be true, each naming the field and
    the bound it breaks (empty: plausible)."""
    status = body.get("status") or {}
    problems: list[str] = []
    _non_finite_or_negative(status, "status", problems)
    if problems:
        return problems
    try:
        profile = SpeculationProfile.model_validate(body)
    except ValidationError as exc:
        return [f"the result does not parse: {format_validation_error(exc, root='')}"]
    spec, result = profile.spec, profile.status
    if result is None:
        return []
    gpu = _gpu(spec.sku, catalog)
    shape = _model(spec.model.id)
    tp = spec.model.tensor_parallel_size
    max_k = spec.method.num_speculative_tokens if spec.method else 0
    known = f"{gpu.sku}, {shape.name if shape else 'an unknown model'}, TP {tp}"
    bound = throughput_bound(profile, catalog)
    spec_levels, refine_levels = asked_levels(profile)
    output_len = spec.workload.output_len
    for r, run in enumerate(result.runs):
        at = f"status.runs[{r}]"
        k = run.num_speculative_tokens
        if k > max_k:
            problems.append(f"{at}.numSpeculativeTokens is {k}, more than the method's {max_k}")
            continue
        for p, point in enumerate(run.points):
            where = f"{at}.points[{p}]"
            level = level_problem(where, point.concurrency, spec_levels, refine_levels)
            if level:
                problems.append(level)
                continue
            if not point.output_throughput > 0:
                problems.append(f"{where}.outputThroughput is {point.output_throughput!r}: a measured level "
                                f"must have a positive throughput")
                continue
            ceiling = bound.ceiling(point.concurrency, k)
            if point.output_throughput > ceiling:
                problems.append(
                    f"{where}.outputThroughput is {point.output_throughput:.4g} tokens/s at concurrency "
                    f"{point.concurrency} and K={k}, above the physical bound of {ceiling:.4g} ({bound.basis})")
            counts = point.accepted_per_position
            if any(b > a * (1 + ACCEPTANCE_TOLERANCE) + 1 for a, b in zip(counts, counts[1:], strict=False)):
                problems.append(f"{where}.acceptedPerPosition rises with the position ({cap(str(counts), 80)}): "
                                f"a token is accepted only after every earlier one")
            if len(counts) > k:
                problems.append(f"{where}.acceptedPerPosition has {len(counts)} positions, more than K={k}")
            problems += latency_problems(where, point, k, bound)
            problems += request_problems(where, point, spec.requests_per_level, bound)
            problems += token_problems(where, point, k, output_len, spec.requests_per_level)
            if len(problems) >= MAX_PROBLEMS:
                break
        acceptance = run.acceptance
        if acceptance is not None:
            rates = acceptance.per_position
            if any(not 0 <= x <= 1 for x in rates):
                problems.append(f"{at}.acceptance.perPosition {cap(str(rates), 80)} is outside [0, 1]")
            elif any(b > a + ACCEPTANCE_TOLERANCE for a, b in zip(rates, rates[1:], strict=False)):
                problems.append(f"{at}.acceptance.perPosition {cap(str(rates), 80)} rises with the position (by more "
                                f"than {ACCEPTANCE_TOLERANCE:g}): a token is accepted only after every earlier one")
            if len(rates) > max(k, max_k):
                problems.append(f"{at}.acceptance.perPosition has {len(rates)} positions, more than K={max(k, max_k)}")
            mal = acceptance.mean_acceptance_length
            if mal is not None and mal > k + 1 + ACCEPTANCE_TOLERANCE:
                problems.append(f"{at}.acceptance.meanAcceptanceLength is {mal:.4g}, more than K+1 = {k + 1}")
        if len(problems) >= MAX_PROBLEMS:
            break
    top = max([*spec_levels, *refine_levels])
    if result.max_concurrency_measured is not None and result.max_concurrency_measured > top:
        problems.append(f"status.maxConcurrencyMeasured is {result.max_concurrency_measured}, more than the largest "
                        f"level the operator asked for ({top})")
    if shape is not None and result.kv_capacity_tokens:
        memory = gpu.memory_gib * 2**30 * tp
        per_token = shape.kv_bytes_per_token / shape.dtype_bytes  # one byte per KV element (FP8 KV cache)
        ceiling = SAFETY_FACTOR * memory / per_token
        if result.kv_capacity_tokens > ceiling:
            problems.append(f"status.kvCapacityTokens is {result.kv_capacity_tokens}, more than {ceiling:.4g} "
                            f"tokens fit in the memory of {known}")
    return problems[:MAX_PROBLEMS]


_CHECKED: dict[tuple[str, str, str], list[str]] = {}
_CHECKED_LIMIT = 4096


def checked_result_problems(body: dict[str, Any], catalog: GpuCatalog = DEFAULT_CATALOG) -> list[str]:
    """`result_problems`, remembered per stored version of the object (namespace, name, resourceVersion), so
    a reconciliation does not re-parse every Succeeded profile it reuses."""
    meta = body.get("metadata") or {}
    key = (str(meta.get("namespace", "")), str(meta.get("name", "")), str(meta.get("resourceVersion", "")))
    if not key[2]:
        return result_problems(body, catalog)
    if key not in _CHECKED:
        if len(_CHECKED) >= _CHECKED_LIMIT:
            _CHECKED.clear()
        _CHECKED[key] = result_problems(body, catalog)
    return _CHECKED[key]
