"""What the operator refuses in a SpeculativeDeployment its schema accepts, given the admin's config (pure): the
tenancy bounds (`api.tenancy`) and the routing's Gateway allow-list and endpoint picker (`api.gateway`). A refused
spec gets Valid=False and nothing is created; `specpilot validate --operator-config` reports the same list."""

from __future__ import annotations

from ..api.deployment_spec import SpeculativeDeploymentSpec
from ..api.gateway import gateway_problems
from ..api.tenancy import spec_problems
from ..config import OperatorConfig

__all__ = ["operator_refusals"]


def operator_refusals(spec: SpeculativeDeploymentSpec, namespace: str, config: OperatorConfig) -> list[str]:
    """One message per refusal, naming the field and the fix (empty: the operator runs the spec)."""
    return (spec_problems(spec, config.tenancy, benchmark_image=config.benchmark_image)
            + gateway_problems(spec, namespace, config.allowed_gateway_parents,
                               default_gateway=bool(config.default_gateway_parent_refs)))
