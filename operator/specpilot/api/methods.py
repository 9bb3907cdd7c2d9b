"""Candidate speculative-decoding methods, named as vLLM 0.32 names them, and their engine config.

`CandidateMethod.speculative_config(...)` is the one place that turns a candidate into the JSON that
vLLM's `--speculative-config` takes.
"""

from __future__ import annotations

import re
from enum import Enum
from typing import Any

from pydantic import ConfigDict, Field, model_validator

from .args import MODEL_ID_MAX_LENGTH, MODEL_ID_PATTERN, REVISION_MAX_LENGTH, REVISION_PATTERN
from .base import ApiModel, FreeFormObject
from .schedule import ScheduleRange, schedule_problems, to_vllm


class SpeculativeMethod(str, Enum):
    """vLLM's `speculative_config.method` values (vllm/config/speculative.py, 0.32) that specpilot profiles."""

    NGRAM = "ngram"
    NGRAM_GPU = "ngram_gpu"
    SUFFIX = "suffix"
    DRAFT_MODEL = "draft_model"
    EAGLE = "eagle"
    EAGLE3 = "eagle3"
    MEDUSA = "medusa"
    MLP_SPECULATOR = "mlp_speculator"
    DFLASH = "dflash"
    MTP = "mtp"
    DEEPSEEK_MTP = "deepseek_mtp"
    QWEN3_NEXT_MTP = "qwen3_next_mtp"
    QWEN3_5_MTP = "qwen3_5_mtp"
    GLM4_MOE_MTP = "glm4_moe_mtp"
    ERNIE_MTP = "ernie_mtp"
    MIMO_MTP = "mimo_mtp"
    LONGCAT_FLASH_MTP = "longcat_flash_mtp"


NGRAM_METHODS = frozenset({SpeculativeMethod.NGRAM, SpeculativeMethod.NGRAM_GPU})
MODEL_FREE_METHODS = NGRAM_METHODS | {SpeculativeMethod.SUFFIX}
"""Methods whose drafter needs no weights: they draft from the prompt or past outputs."""
NEEDS_MODEL = frozenset({
    SpeculativeMethod.DRAFT_MODEL, SpeculativeMethod.EAGLE, SpeculativeMethod.EAGLE3,
    SpeculativeMethod.MEDUSA, SpeculativeMethod.MLP_SPECULATOR, SpeculativeMethod.DFLASH,
})
"""Methods that need `model` (draft model, EAGLE head, Medusa heads, ...)."""
NO_DYNAMIC_SCHEDULE = frozenset({SpeculativeMethod.SUFFIX, SpeculativeMethod.MEDUSA})
"""Methods with which vLLM 0.32 cannot take `num_speculative_tokens_per_batch_size`: suffix crashes at start,
medusa at the first step whose K differs from num_speculative_tokens (its heads always draft all K; an
AssertionError seen on the CPU engine). They toggle by rollout instead."""


METHOD_FAMILIES = ("ngram", "suffix", "draft_model", "eagle", "eagle3", "medusa", "mtp")
"""What `method_family` returns: the drafter shapes the twin (perf.twin) and the acceptance priors
(perf.acceptance) model; every SpeculativeMethod maps to one."""
HOST_DRAFTED_FAMILIES = frozenset({"ngram", "suffix"})
"""Families that draft on the host from the context: no drafter weights, no GPU pass (MODEL_FREE_METHODS)."""
SEQUENTIAL_HEAD_FAMILIES = frozenset({"eagle", "eagle3", "mtp"})
"""Families whose drafter is one layer (plus the LM head) run k times in sequence per step."""
ALL_HEADS_AT_ONCE_FAMILIES = frozenset({"medusa"})
"""Families whose heads propose every position in one pass (one head per position, so K <= heads)."""


def method_family(method: str) -> str:
    """Family used by the twin and acceptance priors: ngram, suffix, draft_model, eagle, eagle3, medusa, mtp."""
    m = SpeculativeMethod(method)
    if m in NGRAM_METHODS:
        return "ngram"
    if m is SpeculativeMethod.MLP_SPECULATOR:
        return "medusa"
    if m is SpeculativeMethod.DFLASH:
        return "eagle3"
    if m.value.endswith("mtp"):
        return "mtp"
    return m.value


_NAME_RE = re.compile(r"^[a-z0-9]([a-z0-9-]{0,30}[a-z0-9])?$")


_NEEDS_MODEL_CEL = "[" + ", ".join(f"'{m.value}'" for m in sorted(NEEDS_MODEL, key=lambda m: m.value)) + "]"
_MODEL_FREE_CEL = "[" + ", ".join(f"'{m.value}'" for m in sorted(MODEL_FREE_METHODS, key=lambda m: m.value)) + "]"


