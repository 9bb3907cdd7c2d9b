"""`SpeculativeDeployment` (short name `sdep`) as the API server stores it: its spec (`deployment_spec`) and status
(`deployment_status`)."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from .base import ApiModel
from .deployment_spec import SpeculativeDeploymentSpec
from .deployment_status import SpeculativeDeploymentStatus


class SpeculativeDeployment(ApiModel):
    """Top-level object, as stored by the API server."""

    model_config = {"extra": "ignore"}

    api_version: str = "specpilot.io/v1alpha1"
    kind: str = "SpeculativeDeployment"
    metadata: dict[str, Any] = Field(default_factory=dict)
    spec: SpeculativeDeploymentSpec
    status: SpeculativeDeploymentStatus | None = None
