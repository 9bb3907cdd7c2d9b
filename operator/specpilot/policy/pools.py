"""The deployment's GPU pools as the cluster shows them: which nodes each pool's selector matches and which GPU
types (SKUs) they carry. Pure: the controller reads the Nodes, this matches them."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from ..api.deployment_spec import GpuPool, SpeculativeDeploymentSpec
from ..perf.catalog import DEFAULT_CATALOG, GpuCatalog, UnknownGpuError

__all__ = ["AMD_PRODUCT_LABEL", "GPU_PRODUCT_LABEL", "NodeInfo", "PoolView", "node_info", "pool_views", "sku_of"]


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
