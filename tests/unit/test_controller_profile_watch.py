"""The profile watch's bookkeeping (controller.handlers): watch events of profiles and their benchmark Jobs
counted per profile, and a deployment's fingerprint over its own profiles only."""

from __future__ import annotations

import logging
from types import SimpleNamespace

from specpilot.controller.handlers import (
    PERIODIC_ID,
    PROFILE_WATCH_ID,
    _profile_moved,
    _QuietTimers,
    profiles_fingerprint,
    profiles_in_flight,
)

BODY = {"metadata": {"namespace": "team", "name": "llama"},
        "status": {"pools": [{"name": "h100", "profiles": {"names": ["h100-base", "h100-eagle3"]}},
                             {"name": "h200", "profiles": {"names": ["h200-base"]}}]}}


def _ctx():
    return SimpleNamespace(profile_events={})


def test_an_event_of_one_of_the_deployments_profiles_changes_its_fingerprint():
    ctx = _ctx()
    before = profiles_fingerprint(ctx, BODY)
    _profile_moved(ctx, "team", "h100-eagle3")  # the profile's status changed, or its Job's
    after = profiles_fingerprint(ctx, BODY)
    assert after != before
    _profile_moved(ctx, "team", "h200-base")
    assert profiles_fingerprint(ctx, BODY) not in (before, after)


def test_other_profiles_and_other_namespaces_do_not_count():
    ctx = _ctx()
    before = profiles_fingerprint(ctx, BODY)
    _profile_moved(ctx, "team", "other-profile")
    _profile_moved(ctx, "elsewhere", "h100-base")
    assert profiles_fingerprint(ctx, BODY) == before


def test_a_deployment_without_status_has_an_empty_fingerprint():
    assert profiles_fingerprint(_ctx(), {"metadata": {"namespace": "team"}}) == ()


def test_timer_runs_that_succeed_are_not_logged_and_failures_are():
    quiet = _QuietTimers()

    def record(message: str) -> logging.LogRecord:
        return logging.LogRecord("kopf.objects", logging.INFO, __file__, 1, message, None, None)

    assert not quiet.filter(record(f"Timer '{PROFILE_WATCH_ID}' succeeded."))
    assert not quiet.filter(record(f"Timer '{PERIODIC_ID}' succeeded."))
    assert quiet.filter(record(f"Timer '{PROFILE_WATCH_ID}' failed with an exception. Will retry."))
    assert quiet.filter(record("Handler 'reconcile' succeeded."))
    assert quiet.filter(record("DecisionChanged: pool h100: off -> eagle3[1-16:4,17+:0]"))


def _serving(**pool) -> dict:
    base = {"name": "h100", "profiles": {"ready": 3, "total": 3, "failed": 0}, "refinement": {"state": "Settled"}}
    return {"status": {"phase": "Serving", "pools": [{**base, **pool}]}}


def test_the_profile_watch_runs_only_while_profiles_or_refinement_jobs_are_in_flight():
    """kopf runs the profile watch timer only where `profiles_in_flight` holds: anything but Serving, a pool
    with profiles still pending, or a refinement round measuring. A settled Serving deployment has no watch
    (its periodic reconciliation sees what moves under it)."""
    assert profiles_in_flight({})  # just created: no status yet
    assert profiles_in_flight({"status": {"phase": "Profiling"}})
    assert profiles_in_flight({"status": {"phase": "Degraded"}})
    assert not profiles_in_flight(_serving())
    assert not profiles_in_flight(_serving(profiles={"ready": 2, "total": 3, "failed": 1}))  # failed for good
    assert profiles_in_flight(_serving(profiles={"ready": 2, "total": 3, "failed": 0}))  # one re-measured
    assert profiles_in_flight(_serving(refinement={"state": "Measuring"}))
    two = _serving()
    two["status"]["pools"].append({"name": "h200", "profiles": {"ready": 0, "total": 3}})  # a GPU type joined
    assert profiles_in_flight(two)


def test_a_status_the_operator_did_not_write_keeps_the_watch_on():
    """Hostile or broken status values never raise in kopf's filter: the watch stays on and the reconciliation
    (which validates the status) judges them."""
    for status in ("Serving", {"phase": "Serving", "pools": "h100"}, {"phase": "Serving", "pools": ["h100"]},
                   {"phase": "Serving", "pools": [{"profiles": "all"}]},
                   {"phase": "Serving", "pools": [{"profiles": {"ready": "3", "total": 3}}]},
                   {"phase": "Serving", "pools": [{"profiles": {"ready": 3, "total": 3}, "refinement": []}]}):
        assert profiles_in_flight({"status": status}), status
