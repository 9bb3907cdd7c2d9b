"""Cost model: dollars per million output tokens of a replica."""

from __future__ import annotations

__all__ = ["cost_per_million_tokens"]


def cost_per_million_tokens(price_per_gpu_hour: float, gpus_per_replica: int,
                            tokens_per_second_per_replica: float) -> float:
    """USD per 1e6 tokens = price_per_gpu_hour * gpus_per_replica / (3600 * tokens_per_second_per_replica) * 1e6."""
    for name, value in (("price_per_gpu_hour", price_per_gpu_hour), ("gpus_per_replica", gpus_per_replica),
                        ("tokens_per_second_per_replica", tokens_per_second_per_replica)):
        if not value > 0:
            raise ValueError(f"{name} must be > 0 (got {value})")
    return price_per_gpu_hour * gpus_per_replica / (3600.0 * tokens_per_second_per_replica) * 1e6
