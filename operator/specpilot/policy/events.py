"""What a decision tells the people who run it: a Kubernetes Event, posted on the SpeculativeDeployment.

One shape for every planner (profiling, pool, fleet) and every executor; the controller posts them as they are.
"""

from __future__ import annotations

import dataclasses

__all__ = ["Event"]


@dataclasses.dataclass(frozen=True)
class Event:
    type: str
    """Normal or Warning, as Kubernetes reads it."""
    reason: str
    """A CamelCase word `kubectl get events` shows and alerts match on (ProfilingFailed, SpeculationToggled)."""
    message: str
    """What happened and, for a Warning, what to do about it."""