class CandidateMethod(ApiModel):
    """A speculative-decoding method for specpilot to profile and possibly serve."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [
        {"rule": f"!(self.method in {_NEEDS_MODEL_CEL}) || has(self.model)",
         "message": "this method needs `model` (the drafter weights): set model to a Hugging Face id or path"},
        {"rule": f"!(self.method in {_MODEL_FREE_CEL}) || !has(self.model)",
         "message": "ngram, ngram_gpu and suffix draft without weights: remove `model`"},
        {"rule": "!has(self.promptLookupMin) || !has(self.promptLookupMax) || "
                 "self.promptLookupMin <= self.promptLookupMax",
         "message": "promptLookupMin must be <= promptLookupMax"},
    ]})

    method: SpeculativeMethod
    """vLLM speculative method: ngram, ngram_gpu, suffix, draft_model, eagle, eagle3, medusa,
    mlp_speculator, dflash, mtp or a model-specific MTP type (deepseek_mtp, qwen3_next_mtp, ...)."""
    name: str | None = Field(default=None, max_length=32)
    """Short unique name of this candidate (DNS label, <= 32 chars). Defaults to the method name; set it
    when the same method appears twice (e.g. two draft models)."""
    model: str | None = Field(default=None, max_length=MODEL_ID_MAX_LENGTH, pattern=MODEL_ID_PATTERN)
    """Drafter weights: draft model, EAGLE/EAGLE-3 head or Medusa heads (Hugging Face id or path).
    Required for draft_model, eagle, eagle3, medusa, mlp_speculator and dflash."""
    revision: str | None = Field(default=None, max_length=REVISION_MAX_LENGTH, pattern=REVISION_PATTERN)
    """Revision (branch, tag or commit) of the drafter weights."""
    num_speculative_tokens: int = Field(default=4, ge=1, le=16)
    """Largest K to profile and serve (tokens drafted per step). The schedule never exceeds it."""
    prompt_lookup_min: int | None = Field(default=None, ge=1, le=16)
    """n-gram only: smallest n-gram to match in the prompt (vLLM default 1)."""
    prompt_lookup_max: int | None = Field(default=None, ge=1, le=16)
    """n-gram only: largest n-gram to match in the prompt (required by vLLM for ngram; defaults to 4)."""
    draft_tensor_parallel_size: int | None = Field(default=None, ge=1, le=64)
    """Tensor parallelism of the drafter: 1 or the target's tensorParallelSize."""
    extra_config: FreeFormObject | None = None
    """Free-form: more vLLM speculative_config keys, passed through as they are
    (e.g. suffix_decoding_max_tree_depth). Keys specpilot sets itself cannot be overridden here."""

    @model_validator(mode="after")
    def _consistent(self) -> CandidateMethod:
        m = SpeculativeMethod(self.method)
        if m in NEEDS_MODEL and not self.model:
            raise ValueError(
                f"method {m.value} needs `model` (the drafter weights): set model to a Hugging Face id or path"
            )
        if m in MODEL_FREE_METHODS and self.model:
            raise ValueError(f"method {m.value} drafts without weights: remove `model` ({self.model!r})")
        if m not in NGRAM_METHODS and (self.prompt_lookup_min or self.prompt_lookup_max):
            raise ValueError(f"promptLookupMin/promptLookupMax apply only to ngram methods, not {m.value}")
        lo = self.prompt_lookup_min or 1
        hi = self.prompt_lookup_max or max(4, lo)
        if m in NGRAM_METHODS and lo > hi:
            raise ValueError(f"promptLookupMin must be <= promptLookupMax (got {lo} > {hi})")
        if self.name is not None and not _NAME_RE.match(self.name):
            raise ValueError(
                f"name must be a DNS label of lowercase letters, digits and '-' (got {self.name!r})"
            )
        reserved = {"method", "model", "num_speculative_tokens", "num_speculative_tokens_per_batch_size"}
        clash = sorted(reserved & set(self.extra_config or {}))
        if clash:
            raise ValueError(f"extraConfig may not set {clash}: use the typed fields instead")
        return self

    @property
    def key(self) -> str:
        """The candidate's unique name (explicit name or the method, lowercased, '_' -> '-')."""
        return self.name or SpeculativeMethod(self.method).value.replace("_", "-")

    @property
    def supports_dynamic_schedule(self) -> bool:
        return SpeculativeMethod(self.method) not in NO_DYNAMIC_SCHEDULE

    def speculative_config(
        self, num_speculative_tokens: int | None = None, schedule: list[ScheduleRange] | None = None
    ) -> dict[str, Any]:
        """The `--speculative-config` JSON object for this method at K (default: its maximum) and schedule."""
        k = num_speculative_tokens or self.num_speculative_tokens
        config: dict[str, Any] = dict(self.extra_config or {})
        config["method"] = SpeculativeMethod(self.method).value
        config["num_speculative_tokens"] = k
        if self.model:
            config["model"] = self.model
        if self.revision:
            config["revision"] = self.revision
        if SpeculativeMethod(self.method) in NGRAM_METHODS:
            config["prompt_lookup_min"] = self.prompt_lookup_min or 1
            config["prompt_lookup_max"] = self.prompt_lookup_max or max(4, self.prompt_lookup_min or 1)
        if self.draft_tensor_parallel_size:
            config["draft_tensor_parallel_size"] = self.draft_tensor_parallel_size
        if schedule:
            problems = schedule_problems(schedule, max_k=k)
            if problems:
                raise ValueError("invalid schedule: " + "; ".join(problems))
            config["num_speculative_tokens_per_batch_size"] = to_vllm(schedule)
        return config

    def identity(self) -> dict[str, Any]:
        """What makes two candidates measure the same thing (their name does not)."""
        return self.speculative_config()
