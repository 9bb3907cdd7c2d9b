"""Adaptive refinement end to end (issue 14): the real operator, on the sandbox API server, starts a round of
refinement Jobs where noisy profiles leave a change of k uncertain, accepts the points they append (sealed by
each Job's own token), and decides again."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from specpilot.api import seal
from specpilot.manifests.names import LABEL_REFINE_ROUND
from specpilot.perf.plausibility import REFINE_LEVELS_ANNOTATION
from tests.operator.scenario import (
    H100,
    NAMESPACE,
    complete_job,
    events,
    jobs,
    measured_status,
    node,
    profiles,
    publish_results,
    sdep,
    status,
)

pytestmark = pytest.mark.operator


def _refine_jobs(api, round_index: int) -> list[dict]:
    return [j for j in jobs(api) if (j["metadata"].get("labels") or {}).get(LABEL_REFINE_ROUND) == str(round_index)]


def _flag(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


async def _play_refinement_job(api, job: dict, seed: int = 100) -> int:
    """What `specpilot-bench --levels --ks --repeat --append` does: measure the levels (the boundaries' batch
    sizes, between the first sweep's levels) `repeat` times, each with fresh noise from the twin, and append
    the points to the profile's runs, sealed with the Job's token; then the Job controller marks it
    Complete. Returns the points appended."""
    args = job["spec"]["template"]["spec"]["containers"][0]["args"]
    levels = sorted({int(c) for c in _flag(args, "--levels").split(",")})
    ks = {int(k) for k in _flag(args, "--ks").split(",")}
    repeat = int(_flag(args, "--repeat")) if "--repeat" in args else 1
    assert "--append" in args
    name = job["metadata"]["ownerReferences"][0]["name"]
    profile = api.get("speculationprofiles", NAMESPACE, name)
    stored, method = profile["status"], profile["spec"].get("method") or {}
    measured = [measured_status("H100-SXM", method.get("method"), method.get("numSpeculativeTokens", 4),
                                seed=seed + i, noise=0.05, levels=levels,
                                requests_per_level=profile["spec"].get("requestsPerLevel", 64)) for i in range(repeat)]
    runs, appended = [dict(run) for run in stored["runs"]], 0
    for run in runs:
        if run["numSpeculativeTokens"] in ks:
            again = [p for m in measured for r in m["runs"] if r["numSpeculativeTokens"] == run["numSpeculativeTokens"]
                     for p in r["points"]]
            assert {p["concurrency"] for p in again} == set(levels)
            run["points"] = run["points"] + again
            appended += len(again)
    result = {k: v for k, v in stored.items() if k not in ("seal",)} | {"runs": runs}
    await api.patch("speculationprofiles", NAMESPACE, name, {"status": seal.sealed(result, job)},
                    subresource="status")
    await complete_job(api, job, datetime.now(tz=UTC))
    return appended


async def test_uncertain_crossovers_are_measured_again_and_decided_again(sandbox, operator):
    await sandbox.create(node("gpu-a", H100, "h100"))
    await sandbox.create(sdep())
    await sandbox.wait_for(lambda: len(jobs(sandbox)) == 2, what="the first benchmark Jobs")
    await publish_results(sandbox, "H100-SXM", noise=0.05, seed=1)
    for job in jobs(sandbox):  # their pods exit after publishing; no refinement Job starts beside them
        await complete_job(sandbox, job, datetime.now(tz=UTC))

    refinement = await sandbox.wait_for(
        lambda: ((status(sandbox).get("pools") or [{}])[0].get("refinement") or {}).get("round") == 1
        and status(sandbox)["pools"][0]["refinement"], what="refinement round 1")
    assert refinement["state"] == "Measuring" and refinement["jobs"] and "uncertain" in refinement["message"]
    first_basis = status(sandbox)["pools"][0]["decision"]["basis"]
    await sandbox.wait_for(lambda: any("Refining" == e["reason"] for e in events(sandbox)),
                           what="a Refining Event")  # kopf posts Events after the status patch
    expected = {j["jobName"] for j in refinement["jobs"]}
    sweep = set(profiles(sandbox)[0]["spec"]["concurrencyLevels"])
    asked = {c for j in refinement["jobs"] for c in j["levels"]}
    assert asked - sweep, f"measured where the changes lie, between the sweep's levels (asked {sorted(asked)})"

    # Play each Job as the operator starts it (a profile's parts run one after another).
    played: set[str] = set()
    appended = 0
    while played != expected:
        started = await sandbox.wait_for(
            lambda: [j for j in _refine_jobs(sandbox, 1) if j["metadata"]["name"] not in played],
            what=f"round 1's next Job (played {sorted(played)} of {sorted(expected)})")
        for job in started:
            assert job["metadata"]["name"] in expected
            # the operator recorded the round's levels before the Job existed: its points pass as asked for
            owner = job["metadata"]["ownerReferences"][0]["name"]
            recorded = sandbox.get("speculationprofiles", NAMESPACE, owner)["metadata"]["annotations"]
            levels = _flag(job["spec"]["template"]["spec"]["containers"][0]["args"], "--levels").split(",")
            assert set(levels) <= set(recorded[REFINE_LEVELS_ANNOTATION].split(","))
            appended += await _play_refinement_job(sandbox, job)
            played.add(job["metadata"]["name"])
    assert appended > 0

    def taken_in() -> dict | None:
        refinement = status(sandbox)["pools"][0].get("refinement") or {}
        return refinement if refinement.get("state") in ("Settled", "BudgetSpent") else None

    after = await sandbox.wait_for(taken_in, what="round 1 taken into the decision")
    assert after["spentLevels"] > 0 and after["round"] == 1  # refinement is one round
    assert not _refine_jobs(sandbox, 2)
    assert status(sandbox)["pools"][0]["decision"]["basis"] != first_basis
    # The appended results passed the seal check: no profile failed.
    assert all((p.get("status") or {}).get("phase") == "Succeeded" for p in profiles(sandbox))
    assert not events(sandbox, "ProfilingFailed")


async def test_deployments_sharing_profiles_accept_the_one_jobs_sealed_results(sandbox, operator):
    """Two deployments race to start the same profiles' Jobs: whichever created a Job records its nonce, the
    other leaves it alone, and the results its token seals are accepted for both."""
    await sandbox.create(node("gpu-a", H100, "h100"))
    first, second = sdep(), sdep()
    second["metadata"]["name"] = "llama-2"
    await sandbox.create(first)
    await sandbox.create(second)
    await sandbox.wait_for(lambda: len(jobs(sandbox)) == 2 and all(
        (p.get("status") or {}).get("jobName") for p in profiles(sandbox) if p["metadata"]["name"] in
        {j["metadata"]["labels"].get("specpilot.io/profile") for j in jobs(sandbox)}), what="the shared Jobs")
    await publish_results(sandbox, "H100-SXM")
    for name in ("llama", "llama-2"):
        await sandbox.wait_for(lambda name=name: status(sandbox, name).get("phase") == "Serving",
                               what=f"{name} Serving")
    assert len(profiles(sandbox)) == 3, "one set of profiles, shared"
    assert all((p.get("status") or {}).get("phase") == "Succeeded" for p in profiles(sandbox))
    assert not events(sandbox, "ProfilingFailed")
