"""Physical plausibility of a profile's measured results, before any decision rests on them.

A SpeculationProfile's status is written by a benchmark pod (and anyone else who may patch profiles' status
in the namespace), and one profile serves every deployment that needs the same measurement. A result no
GPU can produce (1e308 tokens/s, an acceptance rate of 3, NaN) must fail the profile with a reason naming
the bound, never reach the planner. The ceilings come from the GPU catalog (perf/catalog.py) and, when the
model is a known one, its shape (perf/models.py); `SAFETY_FACTOR` keeps them well above anything real:

- output tokens/s at concurrency c and K speculative tokens <= SAFETY_FACTOR x min(
  memory roofline: c x (K+1) tokens per step, a step reading at least the weights at 4 bits from HBM at the
  datasheet bandwidth of tensorParallelSize GPUs;
  compute roofline: every output token is a processed token, costing 2 x parameters FLOPs, at twice the
  datasheet dense BF16 throughput (FP8)),
  with the largest catalog GPU for an unknown SKU and a 50M-parameter model for an unknown model;
- acceptance per position within [0, 1], non-increasing (tolerance ACCEPTANCE_TOLERANCE), at most K
  positions; mean acceptance length at most K+1; per-position accepted counts non-increasing;
- KV capacity within the GPUs' memory at one byte per KV element (known models);
- every number finite and non-negative; the status parses as the model says.
"""

from __future__ import annotations

import math
from typing import Any

from pydantic import ValidationError

from ..api.base import cap, format_validation_error
from ..api.profile import SpeculationProfile
from .catalog import DEFAULT_CATALOG, GpuCatalog, GpuSpec, UnknownGpuError
from .models import ModelShape, UnknownModelError, resolve_model

SAFETY_FACTOR = 4.0
"""How far above the datasheet roofline a measurement may be before it is refused."""
ACCEPTANCE_TOLERANCE = 0.02
"""How much per-position acceptance may rise from one position to the next (sampling of counters)."""
MIN_UNKNOWN_MODEL_PARAMS = 50_000_000
"""Parameters assumed for a model the catalog does not know (a lower bound: a higher ceiling)."""
MIN_BYTES_PER_WEIGHT = 0.5
"""4-bit weights: the fewest bytes a decode step can read per parameter."""
FP8_COMPUTE_FACTOR = 2.0
"""FP8 tensor cores do about twice the dense BF16 FLOPs."""
MAX_PROBLEMS = 5


def _non_finite_or_negative(node: Any, path: str, out: list[str]) -> None:
    if len(out) >= MAX_PROBLEMS:
        return
    if isinstance(node, bool):
        return
    if isinstance(node, int | float):
        if isinstance(node, float) and not math.isfinite(node):
            out.append(f"{path} is {node!r}: a measurement must be a finite number")
        elif node < 0:
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


def throughput_ceiling(gpu: GpuSpec, params: float, tensor_parallel_size: int, concurrency: int, k: int) -> float:
    """Output tokens/s no engine can exceed at `concurrency` with K=`k` (before SAFETY_FACTOR)."""
    tp = max(1, tensor_parallel_size)
    step_s = params * MIN_BYTES_PER_WEIGHT / (gpu.hbm_bandwidth_gb_s * 1e9 * tp)
    memory = concurrency * (k + 1) / step_s
    compute = gpu.bf16_dense_tflops * 1e12 * FP8_COMPUTE_FACTOR * tp / (2 * params)
    return min(memory, compute)


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
    params = float(shape.streamed_params) if shape else float(MIN_UNKNOWN_MODEL_PARAMS)
    tp = spec.model.tensor_parallel_size
    max_k = spec.method.num_speculative_tokens if spec.method else 0
    known = f"{gpu.sku}, {shape.name if shape else 'an unknown model'} ({params / 1e9:.2g}B parameters), TP {tp}"
    for r, run in enumerate(result.runs):
        at = f"status.runs[{r}]"
        k = run.num_speculative_tokens
        if k > max_k:
            problems.append(f"{at}.numSpeculativeTokens is {k}, more than the method's {max_k}")
            continue
        for p, point in enumerate(run.points):
            ceiling = SAFETY_FACTOR * throughput_ceiling(gpu, params, tp, point.concurrency, k)
            if point.output_throughput > ceiling:
                problems.append(
                    f"{at}.points[{p}].outputThroughput is {point.output_throughput:.4g} tokens/s at concurrency "
                    f"{point.concurrency} and K={k}, above the physical bound of {ceiling:.4g} ({SAFETY_FACTOR:g} x "
                    f"the memory/compute roofline of {known})")
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
