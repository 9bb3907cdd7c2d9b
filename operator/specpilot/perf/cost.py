"""Cost model: dollars per million output tokens of a replica."""

from __future__ import annotations

__all__ = ["cost_per_million_tokens", "tokens_per_second"]


def tokens_per_second(concurrency: float, tpot_ms: float) -> float:
    """Output tokens/s one replica delivers with `concurrency` requests decoding at `tpot_ms` each (Little's
    law: every request in flight gets a token every TPOT)."""
    return concurrency * 1000.0 / tpot_ms


def cost_per_million_tokens(price_per_gpu_hour: float, gpus_per_replica: int,
                            tokens_per_second_per_replica: float) -> float:
    """USD per 1e6 tokens = price_per_gpu_hour * gpus_per_replica / (3600 * tokens_per_second_per_replica) * 1e6."""
    for name, value in (("price_per_gpu_hour", price_per_gpu_hour), ("gpus_per_replica", gpus_per_replica),
                        ("tokens_per_second_per_replica", tokens_per_second_per_replica)):
        if not value > 0:
            raise ValueError(f"{name} must be > 0 (got {value})")
    return price_per_gpu_hour * gpus_per_replica / (3600.0 * tokens_per_second_per_replica) * 1e6
