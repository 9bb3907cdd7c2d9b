"""SLO attainment (pure): the share of requests within the TPOT and TTFT SLOs, from vLLM's per-request histograms.

vLLM records each finished request's time per output token (`vllm:request_time_per_output_token_seconds`) and time
to first token (`vllm:time_to_first_token_seconds`) in histograms. Over the metrics window the share within an SLO
is the bucket count at that bound over all requests: exact when the SLO is one of vLLM's bucket bounds, linearly
interpolated inside the bucket that holds it otherwise (the status names that bucket, so the reader knows what the
figure rests on). The two histograms are kept apart, so the share within both is only known within bounds (the
Fréchet bounds: at least tpot + ttft - 1, at most the lower of the two): the condition says Attained only when the
lower bound meets the target, Missed only when the upper bound misses it, and Uncertain in between.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from ..api.deployment_spec import Policy
from ..api.deployment_status import PoolStatus, SloAttainment
from ..observe import vllm_metrics as vm
from ..observe.model import PoolObservation
from .events import Event

__all__ = ["MIN_REQUESTS", "deployment_attainment", "judged", "missed_event", "pool_attainment", "slo_condition"]

MIN_REQUESTS = 20
"""Finished requests a window needs before its attainment is judged: with fewer, one slow request moves the share
by 5 points or more."""


def _bucket(within: vm.Within) -> str:
    upper = "+Inf" if math.isinf(within.upper_le) else f"{within.upper_le:g}"
    return f"{within.lower_le:g}-{upper} s"


def pool_attainment(observation: PoolObservation, policy: Policy) -> SloAttainment | None:
    """The pool's attainment over the observation's window; None without a stated SLO or a finished request."""
    if policy.tpot_slo_ms is None and policy.ttft_slo_ms is None:
        return None
    tpot = vm.fraction_within(policy.tpot_slo_ms / 1000, observation.tpot_buckets) \
        if policy.tpot_slo_ms is not None else None
    ttft = vm.fraction_within(policy.ttft_slo_ms / 1000, observation.ttft_buckets) \
        if policy.ttft_slo_ms is not None else None
    if (policy.tpot_slo_ms is not None and tpot is None) or (policy.ttft_slo_ms is not None and ttft is None):
        return None  # a stated SLO whose histogram holds no request: nothing to judge
    requests = (tpot or ttft).count  # type: ignore[union-attr]
    return _combined(requests, tpot.fraction if tpot else None, ttft.fraction if ttft else None,
                     _bucket(tpot) if tpot else "", _bucket(ttft) if ttft else "")


def _combined(requests: float, tpot: float | None, ttft: float | None, tpot_bucket: str = "",
              ttft_bucket: str = "", target: float | None = None) -> SloAttainment:
    shares = [s for s in (tpot, ttft) if s is not None]
    at_least = max(0.0, sum(shares) - (len(shares) - 1)) if shares else None
    at_most = min(shares) if shares else None
    return SloAttainment(
        requests=round(requests, 1), tpot_percent=_percent(tpot), tpot_bucket=tpot_bucket,
        ttft_percent=_percent(ttft), ttft_bucket=ttft_bucket, both_at_least_percent=_percent(at_least),
        both_at_most_percent=_percent(at_most), target_percent=target)


def _percent(share: float | None) -> float | None:
    return None if share is None else round(100.0 * share, 2)


def deployment_attainment(pools: Sequence[PoolStatus], policy: Policy) -> SloAttainment | None:
    """The deployment's attainment: its pools' requests together (each pool's shares weighted by its requests)."""
    measured = [p.observed.slo for p in pools if p.observed is not None and p.observed.slo is not None
                and p.observed.slo.requests]
    if not measured:
        return None
    requests = sum(m.requests or 0.0 for m in measured)

    def weighted(field: str) -> float | None:
        values = [(getattr(m, field), m.requests or 0.0) for m in measured]
        if any(v is None for v, _ in values):
            return None
        return sum(v * n for v, n in values) / requests / 100.0

    # One SLO and vLLM's fixed buckets: every pool's figure rests on the same bucket.
    return _combined(requests, weighted("tpot_percent"), weighted("ttft_percent"), measured[0].tpot_bucket,
                     measured[0].ttft_bucket, target=policy.slo_attainment_percent)


def judged(attainment: SloAttainment | None) -> SloAttainment | None:
    """The attainment when its window is judged (a stated SLO, at least MIN_REQUESTS finished requests), else
    None: what the gauges, and so the alert, may carry."""
    if attainment is None or attainment.both_at_least_percent is None or (attainment.requests or 0) < MIN_REQUESTS:
        return None
    return attainment


def slo_condition(attainment: SloAttainment | None, target_percent: float, window_s: float
                  ) -> tuple[bool | None, str, str]:
    """SloAttained: (status, reason, message) for the deployment's attainment against its target."""
    if attainment is None or attainment.both_at_least_percent is None:
        return None, "NotMeasured", ("no request finished in the metrics window, or no SLO is stated "
                                     "(policy.tpotSloMs, policy.ttftSloMs)")
    if (attainment.requests or 0) < MIN_REQUESTS:
        return None, "TooFewRequests", (f"{attainment.requests:g} requests finished in the last {window_s:g} s "
                                        f"(at least {MIN_REQUESTS} are judged)")
    figures = _figures(attainment)
    if attainment.both_at_least_percent >= target_percent:
        return True, "Attained", f"{figures}: at least {attainment.both_at_least_percent:g}% within both SLOs " \
                                 f"(target {target_percent:g}%)"
    if (attainment.both_at_most_percent or 0.0) < target_percent:
        return False, "Missed", f"{figures}: at most {attainment.both_at_most_percent:g}% within both SLOs " \
                                f"(target {target_percent:g}%): add replicas (serving.maxReplicas, a lower " \
                                f"serving.targetUtilizationPercent) or loosen the SLO"
    return None, "Uncertain", f"{figures}: {attainment.both_at_least_percent:g}-{attainment.both_at_most_percent:g}% " \
                              f"within both SLOs (target {target_percent:g}%; the histograms do not tell which " \
                              f"requests missed both)"


def _figures(attainment: SloAttainment) -> str:
    parts = []
    if attainment.tpot_percent is not None:
        parts.append(f"TPOT {attainment.tpot_percent:g}% (bucket {attainment.tpot_bucket})")
    if attainment.ttft_percent is not None:
        parts.append(f"TTFT {attainment.ttft_percent:g}% (bucket {attainment.ttft_bucket})")
    return f"{attainment.requests:g} requests, " + ", ".join(parts)


def missed_event(was_missed: bool, now_missed: bool, message: str) -> Event | None:
    """One Warning Event when the deployment starts missing its target (not one per reconciliation)."""
    return Event("Warning", "SloAttainmentLow", message) if now_missed and not was_missed else None
