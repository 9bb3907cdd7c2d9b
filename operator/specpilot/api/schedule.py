"""The speculation schedule: which number of speculative tokens K vLLM uses at each batch size.

vLLM (>= 0.3x) takes it as `num_speculative_tokens_per_batch_size: [[start, end, K], ...]` inside
`--speculative-config`. Its rules (vllm/v1/spec_decode/dynamic/utils.py): ranges are inclusive,
positive, sorted, non-overlapping, the first starts at 1, gaps carry the previous K, the last K
carries to the maximum batch size, and every K is capped at `num_speculative_tokens`.
This module keeps one typed form (list of `ScheduleRange`) and converts to vLLM's form and back.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from pydantic import Field, model_validator

from .base import ApiModel


class ScheduleRange(ApiModel):
    """One inclusive range of batch sizes (requests scheduled in an engine step) and its K."""

    from_batch_size: int = Field(ge=1)
    """First batch size of the range (inclusive)."""
    to_batch_size: int = Field(ge=1)
    """Last batch size of the range (inclusive)."""
    num_speculative_tokens: int = Field(ge=0, le=64)
    """Speculative tokens per step in this range; 0 switches speculation off."""

    @model_validator(mode="after")
    def _ordered(self) -> ScheduleRange:
        if self.from_batch_size > self.to_batch_size:
            raise ValueError(
                f"fromBatchSize must be <= toBatchSize (got {self.from_batch_size} > {self.to_batch_size})"
            )
        return self


def schedule_problems(ranges: Sequence[ScheduleRange], max_k: int | None = None) -> list[str]:
    """What makes a schedule unacceptable to vLLM, in words (empty when it is valid)."""
    problems: list[str] = []
    if not ranges:
        return ["the schedule must have at least one range"]
    previous_end = 0
    for i, r in enumerate(ranges):
        if i == 0 and r.from_batch_size != 1:
            problems.append(f"[0].fromBatchSize must be 1 so every batch size has a K (got {r.from_batch_size})")
        if r.from_batch_size <= previous_end:
            problems.append(
                f"[{i}] overlaps or is out of order: fromBatchSize {r.from_batch_size} must be > "
                f"the previous toBatchSize {previous_end}"
            )
        if max_k is not None and r.num_speculative_tokens > max_k:
            problems.append(
                f"[{i}].numSpeculativeTokens must be <= the method's numSpeculativeTokens {max_k} "
                f"(got {r.num_speculative_tokens})"
            )
        previous_end = r.to_batch_size
    return problems


def to_vllm(ranges: Iterable[ScheduleRange]) -> list[list[int]]:
    """The `num_speculative_tokens_per_batch_size` value vLLM expects."""
    return [[r.from_batch_size, r.to_batch_size, r.num_speculative_tokens] for r in ranges]


def from_vllm(entries: Iterable[Sequence[int]]) -> list[ScheduleRange]:
    """Parse vLLM's `[[start, end, K], ...]` form."""
    out = []
    for entry in entries:
        if len(entry) != 3:
            raise ValueError(f"each schedule entry must be [start, end, K] (got {list(entry)!r})")
        start, end, k = (int(v) for v in entry)
        out.append(ScheduleRange(from_batch_size=start, to_batch_size=end, num_speculative_tokens=k))
    return out


def k_at(ranges: Sequence[ScheduleRange], batch_size: int, max_k: int | None = None) -> int:
    """K that vLLM would use at `batch_size`, following its gap-carry and cap rules."""
    k = 0
    for r in ranges:
        if batch_size < r.from_batch_size:
            break
        k = r.num_speculative_tokens
        if batch_size <= r.to_batch_size:
            break
    return min(k, max_k) if max_k is not None else k


def compress(k_by_batch_size: Sequence[int], max_batch_size: int) -> list[ScheduleRange]:
    """Turn a dense list (index 0 = batch size 1) into the fewest ranges; the last range ends at max_batch_size."""
    ranges: list[ScheduleRange] = []
    start = 1
    for b in range(2, len(k_by_batch_size) + 1):
        if k_by_batch_size[b - 1] != k_by_batch_size[start - 1]:
            ranges.append(ScheduleRange(from_batch_size=start, to_batch_size=b - 1,
                                        num_speculative_tokens=k_by_batch_size[start - 1]))
            start = b
    ranges.append(ScheduleRange(from_batch_size=start, to_batch_size=max(max_batch_size, start),
                                num_speculative_tokens=k_by_batch_size[start - 1]))
    return ranges


def summary(ranges: Sequence[ScheduleRange]) -> str:
    """Short text for printer columns and logs, e.g. `1-16:5,17-64:3,65+:0`."""
    parts = []
    for i, r in enumerate(ranges):
        last = i == len(ranges) - 1
        span = f"{r.from_batch_size}+" if last else f"{r.from_batch_size}-{r.to_batch_size}"
        parts.append(f"{span}:{r.num_speculative_tokens}")
    return ",".join(parts)
