"""Performance model of speculative decoding: GPU catalog, model shapes, acceptance priors, twin, cost."""

from .acceptance import METHODS, WORKLOADS, AcceptanceProfile, acceptance_profile, expected_tokens_per_step
from .catalog import DEFAULT_CATALOG, GpuCatalog, GpuSpec, UnknownGpuError, sku_for_node_label
from .cost import cost_per_million_tokens
from .models import (
    BUILTIN_MODELS,
    ModelShape,
    UnknownModelError,
    default_drafter,
    eagle_head,
    from_hf_config,
    medusa_heads,
    mtp_head,
    resolve_model,
)
from .twin import InsufficientMemoryError, Twin, TwinCalibration

__all__ = [
    "BUILTIN_MODELS",
    "DEFAULT_CATALOG",
    "METHODS",
    "WORKLOADS",
    "AcceptanceProfile",
    "GpuCatalog",
    "GpuSpec",
    "InsufficientMemoryError",
    "ModelShape",
    "Twin",
    "TwinCalibration",
    "UnknownGpuError",
    "UnknownModelError",
    "acceptance_profile",
    "cost_per_million_tokens",
    "default_drafter",
    "eagle_head",
    "expected_tokens_per_step",
    "from_hf_config",
    "medusa_heads",
    "mtp_head",
    "resolve_model",
    "sku_for_node_label",
]
