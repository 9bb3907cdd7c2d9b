"""The deployment's GPU pools as the cluster shows them: which nodes each pool's selector matches and which GPU
types (SKUs) they carry. Pure: the controller reads the Nodes, this matches them."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field

from ..api.deployment_spec import GpuPool, SpeculativeDeploymentSpec
from ..perf.catalog import DEFAULT_CATALOG, GpuCatalog, UnknownGpuError

__all__ = ["AMD_PRODUCT_LABEL", "GPU_PRODUCT_LABEL", "NodeInfo", "PoolView", "allocatable_gpus", "node_allocatable",
           "node_info", "pool_views", "price_per_gpu_hour", "sku_of"]


GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
AMD_PRODUCT_LABEL = "amd.com/gpu.product-name"


@dataclass(frozen=True)
class NodeInfo:
    """What the operator needs of a Node."""

    name: str
    labels: dict[str, str]
    ready: bool = True


@dataclass
class PoolView:
    """A pool as seen on the cluster: its nodes and the GPU types (SKUs) they carry."""

    pool: GpuPool
    nodes: list[NodeInfo] = field(default_factory=list)
    products: list[str] = field(default_factory=list)
    skus: list[str] = field(default_factory=list)
    """SKUs to profile: the spec's sku, or one per GPU product found on the nodes (most common first)."""
    unknown_products: list[str] = field(default_factory=list)

    @property
    def primary_sku(self) -> str | None:
        return self.skus[0] if self.skus else None


def node_info(body: dict) -> NodeInfo:
    meta = body.get("metadata", {})
    conditions = body.get("status", {}).get("conditions") or []
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions) or not conditions
    return NodeInfo(name=meta.get("name", ""), labels=dict(meta.get("labels") or {}), ready=ready)


def pool_views(spec: SpeculativeDeploymentSpec, nodes: list[NodeInfo],
               catalog: GpuCatalog = DEFAULT_CATALOG) -> list[PoolView]:
    """Match nodes to pools by node selector and work out each pool's SKUs."""
    views = []
    for pool in spec.gpu_pools:
        matching = [n for n in nodes if all(n.labels.get(k) == v for k, v in pool.node_selector.items())]
        products = Counter(n.labels.get(GPU_PRODUCT_LABEL) or n.labels.get(AMD_PRODUCT_LABEL) for n in matching)
        products.pop(None, None)
        view = PoolView(pool=pool, nodes=matching, products=[p for p, _ in products.most_common()])
        if pool.sku:
            view.skus = [catalog.resolve(pool.sku).sku] if pool.sku in catalog else [pool.sku]
        else:
            for product in view.products:
                try:
                    sku = catalog.resolve(product).sku
                except UnknownGpuError:
                    view.unknown_products.append(product)
                    sku = product
                if sku not in view.skus:
                    view.skus.append(sku)
        views.append(view)
    return views


def sku_of(product: str) -> str | None:
    try:
        return DEFAULT_CATALOG.resolve(product).sku
    except UnknownGpuError:
        return None


def price_per_gpu_hour(view: PoolView, prices: Mapping[str, float], catalog: GpuCatalog = DEFAULT_CATALOG) -> float:
    """Price of one GPU of the pool per hour: the pool's own (spec.gpuPools[].pricePerGpuHour), the operator's
    table (its gpuPricesPerHour, by SKU), the catalog's list price, or 0 (unknown: the fleet is not placed)."""
    if view.primary_sku is None:
        return 0.0
    if view.pool.price_per_gpu_hour or prices.get(view.primary_sku):
        return view.pool.price_per_gpu_hour or prices[view.primary_sku]
    try:
        return catalog.resolve(view.primary_sku).default_price_per_gpu_hour
    except UnknownGpuError:
        return 0.0


def allocatable_gpus(view: PoolView, allocatable: Mapping[str, int | None]) -> int | None:
    """GPUs the pool's ready nodes can allocate (`allocatable`: node name -> its status.allocatable of the pool's
    GPU resource, None where it does not say); None when no node says."""
    known = [allocatable.get(info.name) for info in view.nodes if info.ready]
    known = [n for n in known if n is not None]
    return sum(known) if known else None


def node_allocatable(node: dict, resource: str) -> int | None:
    """A Node's status.allocatable of `resource` as a number (None: absent or not a number)."""
    value = ((node.get("status") or {}).get("allocatable") or {}).get(resource)
    try:
        return int(str(value))
    except (TypeError, ValueError):
        return None
