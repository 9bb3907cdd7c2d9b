"""The in-memory fingerprint the profile watch compares (controller.handlers.profiles_fingerprint)."""

from __future__ import annotations

import copy

from specpilot.controller.handlers import profiles_fingerprint

BODY = {"metadata": {"namespace": "team", "name": "llama"},
        "status": {"pools": [{"name": "h100", "profiles": {"names": ["h100-base", "h100-eagle3"]}}]}}


def _indexes():
    profiles = {
        "team/h100-base": [{"status": {"phase": "Running", "runs": []}}],
        "team/h100-eagle3": [{"status": {"phase": "Pending"}}],
        "team/other-profile": [{"status": {"phase": "Running"}}],
        "elsewhere/h100-base": [{"status": {"phase": "Failed"}}],
    }
    jobs = {
        "team/h100-base-job": [{"metadata": {"labels": {"specpilot.io/profile": "h100-base"}},
                                "status": {"active": 1}}],
        "team/unrelated": [{"metadata": {"labels": {"specpilot.io/profile": "other-profile"}}, "status": {}}],
    }
    return profiles, jobs


def test_a_profile_or_job_of_the_deployment_changing_changes_the_fingerprint():
    profiles, jobs = _indexes()
    before = profiles_fingerprint(BODY, profiles, jobs)

    finished = copy.deepcopy(profiles)
    finished["team/h100-base"][0]["status"] = {"phase": "Succeeded", "runs": [{}], "completedAt": "2026-01-01"}
    assert profiles_fingerprint(BODY, finished, jobs) != before

    one_run = copy.deepcopy(profiles)
    one_run["team/h100-base"][0]["status"]["runs"] = [{}]
    assert profiles_fingerprint(BODY, one_run, jobs) != before

    failed = copy.deepcopy(jobs)
    failed["team/h100-base-job"][0]["status"] = {"failed": 1, "conditions": [{"type": "Failed", "status": "True"}]}
    assert profiles_fingerprint(BODY, profiles, failed) != before


def test_other_deployments_profiles_and_jobs_do_not_count():
    profiles, jobs = _indexes()
    before = profiles_fingerprint(BODY, profiles, jobs)
    profiles["team/other-profile"][0]["status"] = {"phase": "Succeeded"}
    profiles["elsewhere/h100-base"][0]["status"] = {"phase": "Succeeded"}
    jobs["team/unrelated"][0]["status"] = {"succeeded": 1}
    assert profiles_fingerprint(BODY, profiles, jobs) == before


def test_a_deployment_without_status_has_an_empty_fingerprint():
    profiles, jobs = _indexes()
    assert profiles_fingerprint({"metadata": {"namespace": "team"}}, profiles, jobs) == ((), ())
