"""Digital twin of one vLLM replica: step time, goodput, latency and KV capacity with and without SD.

A roofline model of (GPU SKU x model x speculative method x workload), used for priors before a SKU is
profiled, for `specpilot simulate`, and for synthetic profiles and the simulated engine.

A decode step of the target with q query tokens per sequence, batch b, context c (per GPU of a TP group):

    linear    = max(streamed weight bytes / BW, 2 * P * b * q / FLOPS)     GEMMs: memory- then compute-bound
    attention = max(b * c * KV bytes per token / BW, 4 * L * H * d * b * q * c / FLOPS)
    step      = linear + attention + b * q * per_token_overhead + TP all-reduces + step_overhead

BW and FLOPS are the datasheet (or calibrated) ceilings times achieved-efficiency factors. The GEMMs and
the attention kernels run one after the other, so their times add; within each, the roofline max holds.
On H100 + Llama-3.1-8B this reproduces the published linear fit of vLLM step times
(3.93e-8 * kv_tokens + 2.10e-5 * batched_tokens + 5.89 ms, plus 1.21 ms per-step overhead) within a few
percent at batch 1-128, while also turning compute-bound when speculation multiplies the query tokens.
Speculation adds the drafter (`draft_time_s`) and verifies k + 1 tokens per sequence. See docs/twin.md.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from .. import specdec
from ..api.methods import ALL_HEADS_AT_ONCE_FAMILIES, HOST_DRAFTED_FAMILIES, SpeculativeMethod
from .acceptance import AcceptanceProfile, acceptance_profile
from .catalog import GpuSpec
from .models import ModelShape, default_drafter

__all__ = ["InsufficientMemoryError", "Twin", "TwinCalibration"]

_GIB = 1024**3


@dataclasses.dataclass(frozen=True, slots=True)
class TwinCalibration:
    """Efficiency factors and overheads; the defaults reproduce vLLM on H100 + Llama-3.1-8B (docs/twin.md)."""

    memory_bandwidth_efficiency: float = 0.80
    """Share of the bandwidth ceiling that decode GEMMs and attention reach (15.0 GB in 5.6 ms on H100)."""
    compute_efficiency: float = 0.60
    """Share of the dense BF16 ceiling that GEMMs of 100-1000 rows reach."""
    step_overhead_s: float = 1.21e-3
    """Fixed cost per engine step: scheduling, input preparation, launch, output processing."""
    per_token_overhead_s: float = 1.3e-5
    """Cost per query token outside the GEMMs: sampling, logits processing, norms, bookkeeping."""
    sd_step_overhead_s: float = 0.6e-3
    """Fixed cost per step once speculation runs: proposer bookkeeping, rejection sampling, an extra sync."""
    draft_pass_overhead_s: float = 0.15e-3
    """Launch and input-preparation cost of one drafter forward pass (CUDA-graphed)."""
    cpu_proposer_s_per_seq: float = 2.0e-6
    """n-gram lookup cost per sequence per step on the host (suffix decoding: 4x)."""
    cpu_proposer_s_per_context_token: float = 1.0e-9
    """n-gram search cost per context token scanned (suffix trees do not scan)."""
    allreduce_latency_s: float = 8.0e-6
    """Latency of one tensor-parallel all-reduce (two per layer) beyond its bytes / interconnect time."""
    activation_reserve_gib: float = 1.0
    """Memory kept out of the KV cache per GPU besides activations: CUDA graphs, allocator slack."""
    max_num_batched_tokens: int = 8192
    """Tokens per step vLLM profiles activations for (sizes the activation reserve)."""

    def __post_init__(self) -> None:
        for field in ("memory_bandwidth_efficiency", "compute_efficiency"):
            value = getattr(self, field)
            if not 0.0 < value <= 1.0:
                raise ValueError(f"TwinCalibration.{field} must be within (0, 1] (got {value})")
        for field in ("step_overhead_s", "per_token_overhead_s", "sd_step_overhead_s", "draft_pass_overhead_s",
                      "cpu_proposer_s_per_seq", "cpu_proposer_s_per_context_token", "allreduce_latency_s",
                      "activation_reserve_gib"):
            if getattr(self, field) < 0:
                raise ValueError(f"TwinCalibration.{field} must be >= 0 (got {getattr(self, field)})")
        if self.max_num_batched_tokens < 1:
            raise ValueError(f"TwinCalibration.max_num_batched_tokens must be >= 1 (got {self.max_num_batched_tokens})")


class InsufficientMemoryError(ValueError):
    """The weights (and reserves) do not fit in the GPUs' memory at this tensor-parallel size."""


