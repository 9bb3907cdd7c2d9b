"""Typed models of specpilot's two custom resources; the single source of the CRD YAML."""

from .base import API_VERSION, GROUP, VERSION, Condition, format_validation_error
from .deployment import SpeculativeDeployment
from .deployment_spec import GpuPool, SpeculativeDeploymentSpec
from .deployment_status import Decision, PoolStatus, SpeculativeDeploymentStatus
from .methods import CandidateMethod, SpeculativeMethod, method_family
from .profile import (
    LevelPoint,
    Run,
    SpeculationProfile,
    SpeculationProfileSpec,
    SpeculationProfileStatus,
)
from .schedule import ScheduleRange

__all__ = [
    "API_VERSION", "GROUP", "VERSION", "CandidateMethod", "Condition", "Decision", "GpuPool", "LevelPoint",
    "PoolStatus", "Run", "ScheduleRange", "SpeculationProfile", "SpeculationProfileSpec",
    "SpeculationProfileStatus", "SpeculativeDeployment", "SpeculativeDeploymentSpec",
    "SpeculativeDeploymentStatus", "SpeculativeMethod", "format_validation_error", "method_family",
]
