"""The profiling planner (policy.profiling) as a pure function: which profiles are created, restarted, given
a Job, waited on, accepted or failed, and the deployment's phase, from what exists and the time."""

from __future__ import annotations

import pytest

from datetime import UTC, datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from specpilot.api.deployment_status import Phase
from specpilot.policy import profiling as pp

NOW = datetime(2026, 12, 1, 12, tzinfo=UTC)


def need(name: str, pool: str = "h100", key: str = "baseline") -> pp.Need:
    return pp.Need(name, pool, key, "H100-SXM")


def plan(needed, profiles=None, jobs=None, **kw) -> pp.ProfilingPlan:
    return pp.plan_profiling(pp.ProfilingInputs(needed, profiles or {}, jobs or {}, NOW, **kw))


def kinds(result: pp.ProfilingPlan) -> list[str]:
    return [type(a).__name__ for a in result.actions]


def test_missing_profiles_are_created_and_get_jobs_within_the_pool_bound():
    needed = [need("a"), need("b", key="eagle3"), need("c", pool="a100")]
    result = plan(needed, max_parallel_jobs=1)
    assert [a.name for a in result.of(pp.CreateProfile)] == ["a", "b", "c"]
    assert [(a.name, a.pool) for a in result.of(pp.StartJob)] == [("a", "h100"), ("c", "a100")]
    assert result.states == {"a": "Pending", "b": "Pending", "c": "Pending"}
    assert result.phase == Phase.PROFILING and result.rollup.progress == "profiles 0/3"


def test_a_running_job_holds_its_slot():
    needed = [need("a"), need("b", key="eagle3")]
    profiles = {"a": pp.ProfileView("Running"), "b": pp.ProfileView("Pending")}
    jobs = {"a": pp.JobView("bench-a", "Active", active=1)}
    result = plan(needed, profiles, jobs, max_parallel_jobs=1)
    assert not result.of(pp.StartJob)
    assert plan(needed, profiles, jobs, max_parallel_jobs=2).of(pp.StartJob) == [pp.StartJob("b", "h100")]


def test_a_started_job_marks_the_profile_running_once():
    profiles = {"a": pp.ProfileView("Pending")}
    jobs = {"a": pp.JobView("bench-a", "Active", active=1)}
    assert plan([need("a")], profiles, jobs).of(pp.MarkRunning) == [pp.MarkRunning("a", "bench-a")]
    assert not plan([need("a")], {"a": pp.ProfileView("Running")}, jobs).of(pp.MarkRunning)


@pytest.mark.parametrize(("nonce", "name"), [(False, True), (True, False), (False, False)])
def test_a_job_whose_record_was_lost_is_recorded_before_it_is_followed(nonce, name):
    """The API server went away (or the operator stopped) between creating the Job and recording it on the
    profile: the next plan records it (nonce, uid and status.jobName), then follows the Job as usual."""
    profiles = {"a": pp.ProfileView("Pending")}
    jobs = {"a": pp.JobView("bench-a", "Active", active=1, nonce_recorded=nonce, name_recorded=name)}
    assert kinds(plan([need("a")], profiles, jobs)) == ["RecordJob", "MarkRunning"]
    recorded = {"a": pp.JobView("bench-a", "Active", active=1)}
    assert "RecordJob" not in kinds(plan([need("a")], {"a": pp.ProfileView("Running")}, recorded))


def test_a_failed_attempt_is_recorded_as_a_retry_then_the_failed_job_fails_the_profile():
    profile = pp.ProfileView("Running")
    retrying = plan([need("a")], {"a": profile}, {"a": pp.JobView("bench-a", "Active", active=1, failed=1)})
    assert retrying.of(pp.RecordRetry) == [pp.RecordRetry("a", 1)] and retrying.states["a"] == "Running"
    recorded = plan([need("a")], {"a": pp.ProfileView("Running", attempts=1)},
                    {"a": pp.JobView("bench-a", "Active", active=1, failed=1)})
    assert not recorded.of(pp.RecordRetry), "recorded once"
    failed = plan([need("a")], {"a": profile},
                  {"a": pp.JobView("bench-a", "Failed", failed=3, failure=("BackoffLimitExceeded", "too many"))})
    [mark] = failed.of(pp.MarkFailed)
    assert mark.reason == "BackoffLimitExceeded" and mark.attempts == 3
    assert mark.message.startswith("too many after 3 attempt(s); ") and pp.RETRY_HINT in mark.message
    assert failed.states["a"] == "Failed" and failed.phase == Phase.DEGRADED
    assert failed.rollup.profiled == (False, "ProfilesFailed")


