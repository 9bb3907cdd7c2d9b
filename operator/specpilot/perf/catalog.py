"""GPU catalog: datasheet ceilings and prices per SKU, and mapping of node labels to SKUs.

The twin needs three numbers per GPU type (memory, HBM bandwidth, dense BF16 throughput) and the cost
model needs a price. Clusters name GPUs by the `nvidia.com/gpu.product` node label (written by NVIDIA's
GPU Feature Discovery from the NVML name, e.g. "NVIDIA-H100-80GB-HBM3"), by a cloud's accelerator label
("nvidia-h100-80gb" on GKE) or by AMD's `amd.com/gpu.product-name`; `GpuCatalog.resolve` maps any of them
to one canonical SKU. Measured ceilings from the benchmark Job's calibration replace the datasheet ones
through `GpuCatalog.with_calibration`.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterable, Iterator
from pathlib import Path

import yaml

__all__ = [
    "DEFAULT_CATALOG",
    "GpuCatalog",
    "GpuSpec",
    "UnknownGpuError",
    "sku_for_node_label",
]


@dataclasses.dataclass(frozen=True, slots=True)
class GpuSpec:
    """One GPU type: the ceilings the roofline model divides by, and what an hour of it costs."""

    sku: str
    """Canonical name used everywhere in specpilot, e.g. "H100-SXM"."""
    product_labels: tuple[str, ...]
    """Node-label values seen in clusters for this GPU (`nvidia.com/gpu.product`, cloud accelerator labels)."""
    memory_gib: float
    """Device memory the driver reports, GiB (what vLLM's gpu_memory_utilization is a fraction of)."""
    hbm_bandwidth_gb_s: float
    """Peak device-memory bandwidth, GB/s (1e9 bytes/s)."""
    bf16_dense_tflops: float
    """Peak dense (no sparsity) BF16 tensor throughput, TFLOPS (1e12 FLOP/s)."""
    default_price_per_gpu_hour: float
    """On-demand cloud price, USD per GPU-hour; a pool's pricePerGpuHour overrides it."""
    vendor: str = "nvidia"
    interconnect_gb_s: float = 0.0
    """Per-GPU bandwidth to its tensor-parallel peers, GB/s (NVLink / Infinity Fabric / PCIe)."""

    def __post_init__(self) -> None:
        for field in ("memory_gib", "hbm_bandwidth_gb_s", "bf16_dense_tflops"):
            value = getattr(self, field)
            if not value > 0:
                raise ValueError(f"GpuSpec {self.sku!r}: {field} must be > 0 (got {value})")
        if self.default_price_per_gpu_hour < 0:
            raise ValueError(
                f"GpuSpec {self.sku!r}: default_price_per_gpu_hour must be >= 0 "
                f"(got {self.default_price_per_gpu_hour})"
            )
        if self.interconnect_gb_s < 0:
            raise ValueError(f"GpuSpec {self.sku!r}: interconnect_gb_s must be >= 0 (got {self.interconnect_gb_s})")


class UnknownGpuError(KeyError):
    """A GPU name or node label that matches no SKU in the catalog."""

    def __init__(self, name: str, known: Iterable[str]) -> None:
        self.name = name
        self.known = tuple(known)
        super().__init__(name)

    def __str__(self) -> str:
        return (
            f"unknown GPU {self.name!r}; known SKUs: {', '.join(self.known)}. Set the pool's sku to one of "
            f"these, or add an entry (sku, productLabels, memoryGib, hbmBandwidthGBs, bf16DenseTflops, "
            f"pricePerGpuHour) to a GPU catalog file loaded with GpuCatalog.extend_from_file"
        )


# Datasheet figures. memory_gib is what nvidia-smi / rocm-smi reports (a little under the marketing GB).
# Prices are typical 2025 on-demand list prices of GPU clouds per GPU-hour: a prior only.
_BUILTIN_GPUS = (
    # NVIDIA A100 Tensor Core GPU datasheet (2021): A100 80GB SXM 2,039 GB/s, BF16 312 TFLOPS dense,
    # NVLink 600 GB/s.
    GpuSpec(
        sku="A100-80GB-SXM",
        product_labels=("NVIDIA-A100-SXM4-80GB", "nvidia-a100-80gb"),
        memory_gib=80.0,
        hbm_bandwidth_gb_s=2039.0,
        bf16_dense_tflops=312.0,
        default_price_per_gpu_hour=1.80,
        interconnect_gb_s=600.0,
    ),
    # NVIDIA H100 Tensor Core GPU datasheet: H100 SXM 80 GB HBM3, 3.35 TB/s, BF16 1,979 TFLOPS with
    # sparsity (989 dense), NVLink 900 GB/s. nvidia-smi reports 81,559 MiB.
    GpuSpec(
        sku="H100-SXM",
        product_labels=(
            "NVIDIA-H100-80GB-HBM3",
            "NVIDIA-H100-SXM5-80GB",
            "nvidia-h100-80gb",
            "nvidia-h100-mega-80gb",
        ),
        memory_gib=79.6,
        hbm_bandwidth_gb_s=3350.0,
        bf16_dense_tflops=989.0,
        default_price_per_gpu_hour=2.50,
        interconnect_gb_s=900.0,
    ),
    # NVIDIA H200 Tensor Core GPU datasheet: H200 SXM 141 GB HBM3e, 4.8 TB/s, BF16 1,979 TFLOPS with
    # sparsity (989 dense), NVLink 900 GB/s. nvidia-smi reports 143,771 MiB.
    GpuSpec(
        sku="H200",
        product_labels=("NVIDIA-H200", "NVIDIA-H200-141GB-HBM3e", "nvidia-h200-141gb"),
        memory_gib=140.4,
        hbm_bandwidth_gb_s=4800.0,
        bf16_dense_tflops=989.0,
        default_price_per_gpu_hour=3.50,
        interconnect_gb_s=900.0,
    ),
    # NVIDIA HGX B200 datasheet (per GPU): 180 GB HBM3e, 8 TB/s, FP16/BF16 4.5 PFLOPS with sparsity
    # (2,250 dense), NVLink 5 1.8 TB/s.
    GpuSpec(
        sku="B200",
        product_labels=("NVIDIA-B200", "nvidia-b200"),
        memory_gib=179.0,
        hbm_bandwidth_gb_s=8000.0,
        bf16_dense_tflops=2250.0,
        default_price_per_gpu_hour=5.50,
        interconnect_gb_s=1800.0,
    ),
    # NVIDIA L40S datasheet: 48 GB GDDR6, 864 GB/s, BF16 733 TFLOPS with sparsity (366 dense), PCIe Gen4
    # x16 (64 GB/s). nvidia-smi reports 46,068 MiB.
    GpuSpec(
        sku="L40S",
        product_labels=("NVIDIA-L40S", "nvidia-l40s"),
        memory_gib=45.0,
        hbm_bandwidth_gb_s=864.0,
        bf16_dense_tflops=366.0,
        default_price_per_gpu_hour=1.00,
        interconnect_gb_s=64.0,
    ),
    # AMD Instinct MI300X data sheet: 192 GB HBM3, 5.3 TB/s, BF16 1,307.4 TFLOPS dense, Infinity Fabric
    # 896 GB/s aggregate peer bandwidth.
    GpuSpec(
        sku="MI300X",
        product_labels=("AMD-Instinct-MI300X", "AMD_Instinct_MI300X", "AMD_Instinct_MI300X_OAM"),
        memory_gib=192.0,
        hbm_bandwidth_gb_s=5300.0,
        bf16_dense_tflops=1307.4,
        default_price_per_gpu_hour=2.00,
        vendor="amd",
        interconnect_gb_s=896.0,
    ),
)

# Words in a label that name a different product of the same family (A100 PCIe, H100 NVL, a MIG slice);
# such a label must not silently resolve to the SXM part, whose ceilings are higher.
_VARIANT_TOKENS = frozenset({"PCIE", "NVL", "MIG"})
_MEMORY_TOKEN = re.compile(r"^(\d+)GB$")


def _normalized(name: str) -> str:
    return re.sub(r"[^0-9a-z]", "", name.casefold())


def _tokens(name: str) -> list[str]:
    return [t for t in re.split(r"[^0-9A-Za-z]+", name.upper()) if t]


class GpuCatalog:
    """An immutable set of GPU SKUs with lookup by SKU or node label."""

    __slots__ = ("_by_sku", "_by_name")

    def __init__(self, specs: Iterable[GpuSpec]) -> None:
        by_sku: dict[str, GpuSpec] = {}
        for spec in specs:
            by_sku[spec.sku.casefold()] = spec  # a later entry for the same SKU replaces the earlier one
        self._by_sku = by_sku
        by_name: dict[str, GpuSpec] = {}
        for spec in by_sku.values():
            for name in (spec.sku, *spec.product_labels):
                by_name[_normalized(name)] = spec
        self._by_name = by_name

    def __iter__(self) -> Iterator[GpuSpec]:
        return iter(self._by_sku.values())

    def __len__(self) -> int:
        return len(self._by_sku)

    def __contains__(self, name_or_label: object) -> bool:
        if not isinstance(name_or_label, str):
            return False
        try:
            self.resolve(name_or_label)
        except UnknownGpuError:
            return False
        return True

    @property
    def skus(self) -> tuple[str, ...]:
        return tuple(spec.sku for spec in self._by_sku.values())

    def resolve(self, name_or_label: str) -> GpuSpec:
        """The spec for a SKU or node-label value, ignoring case and punctuation.

        Falls back to matching the GPU family and memory size inside the label (so a new label spelling
        such as "NVIDIA-H100-SXM5-80GB-SHARED" still resolves), but never maps a PCIe, NVL or MIG
        variant onto a SKU whose labels do not say so. Raises UnknownGpuError listing the known SKUs.
        """
        spec = self._by_name.get(_normalized(name_or_label))
        if spec is not None:
            return spec
        spec = self._match_family(name_or_label)
        if spec is None:
            raise UnknownGpuError(name_or_label, self.skus)
        return spec

    def _match_family(self, label: str) -> GpuSpec | None:
        tokens = _tokens(label)
        token_set = set(tokens)
        candidates = []
        for spec in self._by_sku.values():
            family = _tokens(spec.sku)[0]
            if family not in token_set:
                continue
            own_tokens = set(_tokens(spec.sku))
            for known in spec.product_labels:
                own_tokens.update(_tokens(known))
            if (token_set & _VARIANT_TOKENS) - own_tokens:
                continue
            if not _memory_matches(tokens, spec.memory_gib):
                continue
            candidates.append(spec)
        return candidates[0] if len(candidates) == 1 else None

    def extend(self, specs: Iterable[GpuSpec]) -> GpuCatalog:
        """A new catalog with these specs added (an existing SKU of the same name is replaced)."""
        return GpuCatalog([*self._by_sku.values(), *specs])

    def extend_from_file(self, path: str | Path) -> GpuCatalog:
        """A new catalog with the entries of a YAML or JSON file added.

        The file holds a list of objects with camelCase keys: sku, productLabels (list), memoryGib,
        hbmBandwidthGBs, bf16DenseTflops, pricePerGpuHour, and optionally vendor and interconnectGBs.
        """
        path = Path(path)
        text = path.read_text(encoding="utf-8")
        entries = json.loads(text) if path.suffix.lower() == ".json" else yaml.safe_load(text)
        if not isinstance(entries, list):
            raise ValueError(f"{path}: a GPU catalog file must hold a list of entries (got {type(entries).__name__})")
        return self.extend(_spec_from_entry(entry, f"{path}[{i}]") for i, entry in enumerate(entries))

    def with_calibration(self, sku: str, bandwidth_gb_s: float, bf16_tflops: float) -> GpuCatalog:
        """A new catalog in which measured ceilings replace the datasheet ones for one SKU."""
        if not bandwidth_gb_s > 0:
            raise ValueError(f"bandwidth_gb_s must be > 0 (got {bandwidth_gb_s})")
        if not bf16_tflops > 0:
            raise ValueError(f"bf16_tflops must be > 0 (got {bf16_tflops})")
        spec = self.resolve(sku)
        calibrated = dataclasses.replace(spec, hbm_bandwidth_gb_s=bandwidth_gb_s, bf16_dense_tflops=bf16_tflops)
        return self.extend([calibrated])


def _memory_matches(tokens: list[str], memory_gib: float) -> bool:
    """A memory size written in the label ("80GB") must be within 10% of the SKU's (80GB vs 40GB parts)."""
    for token in tokens:
        match = _MEMORY_TOKEN.match(token)
        if match and abs(int(match.group(1)) - memory_gib) > 0.1 * memory_gib:
            return False
    return True


_REQUIRED_KEYS = ("sku", "memoryGib", "hbmBandwidthGBs", "bf16DenseTflops", "pricePerGpuHour")


def _spec_from_entry(entry: object, where: str) -> GpuSpec:
    if not isinstance(entry, dict):
        raise ValueError(f"{where}: each GPU catalog entry must be a mapping (got {type(entry).__name__})")
    missing = [key for key in _REQUIRED_KEYS if key not in entry]
    if missing:
        raise ValueError(f"{where}: GPU catalog entry is missing {', '.join(missing)}")
    labels = entry.get("productLabels", [])
    if isinstance(labels, str) or not isinstance(labels, list):
        raise ValueError(f"{where}.productLabels must be a list of node-label values (got {labels!r})")
    try:
        return GpuSpec(
            sku=str(entry["sku"]),
            product_labels=tuple(str(label) for label in labels),
            memory_gib=float(entry["memoryGib"]),
            hbm_bandwidth_gb_s=float(entry["hbmBandwidthGBs"]),
            bf16_dense_tflops=float(entry["bf16DenseTflops"]),
            default_price_per_gpu_hour=float(entry["pricePerGpuHour"]),
            vendor=str(entry.get("vendor", "nvidia")),
            interconnect_gb_s=float(entry.get("interconnectGBs", 0.0)),
        )
    except (TypeError, ValueError) as err:
        raise ValueError(f"{where}: {err}") from err


DEFAULT_CATALOG = GpuCatalog(_BUILTIN_GPUS)


def sku_for_node_label(label: str, catalog: GpuCatalog = DEFAULT_CATALOG) -> str:
    """The canonical SKU for a node-label value such as "NVIDIA-H100-80GB-HBM3" or "NVIDIA-H100-SXM5-80GB"."""
    return catalog.resolve(label).sku
