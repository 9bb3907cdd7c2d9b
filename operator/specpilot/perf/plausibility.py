"""Physical plausibility of a profile's measured results, before any decision rests on them.

A SpeculationProfile's result is written by a benchmark pod, whose engine container runs code the tenant chose
(model code, plugins): that code cannot seal a result (it holds no token), but it can make the engine the bench
measures lie. A result no GPU can produce (10x the bandwidth roofline, concurrency 1e9, -0.0 tokens/s, an
acceptance rate of 3, NaN) must fail the profile with a reason naming the bound, never reach the planner. The
bounds are keyed on what the profile claims: its SKU's catalog entry (perf/catalog.py) and its model's shape
(perf/models.py):

- output tokens/s at concurrency c and K speculative tokens <= THROUGHPUT_MARGIN x min(
  memory roofline: c x (K+1) tokens per decode step (a step emits at most K+1 tokens per request), a step
  reading at least the model's weights (streamed parameters x bytes per weight: the model's dtype, or 4 bits
  where the profile's engine or model id says it is quantized) from HBM at the datasheet bandwidth of
  tensorParallelSize GPUs;
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
- concurrency within what the profile may be measured at: its spec's largest concurrency level, or a
  refinement round's level up to REFINE_MAX_BATCH (the largest batch a schedule covers); every output throughput
  positive and finite (0, -0.0, NaN and infinities are refused);
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

from ..api.base import cap, format_validation_error
from ..api.profile import SpeculationProfile
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
"""Words in a model id or engine arguments that mean the weights may be read at fewer bytes than the dtype's."""
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
schedule covers: policy.refine places a crossover up to it, beyond the spec's sweep when the gain lasts)."""


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


def _quantized(profile: SpeculationProfile) -> bool:
    engine = profile.spec.engine
    words = [profile.spec.model.id, *(engine.extra_args if engine else [])]
    return any(marker in word.lower() for word in words for marker in QUANTIZED_MARKERS)


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


def throughput_bound(profile: SpeculationProfile, catalog: GpuCatalog = DEFAULT_CATALOG) -> ThroughputBound:
    """The bound for `profile`: tight (THROUGHPUT_MARGIN over the claimed SKU's and model's roofline) when the
    catalog knows both, generous (UNKNOWN_SAFETY_FACTOR over the fastest GPU's, a 50M-parameter 4-bit model)
    when it does not, saying which."""
    spec = profile.spec
    tp = spec.model.tensor_parallel_size
    gpu = _catalog_gpu(spec.sku, catalog)
    shape = _model(spec.model.id)
    if gpu is not None and shape is not None:
        quantized = _quantized(profile)
        per_weight = MIN_BYTES_PER_WEIGHT if quantized else float(shape.dtype_bytes)
        return ThroughputBound(gpu, float(shape.streamed_params), per_weight, quantized, tp, THROUGHPUT_MARGIN,
                               f"{THROUGHPUT_MARGIN:g} x the memory/compute roofline of {gpu.sku}, {shape.name} "
                               f"({shape.streamed_params / 1e9:.2g}B parameters at {per_weight:g} bytes"
                               f"{', quantized' if quantized else ''}), TP {tp}")
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
    top_level = max(max(spec.concurrency_levels), REFINE_MAX_BATCH)
    for r, run in enumerate(result.runs):
        at = f"status.runs[{r}]"
        k = run.num_speculative_tokens
        if k > max_k:
            problems.append(f"{at}.numSpeculativeTokens is {k}, more than the method's {max_k}")
            continue
        for p, point in enumerate(run.points):
            if point.concurrency > top_level:
                problems.append(f"{at}.points[{p}].concurrency is {point.concurrency}, more than the profile may be "
                                f"measured at (its spec's largest concurrency level, or a refinement round's up to "
                                f"{top_level})")
                continue
            if not point.output_throughput > 0:
                problems.append(f"{at}.points[{p}].outputThroughput is {point.output_throughput!r}: a measured level "
                                f"must have a positive throughput")
                continue
            ceiling = bound.ceiling(point.concurrency, k)
            if point.output_throughput > ceiling:
                problems.append(
                    f"{at}.points[{p}].outputThroughput is {point.output_throughput:.4g} tokens/s at concurrency "
                    f"{point.concurrency} and K={k}, above the physical bound of {ceiling:.4g} ({bound.basis})")
            counts = point.accepted_per_position
            if any(b > a * (1 + ACCEPTANCE_TOLERANCE) + 1 for a, b in zip(counts, counts[1:], strict=False)):
                problems.append(f"{at}.points[{p}].acceptedPerPosition rises with the position ({cap(str(counts), 80)}): "
                                f"a token is accepted only after every earlier one")
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