def test_a_completed_job_without_a_result_waits_out_the_grace_then_fails_no_result():
    profile = pp.ProfileView("Running")
    done = NOW - timedelta(seconds=30)
    waiting = plan([need("a")], {"a": profile}, {"a": pp.JobView("bench-a", "Complete", completed_at=done)})
    assert waiting.states["a"] == "Running" and not waiting.of(pp.MarkFailed)
    assert waiting.next_wake == done + timedelta(seconds=pp.RESULT_GRACE_S)
    late = NOW - timedelta(seconds=pp.RESULT_GRACE_S + 1)
    failed = plan([need("a")], {"a": profile}, {"a": pp.JobView("bench-a", "Complete", completed_at=late)})
    [mark] = failed.of(pp.MarkFailed)
    assert mark.reason == "NoResult" and "within 60 s" in mark.message


def test_a_complete_result_is_accepted_once_or_refused():
    accepted = plan([need("a")], {"a": pp.ProfileView("Succeeded", completed_at=NOW)})
    assert accepted.of(pp.Accept) == [pp.Accept("a")] and accepted.phase == Phase.SERVING
    assert not plan([need("a")], {"a": pp.ProfileView("Succeeded", verdict=True, completed_at=NOW)}).actions
    refused = plan([need("a")], {"a": pp.ProfileView("Succeeded", refusal=("UnsealedResult", "no seal"))})
    [mark] = refused.of(pp.MarkFailed)
    assert (mark.reason, mark.event_message) == ("UnsealedResult", "UnsealedResult: no seal")
    assert refused.states["a"] == "Failed"


def test_stale_or_requested_profiles_are_restarted():
    old = pp.ProfileView("Succeeded", verdict=True, completed_at=NOW - timedelta(hours=25))
    [restart] = plan([need("a")], {"a": old}, max_age_hours=24).of(pp.Restart)
    assert restart.why == "older than 24 h"
    assert not plan([need("a")], {"a": old}, max_age_hours=0).actions, "0: never too old"
    asked = plan([need("a")], {"a": pp.ProfileView("Failed", verdict=True, reprofile_mark="1")}, reprofile="2")
    assert kinds(asked) == ["Restart", "StartJob"] and asked.of(pp.Restart)[0].why == "requested by annotation"
    assert not plan([need("a")], {"a": pp.ProfileView("Failed", verdict=True, reprofile_mark="2")},
                    reprofile="2").actions


def test_a_profile_two_pools_share_is_planned_once_and_counted_for_both():
    needed = [need("a", pool="x"), need("a", pool="y")]
    result = plan(needed)
    assert kinds(result) == ["CreateProfile", "StartJob"]
    assert result.rollup == pp.Rollup(0, 2, 0)
    assert pp.overall_phase(0, 0, 0) == Phase.PENDING


# --- properties -------------------------------------------------------------------------------------------------

PHASES = ("Pending", "Running", "Succeeded", "Failed")
JOB_STATES = ("Active", "Complete", "Failed")

profiles_st = st.fixed_dictionaries({}, optional={
    "phase": st.sampled_from(PHASES), "verdict": st.booleans(), "age_h": st.floats(0, 400),
    "mark": st.sampled_from([None, "1", "2"])})
jobs_st = st.one_of(st.none(), st.tuples(st.sampled_from(JOB_STATES), st.integers(0, 1), st.integers(0, 4),
                                         st.floats(0, 300)))


@st.composite
def worlds(draw):
    n = draw(st.integers(1, 8))
    needed = [need(f"p{i}", pool=draw(st.sampled_from(["a", "b"])), key=f"m{i}") for i in range(n)]
    profiles, jobs = {}, {}
    for item in needed:
        if draw(st.booleans()):
            raw = draw(profiles_st)
            phase = raw.get("phase", "Pending")
            profiles[item.name] = pp.ProfileView(
                phase, verdict=raw.get("verdict", False) and phase in ("Succeeded", "Failed"),
                completed_at=NOW - timedelta(hours=raw.get("age_h", 0.0)), reprofile_mark=raw.get("mark"))
            job = draw(jobs_st)
            if job is not None:
                state, active, failed, ago = job
                jobs[item.name] = pp.JobView(f"bench-{item.name}", state, active=active, failed=failed,
                                             completed_at=NOW - timedelta(seconds=ago) if state == "Complete" else None)
    return needed, profiles, jobs, draw(st.integers(1, 3)), draw(st.sampled_from([None, "1", "2"])), \
        draw(st.sampled_from([0.0, 24.0, 168.0]))