@dataclasses.dataclass(frozen=True, slots=True)
class _Pass:
    """Per-GPU constants of one forward pass of a model (target or drafter)."""

    weight_s: float  # streamed weights / bandwidth
    gemm_s_per_token: float  # 2 * P / FLOPS
    kv_s_per_token: float  # KV bytes of one context token / bandwidth
    attn_s_per_pair: float  # 4 * L * H * d / FLOPS per (query token, context token)
    allreduce_s: float  # fixed all-reduce latency per pass
    allreduce_s_per_token: float  # all-reduce bytes per token / interconnect

    def time_s(self, tokens: float, batch: float, context_len: float) -> float:
        linear = max(self.weight_s, tokens * self.gemm_s_per_token)
        attention = max(batch * context_len * self.kv_s_per_token, tokens * context_len * self.attn_s_per_pair)
        return linear + attention + self.allreduce_s + tokens * self.allreduce_s_per_token


def _pass_constants(model: ModelShape, gpu: GpuSpec, tp: int, cal: TwinCalibration) -> _Pass:
    bandwidth = gpu.hbm_bandwidth_gb_s * 1e9 * cal.memory_bandwidth_efficiency
    flops = gpu.bf16_dense_tflops * 1e12 * cal.compute_efficiency
    if tp > 1:
        # ring all-reduce moves 2 (tp-1)/tp of the activations; two all-reduces per layer (attention, MLP)
        all_reduces = 2 * max(model.num_layers, 1)
        interconnect = gpu.interconnect_gb_s * 1e9
        per_token_bytes = all_reduces * 2 * (tp - 1) / tp * model.hidden_size * model.dtype_bytes
        allreduce_s = all_reduces * cal.allreduce_latency_s
        allreduce_s_per_token = per_token_bytes / interconnect if interconnect > 0 else 0.0
    else:
        allreduce_s = allreduce_s_per_token = 0.0
    return _Pass(
        weight_s=model.streamed_weight_bytes / tp / bandwidth,
        gemm_s_per_token=2.0 * model.streamed_params / tp / flops,
        kv_s_per_token=model.kv_bytes_per_token_per_gpu(tp) / bandwidth,
        attn_s_per_pair=4.0 * model.num_layers * model.attention_width / tp / flops,
        allreduce_s=allreduce_s,
        allreduce_s_per_token=allreduce_s_per_token,
    )