@settings(max_examples=200, deadline=None)
@given(worlds())
def test_never_more_jobs_per_pool_than_allowed(world):
    needed, profiles, jobs, max_parallel, reprofile, max_age = world
    result = plan(needed, profiles, jobs, max_parallel_jobs=max_parallel, reprofile=reprofile, max_age_hours=max_age)
    for pool in ("a", "b"):
        holding = sum(1 for n in needed if n.pool == pool and n.name in jobs and jobs[n.name].state == "Active"
                      and result.states[n.name] in ("Pending", "Running")
                      and not any(isinstance(a, pp.Restart) and a.name == n.name for a in result.actions))
        started = sum(1 for a in result.of(pp.StartJob) if a.pool == pool)
        assert started == 0 or holding + started <= max_parallel
        assert started <= max_parallel


@settings(max_examples=200, deadline=None)
@given(worlds())
def test_a_fresh_accepted_profile_is_left_alone(world):
    needed, profiles, jobs, max_parallel, reprofile, max_age = world
    result = plan(needed, profiles, jobs, max_parallel_jobs=max_parallel, reprofile=reprofile, max_age_hours=max_age)
    for name, profile in profiles.items():
        fresh = pp.is_fresh(profile.phase, profile.completed_at, max_age, NOW)
        asked = reprofile is not None and profile.reprofile_mark != reprofile
        if profile.phase == "Succeeded" and profile.verdict and fresh and not asked:
            assert not [a for a in result.actions if getattr(a, "name", None) == name]
            assert result.states[name] == "Succeeded"


@settings(max_examples=200, deadline=None)
@given(worlds())
def test_every_profile_gets_a_state_and_the_phase_follows_the_rollup(world):
    needed, profiles, jobs, max_parallel, reprofile, max_age = world
    result = plan(needed, profiles, jobs, max_parallel_jobs=max_parallel, reprofile=reprofile, max_age_hours=max_age)
    assert set(result.states) == {n.name for n in needed}
    assert all(state in PHASES for state in result.states.values())
    failed = sum(1 for n in needed if result.states[n.name] == "Failed")
    assert (result.phase == Phase.DEGRADED) == bool(failed)
    # a Job only starts for a profile measuring without one, and never twice
    started = [a.name for a in result.of(pp.StartJob)]
    assert len(started) == len(set(started))
    for name in started:
        assert result.states[name] in ("Pending", "Running")
        assert name not in jobs or any(isinstance(a, (pp.Restart, pp.CreateProfile)) and a.name == name
                                       for a in result.actions)


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 5), st.sampled_from(["Active", "Failed"]))
def test_a_failed_attempt_never_fails_the_profile_before_the_job_gives_up(failures, state):
    job = pp.JobView("bench-a", state, active=1 if state == "Active" else 0, failed=failures)
    result = plan([need("a")], {"a": pp.ProfileView("Running")}, {"a": job})
    assert (result.states["a"] == "Failed") == (state == "Failed")


def test_profile_freshness_counts_from_completion():
    assert pp.is_fresh("Succeeded", NOW - timedelta(hours=23), 24, NOW)
    assert not pp.is_fresh("Succeeded", NOW - timedelta(hours=25), 24, NOW)
    assert not pp.is_fresh("Running", NOW, 24, NOW)
    assert not pp.is_fresh("Failed", NOW, 24, NOW)
    assert pp.is_fresh("Succeeded", None, 24, NOW)
    # maxAgeHours 0: never measured again by age (what the chart documents)
    assert pp.is_fresh("Succeeded", NOW - timedelta(days=400), 0, NOW)
    assert not pp.is_fresh("Failed", NOW, 0, NOW)


def test_jobs_are_started_oldest_first_up_to_the_parallel_limit():
    assert pp.jobs_allowed(["a", "b", "c"], running=0, max_parallel=2) == ["a", "b"]
    assert pp.jobs_allowed(["a", "b", "c"], running=1, max_parallel=2) == ["a"]
    assert pp.jobs_allowed(["a", "b"], running=3, max_parallel=2) == []


def test_the_overall_phase():
    assert pp.overall_phase(0, 0, 0) == Phase.PENDING
    assert pp.overall_phase(1, 3, 0) == Phase.PROFILING
    assert pp.overall_phase(2, 3, 1) == Phase.DEGRADED
    assert pp.overall_phase(3, 3, 0) == Phase.SERVING