class Twin:
    """Performance model of one replica: `model` on `tensor_parallel_size` x `gpu`, speculating with `method`.

    `drafter` defaults to `models.default_drafter(method, model)`; `acceptance` defaults to
    `acceptance_profile(method, workload, max_k=16)`. All times are seconds, per engine step.
    """

    MAX_K = 16

    __slots__ = ("gpu", "model", "tensor_parallel_size", "method", "drafter", "workload", "acceptance",
                 "calibration", "_target", "_draft", "_cum_accept", "_query_per_k")

    def __init__(self, gpu: GpuSpec, model: ModelShape, tensor_parallel_size: int = 1, method: str | None = None,
                 drafter: ModelShape | None = None, workload: str = "sharegpt",
                 acceptance: AcceptanceProfile | None = None, calibration: TwinCalibration | None = None) -> None:
        if tensor_parallel_size < 1:
            raise ValueError(f"tensor_parallel_size must be >= 1 (got {tensor_parallel_size})")
        self.gpu = gpu
        self.model = model
        self.tensor_parallel_size = tensor_parallel_size
        self.method = method
        self.workload = workload
        self.calibration = calibration or TwinCalibration()
        if method is None:
            if drafter is not None or acceptance is not None:
                raise ValueError("drafter and acceptance need a speculative method; pass method=")
            self.drafter = None
            self.acceptance = AcceptanceProfile(())
        else:
            self.acceptance = acceptance or acceptance_profile(method, workload, self.MAX_K)
            if method in HOST_DRAFTED_FAMILIES:
                if drafter is not None:
                    raise ValueError(f"method {method!r} drafts on the host from the context; drop drafter=")
                self.drafter = None
            else:
                self.drafter = drafter or default_drafter(method, model)
                if method in ALL_HEADS_AT_ONCE_FAMILIES and self.acceptance.max_k > self.drafter.num_attention_heads:
                    # one Medusa head per speculative position
                    self.acceptance = self.acceptance.truncated(self.drafter.num_attention_heads)
        self._target = _pass_constants(model, gpu, tensor_parallel_size, self.calibration)
        self._draft = (_pass_constants(self.drafter, gpu, tensor_parallel_size, self.calibration)
                       if self.drafter is not None else None)
        p, f, max_k = self.acceptance.per_position, self.acceptance.drafts_per_step, self.acceptance.max_k
        self._cum_accept = specdec.tokens_per_step_curve(p, f, max_k)  # E_k for k = 0..max_k
        self._query_per_k = tuple(specdec.verified_tokens_per_step(f, k) for k in range(max_k + 1))

    def __repr__(self) -> str:
        return (f"Twin(gpu={self.gpu.sku!r}, model={self.model.name!r}, tp={self.tensor_parallel_size}, "
                f"method={self.method!r}, drafter={self.drafter.name if self.drafter else None!r}, "
                f"workload={self.workload!r})")

    # ---- step time -------------------------------------------------------------------------------------
    def target_step_time_s(self, batch: float, query_tokens_per_seq: float, context_len: float) -> float:
        """One forward pass of the target over `batch` sequences of `query_tokens_per_seq` new tokens each."""
        tokens = batch * query_tokens_per_seq
        cal = self.calibration
        return (self._target.time_s(tokens, batch, context_len) + tokens * cal.per_token_overhead_s
                + cal.step_overhead_s)

    def draft_time_s(self, batch: float, k: int, context_len: float) -> float:
        """What proposing k tokens per sequence adds to a step (0 for k = 0).

        ngram / suffix: host lookup, ~free. draft_model: k sequential passes of the draft model.
        eagle / eagle3 / mtp: k sequential passes of one layer + lm head. medusa: all heads once.
        Each includes the per-step speculation overhead (proposer bookkeeping, rejection sampling).
        """
        self._check_k(k)
        if k == 0:
            return 0.0
        cal = self.calibration
        method = self.method
        if method in HOST_DRAFTED_FAMILIES:
            per_seq = cal.cpu_proposer_s_per_seq
            if method == SpeculativeMethod.NGRAM:
                per_seq += context_len * cal.cpu_proposer_s_per_context_token
            else:
                per_seq *= 4.0
            return cal.sd_step_overhead_s + batch * per_seq
        draft = self._draft
        if method in ALL_HEADS_AT_ONCE_FAMILIES:
            return cal.sd_step_overhead_s + cal.draft_pass_overhead_s + draft.time_s(batch, batch, 0.0)
        one_pass = draft.time_s(batch, batch, context_len) + cal.draft_pass_overhead_s
        return cal.sd_step_overhead_s + k * one_pass

    def step_time_s(self, batch: float, k: int, context_len: float) -> float:
        """Engine step with k drafts per sequence: target verifies k + 1 tokens, plus the drafting."""
        self._check_k(k)
        if k == 0:
            return self.target_step_time_s(batch, 1.0, context_len)
        return (self.target_step_time_s(batch, self._query_per_k[k], context_len)
                + self.draft_time_s(batch, k, context_len))

    def prefill_time_s(self, prompt_len: float, batch: float = 1.0) -> float:
        """Prefill of `batch` prompts of `prompt_len` tokens (compute-bound once prompts are long)."""
        tokens = batch * prompt_len
        mean_context = prompt_len / 2.0  # causal attention: token i attends to i earlier tokens
        cal = self.calibration
        seconds = self._target.time_s(tokens, batch, mean_context) + batch * cal.per_token_overhead_s
        if self._draft is not None and self.method not in ALL_HEADS_AT_ONCE_FAMILIES:
            seconds += self._draft.time_s(tokens, batch, mean_context)
        return seconds + cal.step_overhead_s

    # ---- tokens, goodput, latency ---------------------------------------------------------------------
    def tokens_per_step(self, k: int) -> float:
        """E_k: expected tokens each sequence gains per step with k drafts (1 for k = 0)."""
        self._check_k(k)
        return self._cum_accept[k]

    def goodput_tok_s(self, batch: float, k: int, context_len: float) -> float:
        """Accepted output tokens per second of the replica at this batch."""
        return batch * self._cum_accept[k] / self.step_time_s(batch, k, context_len)

    def tpot_s(self, batch: float, k: int, context_len: float) -> float:
        """Time per output token of one sequence."""
        return self.step_time_s(batch, k, context_len) / self._cum_accept[k]

    def speedup(self, batch: float, k: int, context_len: float) -> float:
        """Goodput with k drafts over goodput without speculation, at the same batch."""
        return (self._cum_accept[k] * self.step_time_s(batch, 0, context_len)
                / self.step_time_s(batch, k, context_len))

    def best_k(self, batch: float, max_k: int, context_len: float) -> int:
        """The k in 0..max_k with the highest goodput (the smaller k on a tie)."""
        self._check_k(max_k)
        best, best_rate = 0, 1.0 / self.step_time_s(batch, 0, context_len)
        for k in range(1, max_k + 1):
            rate = self._cum_accept[k] / self.step_time_s(batch, k, context_len)
            if rate > best_rate:
                best, best_rate = k, rate
        return best

    def _check_k(self, k: int) -> None:
        if k < 0 or k > self.acceptance.max_k:
            if self.method is None:
                raise ValueError(f"k must be 0 for a twin without a speculative method (got {k})")
            raise ValueError(f"k must be within 0..{self.acceptance.max_k} (got {k})")

    # ---- memory ----------------------------------------------------------------------------------------
    def kv_capacity_tokens(self, gpu_memory_utilization: float = 0.9) -> int:
        """Tokens the KV cache holds: memory left per GPU after weights, drafter and activation reserve.

        Raises InsufficientMemoryError (naming a tensor-parallel size that fits) when nothing is left.
        """
        if not 0.0 < gpu_memory_utilization <= 1.0:
            raise ValueError(f"gpu_memory_utilization must be within (0, 1] (got {gpu_memory_utilization})")
        tp = self.tensor_parallel_size
        free = self._free_bytes_per_gpu(tp, gpu_memory_utilization)
        if free <= 0:
            needed = (self._fixed_bytes_per_gpu(tp)) / _GIB
            raise InsufficientMemoryError(
                f"{self.model.name} does not fit on {tp} x {self.gpu.sku}: weights"
                f"{' + drafter' if self.drafter else ''} and activation reserve need {needed:.1f} GiB per GPU "
                f"but gpu_memory_utilization={gpu_memory_utilization} leaves "
                f"{self.gpu.memory_gib * gpu_memory_utilization:.1f} GiB; "
                f"{self._fitting_tp_hint(gpu_memory_utilization)}"
            )
        per_token = self.model.kv_bytes_per_token_per_gpu(tp)
        if self.drafter is not None:
            per_token += self.drafter.kv_bytes_per_token_per_gpu(tp)
        return int(free // per_token)

    def max_concurrency(self, context_len: float, gpu_memory_utilization: float = 0.9) -> int:
        """Sequences of `context_len` tokens whose KV cache fits at once."""
        if context_len <= 0:
            raise ValueError(f"context_len must be > 0 (got {context_len})")
        return int(self.kv_capacity_tokens(gpu_memory_utilization) // context_len)

    def _fixed_bytes_per_gpu(self, tp: int) -> float:
        model = self.model
        activations = (self.calibration.max_num_batched_tokens
                       * (4 * model.hidden_size + 2 * model.intermediate_size) * model.dtype_bytes / tp)
        weights = model.resident_weight_bytes / tp
        if self.drafter is not None:
            weights += self.drafter.resident_weight_bytes / tp
        return weights + activations + self.calibration.activation_reserve_gib * _GIB

    def _free_bytes_per_gpu(self, tp: int, utilization: float) -> float:
        return self.gpu.memory_gib * _GIB * utilization - self._fixed_bytes_per_gpu(tp)

    def _fitting_tp_hint(self, utilization: float) -> str:
        # suggest a size that leaves room for at least one full step's tokens of KV cache
        min_kv_bytes = self.calibration.max_num_batched_tokens * self.model.kv_bytes_per_token
        tp = self.tensor_parallel_size
        while tp < 64:
            tp *= 2
            if self._free_bytes_per_gpu(tp, utilization) * tp > min_kv_bytes:
                return f"use tensor_parallel_size >= {tp}, or a GPU with more memory"
        return "use a GPU with more memory"

    # ---- synthetic benchmark ---------------------------------------------------------------------------
    def benchmark_point(self, concurrency: int, k: int, prompt_len: int, output_len: int,
                        rng: np.random.Generator | None = None, noise: float = 0.0,
                        num_requests: int = 200) -> dict[str, object]:
        """What `vllm bench serve --max-concurrency` would report at steady state, plus SD counters.

        Closed loop: `concurrency` clients each send a request as soon as the previous one finishes.
        Requests beyond the KV capacity wait. Prefill runs in the same engine steps, so each request's
        prefill time is spread over everyone's decode (throughput r = b / (n * s + b * t_prefill) for b
        running sequences needing n steps of time s). SD counters follow the acceptance profile over
        `num_requests` requests: expected values without `rng`, sampled (multinomial over accepted
        lengths) with it. `noise` is the sigma of log-normal multiplicative noise on step and prefill times.
        """
        if concurrency < 1:
            raise ValueError(f"concurrency must be >= 1 (got {concurrency})")
        if prompt_len < 1:
            raise ValueError(f"prompt_len must be >= 1 (got {prompt_len})")
        if output_len < 2:
            raise ValueError(f"output_len must be >= 2 (the first token comes from prefill; got {output_len})")
        if num_requests < 1:
            raise ValueError(f"num_requests must be >= 1 (got {num_requests})")
        if noise < 0:
            raise ValueError(f"noise must be >= 0 (got {noise})")
        self._check_k(k)
        if noise > 0 and rng is None:
            rng = np.random.default_rng()
        context_len = prompt_len + output_len / 2.0
        running = min(concurrency, max(1, self.max_concurrency(prompt_len + output_len)))
        step_s = self.step_time_s(running, k, context_len)
        prefill_s = self.prefill_time_s(prompt_len)
        if noise > 0:
            step_s *= math.exp(rng.normal(0.0, noise))
            prefill_s *= math.exp(rng.normal(0.0, noise))
        tokens_per_step = self._cum_accept[k]
        decode_tokens = output_len - 1
        steps_per_request = max(1.0, decode_tokens / tokens_per_step)
        request_rate = running / (steps_per_request * step_s + running * prefill_s)
        latency_s = concurrency / request_rate
        queue_s = (concurrency - running) / request_rate
        ttft_s = prefill_s + step_s / 2.0 + queue_s  # wait for the running step, then prefill
        decode_s = latency_s - ttft_s
        counters = self._sd_counters(k, num_requests, steps_per_request, rng)
        return {
            "concurrency": concurrency,
            "num_speculative_tokens": k,
            "num_requests": num_requests,
            "output_throughput_tok_s": request_rate * output_len,
            "request_throughput": request_rate,
            "ttft_ms": ttft_s * 1e3,
            "tpot_ms": decode_s / decode_tokens * 1e3,
            "itl_ms": decode_s / steps_per_request * 1e3,
            **counters,
        }

    def _sd_counters(self, k: int, num_requests: int, steps_per_request: float,
                     rng: np.random.Generator | None) -> dict[str, object]:
        if k == 0:
            return {"num_drafts": 0, "num_draft_tokens": 0, "num_accepted_tokens": 0, "accepted_per_position": []}
        request_steps = int(round(num_requests * steps_per_request))
        f = self.acceptance.drafts_per_step
        p = self.acceptance.per_position[:k]
        if rng is None:
            drafts = int(round(request_steps * f))
            per_position = [int(round(drafts * pj)) for pj in p]
        else:
            drafts = int(rng.binomial(request_steps, f))
            # accepted length a of one draft: P(a = j) = p_j - p_{j+1}, with p_0 = 1 and p_{k+1} = 0
            bounds = (1.0, *p, 0.0)
            probabilities = np.clip([bounds[j] - bounds[j + 1] for j in range(k + 1)], 0.0, None)
            counts = rng.multinomial(drafts, probabilities / probabilities.sum())
            at_least = np.cumsum(counts[::-1])[::-1]  # at_least[j] = drafts accepting >= j tokens
            per_position = [int(at_least[j]) for j in range(1, k + 1)]
        return {
            "num_drafts": drafts,
            "num_draft_tokens": drafts * k,
            "num_accepted_tokens": sum(per_position),
            "accepted_per_position": per_position,
        }
