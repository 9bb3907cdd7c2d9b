"""The deployment's SpeculationProfiles and their benchmark Jobs: reuse fresh profiles, create missing ones
and their Jobs (bounded per pool), re-measure stale or requested ones, mirror Job failures and refuse
implausible results. Level-triggered: from whatever it finds, with the profile's status and annotations as
the only record.

The operator alone decides a profile's phase. A benchmark Job writes only its sealed result; the phase, reason
and message follow from the Job's state and the seal check as the operator observes them, and the operator's
verdict is kept in an annotation (VERDICT_ANNOTATION), which the benchmark identity cannot write. A
status.phase someone else wrote (any pod with the benchmark ServiceAccount may patch profiles' status) is
ignored, reported in an UnsealedStatusChange Warning Event and restored; every failure the operator decides
carries a ProfilingFailed Event, and the deployment's conditions count it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import datetime

from ..api import seal
from ..api.deployment_spec import GpuPool, SpeculativeDeploymentSpec
from ..api.deployment_status import RefinementJob
from ..api.profile import SpeculationProfile
from ..manifests import names
from ..manifests.benchmark import RefineRun, benchmark_job
from ..manifests.rbac import bench_rbac
from ..manifests.serving import serving_service_account
from ..perf.plausibility import REFINE_LEVELS_ANNOTATION, checked_result_problems, refine_levels_annotation
from ..policy import job_failure, profiling
from ..policy.events import Event
from ..policy.needs import max_parallel_jobs
from ..policy.profiling import Need
from ..policy.verdict import (
    VERDICT_ANNOTATION,
    job_completed_at,
    owned_view,
    verdict_annotation,
    verdict_message,
    verdict_of,
)
from .context import Context
from .kube import Conflict

REPROFILE_ANNOTATION = profiling.REPROFILE_ANNOTATION
"""Set to any new value (e.g. a timestamp) to re-measure every profile of the deployment."""
JOB_UID_ANNOTATION = "specpilot.io/job-uid"
"""On a SpeculationProfile: the uid of the Job measuring it now."""


BENCH_IDENTITY_RECHECK_S = 300
"""How often a namespace's benchmark ServiceAccount/Role/RoleBinding are checked again (someone may delete them)."""
RESULT_GRACE_S = profiling.RESULT_GRACE_S
"""How long after a benchmark Job completes its result may take to reach the profile (watch order)."""
RETRY_HINT = profiling.RETRY_HINT
"""How a profile that failed for good is measured again, as its message says."""
POD_CHECK_S = 30.0
"""How often, at most, the pods of an active benchmark Job with no pod ready are read to see whether one cannot
start (an image that cannot be pulled, no node): four reconcile intervals when that is shorter."""


async def ensure_bench_identity(ctx: Context, namespace: str) -> None:
    """The ServiceAccount and RoleBinding (to the chart's bench ClusterRole: get a profile, get and patch its
    status) benchmark pods use to publish results, one set per namespace; the operator creates no Roles."""
    last = ctx.bench_identity_checked.get(namespace)
    if last is not None and time.monotonic() - last < BENCH_IDENTITY_RECHECK_S:
        return
    if last is not None:
        # A re-check of an identity that was in place: the first reconciliation due claims it, so the others
        # running at the same time do not send the same requests again (at 1,000 deployments four or five
        # reconciliations did). A first check is made by every reconciliation that needs it: none may create
        # a Job before the identity exists.
        ctx.bench_identity_checked[namespace] = time.monotonic()
    identities = [*bench_rbac(namespace, cluster_role=ctx.config.bench_cluster_role),
                  serving_service_account(namespace)]  # the serving pods' own account: no Role, no token
    try:
        for obj in identities:
            await ctx.kube.ensure(obj)
    except BaseException:
        if last is not None:
            ctx.bench_identity_checked[namespace] = last  # not confirmed: the next reconciliation checks again
        raise
    ctx.bench_identity_checked[namespace] = time.monotonic()


def _current_job(job: dict | None, profile: dict) -> dict | None:
    """The Job measuring the profile now; a previous measurement's Job (still in the cache while it is
    deleted) does not count."""
    if job is None:
        return None
    expected = (((profile.get("metadata") or {}).get("annotations")) or {}).get(JOB_UID_ANNOTATION)
    if expected is not None and expected != (job.get("metadata") or {}).get("uid"):
        return None
    return job


def job_state(job: dict) -> str:
    status = job.get("status") or {}
    for cond in status.get("conditions") or []:
        if cond.get("status") == "True" and cond.get("type") in ("Complete", "SuccessCriteriaMet"):
            return "Complete"
        if cond.get("status") == "True" and cond.get("type") in ("Failed", "FailureTarget"):
            return "Failed"
    return "Active"


def _job_failure(job: dict) -> tuple[str, str]:
    for cond in (job.get("status") or {}).get("conditions") or []:
        if cond.get("type") in ("Failed", "FailureTarget") and cond.get("status") == "True":
            return cond.get("reason") or "JobFailed", cond.get("message") or "the benchmark Job failed"
    return "JobFailed", "the benchmark Job failed"


@dataclass(frozen=True)
class ProfileRead:
    """A needed profile as the read phase left it, for the executor: the object (after the operator restored what
    someone else wrote over its verdict) and its current Job (after the adoption check)."""

    need: Need
    profile: dict | None
    job: dict | None


async def read_profiles(ctx: Context, spec: SpeculativeDeploymentSpec, namespace: str, needed: list[Need],
                        profiles: dict[str, dict], jobs: dict[str, dict], reprofile: str | None, now: datetime,
                        events: list[Event], spec_changed: bool = False
                        ) -> tuple[profiling.ProfilingInputs, dict[str, ProfileRead]]:
    """The profiling planner's inputs (`policy.profiling.ProfilingInputs`): each needed profile as the operator
    reads it (its verdict over status; a status someone else rewrote is reported and restored here, before any
    plan) and its current Job (a Job the operator did not make is refused, reported and deleted here); a failed
    Job's pods are read for its account."""
    reads: dict[str, ProfileRead] = {}
    views: dict[str, profiling.ProfileView] = {}
    job_views: dict[str, profiling.JobView] = {}
    for need in needed:
        if need.name in reads:
            continue  # a profile two pools share is read once
        stored = _as_left_here(ctx, namespace, profiles.get(need.name))
        job = None
        if stored is not None:
            stored = await _owned(ctx, namespace, need, stored, events)
            job = _current_job(jobs.get(f"{namespace}/{names.bench_job_name(need.name)}"), stored)
            # Only a measuring profile follows its Job (a decided one is renewed or kept, whatever Job is left):
            # the adoption check is for the Job whose result it is about to take.
            measuring = ((stored.get("status") or {}).get("phase") or "Pending") in profiling.MEASURING
            if job is not None and measuring and _job_nonce(stored, job) is not None:
                job = await _adopted(ctx, namespace, need, stored, job, events)
            view = _view(ctx, namespace, stored, job)
            views[need.name] = view
            job_view = _job_view(job, stored, *await _failed_pods_account(ctx, namespace, stored, job, view))
            if job_view is not None:
                job_views[need.name] = job_view
        reads[need.name] = ProfileRead(need, stored, job)
    max_age = spec.profiling.reprofile.max_age_hours if "max_age_hours" in spec.profiling.reprofile.model_fields_set \
        else ctx.config.profiling_defaults.max_age_hours
    return profiling.ProfilingInputs(
        needed=needed, profiles=views, jobs=job_views, now=now, max_parallel_jobs=max_parallel_jobs(spec, ctx.config),
        max_age_hours=max_age, reprofile=reprofile, spec_changed=spec_changed, result_grace_s=RESULT_GRACE_S), reads


async def execute_profiling(ctx: Context, spec: SpeculativeDeploymentSpec, namespace: str, sdep_name: str,
                            plan: profiling.ProfilingPlan, reads: dict[str, ProfileRead],
                            events: list[Event]) -> None:
    """The profiling planner's actions, in order (API writes, Events, counters): a created or restarted profile is
    carried to the actions after it as the write left it; then the active Jobs' pods are checked for one that
    cannot start, and each accepted result's Job is counted once."""
    current = {name: read.profile for name, read in reads.items()}
    renewed: set[str] = set()
    pools = {p.name: p for p in spec.gpu_pools}
    for action in plan.actions:
        read = reads[action.name]
        if isinstance(action, (profiling.CreateProfile, profiling.Restart)):
            current[action.name] = await _renew(ctx, namespace, read.need, current[action.name], action, events)
            renewed.add(action.name)
        elif isinstance(action, profiling.StartJob):
            await _start_job(ctx, spec, namespace, sdep_name, pools[action.pool], read.need, current[action.name])
        else:
            await _execute(ctx, namespace, read.need, current[action.name],
                           None if action.name in renewed else read.job, action, events)
    for name, read in reads.items():
        if name in renewed or read.job is None:
            continue
        if plan.states.get(name) in profiling.MEASURING:
            await _check_pod_start(ctx, namespace, read.need, read.job, events)
        uid = (read.job.get("metadata") or {}).get("uid")
        if plan.states.get(name) == profiling.SUCCEEDED and uid and uid not in ctx.counted_jobs:
            ctx.counted_jobs[uid] = True
            ctx.metrics.profiling_jobs.labels(namespace, "succeeded").inc()


def _stamp(text: str | None) -> datetime | None:
    return datetime.fromisoformat(text.replace("Z", "+00:00")) if text else None


def _view(ctx: Context, namespace: str, profile: dict, job: dict | None = None) -> profiling.ProfileView:
    """The planner's view of a profile as the operator reads it (after `_owned`): a Succeeded result's seal and
    plausibility are checked (they need the result key and the catalog) and a failure's account quoted (its seal
    checked with the current Job's nonce, which `RecordJob` records first) and kept as written, for the planner's
    `policy.model_access` to read."""
    status = profile.get("status") or {}
    phase = status.get("phase") or "Pending"
    annotations = ((profile.get("metadata") or {}).get("annotations")) or {}
    if job is not None and phase in profiling.MEASURING:
        profile = _with_nonce(profile, job)
    failure = _sealed_bench_failure(ctx, namespace, profile) if phase in profiling.MEASURING else None
    return profiling.ProfileView(
        phase=phase, verdict=verdict_of(profile) is not None, completed_at=_stamp(status.get("completedAt")),
        attempts=status.get("attempts", 0), reprofile_mark=annotations.get(REPROFILE_ANNOTATION),
        refusal=_result_refusal(ctx, namespace, profile) if phase == "Succeeded" else None,
        bench_said="; " + job_failure.bench_account(failure.get("reason"), failure.get("message"),
                                                    _job_tokens(ctx, namespace, profile)) if failure else "",
        bench_text=str(failure.get("message") or "") if failure else "",
        failure_reason=verdict.get("reason") if (verdict := verdict_of(profile) or {}).get("phase") == "Failed"
        else None)


def _job_view(job: dict | None, profile: dict, pods_said: str = "", engine_text: str = "") -> profiling.JobView | None:
    if job is None:
        return None
    status = job.get("status") or {}
    return profiling.JobView(
        name=(job.get("metadata") or {}).get("name", ""), state=job_state(job), active=int(status.get("active") or 0),
        failed=int(status.get("failed") or 0), completed_at=job_completed_at(job), failure=_job_failure(job),
        pods_said=pods_said, engine_text=engine_text,
        nonce_recorded=_job_nonce(profile, job) is None,
        name_recorded=(profile.get("status") or {}).get("jobName") == (job.get("metadata") or {}).get("name"))


async def _renew(ctx: Context, namespace: str, need: Need, profile: dict | None,
                 action: profiling.CreateProfile | profiling.Restart, events: list[Event]) -> dict:
    """Create the profile, or measure it again; the profile as it looks right after."""
    events.append(action.event(need))
    if isinstance(action, profiling.CreateProfile):
        return await _create_profile(ctx, namespace, need, action.reprofile)
    epoch = await restart_profile(ctx, namespace, need.name, profile, action.reprofile)
    return _restarted(profile, epoch)


async def _execute(ctx: Context, namespace: str, need: Need, profile: dict, job: dict | None,
                   action: profiling.Action, events: list[Event]) -> None:
    """One of the planner's actions on a profile (API writes, Events, counters)."""
    if isinstance(action, profiling.RecordJob):
        await _record_job(ctx, namespace, need.name, profile, job)
    elif isinstance(action, profiling.MarkFailed):
        await _fail_profile(ctx, namespace, need, profile, events, action.status, action.event_message)
        if action.delete_job:  # after the verdict: a reconciliation that sees the Job gone sees the profile Failed
            await ctx.kube.delete("jobs", namespace, action.delete_job)
    elif isinstance(action, profiling.Accept):
        await _accept_result(ctx, namespace, need, profile, events)
    elif isinstance(action, profiling.MarkRunning):
        await ctx.kube.patch("speculationprofiles", namespace, need.name,
                             {"status": {"phase": "Running", "reason": "Measuring",
                                         "message": f"the benchmark Job {action.job_name} is running"}},
                             subresource="status")
    elif isinstance(action, profiling.RecordRetry):
        await ctx.kube.patch("speculationprofiles", namespace, need.name,
                             {"status": {"attempts": action.attempts, "reason": "Retrying",
                                         "message": f"attempt {action.attempts + 1} after a failure"}},
                             subresource="status")
    # Wait: nothing to write (the timer or the Job's next change brings the next reconciliation)


async def _owned(ctx: Context, namespace: str, need: Need, profile: dict,
                 events: list[Event]) -> dict:
    """The profile as the operator reads it (owned_view). A decision in status.phase that the operator
    did not make is reported and restored; a status behind the operator's verdict is brought up to it."""
    view = owned_view(profile)
    if view.written is None and not view.text_forged:
        return view.profile
    verdict = verdict_of(profile)
    if view.text_forged:
        events.append(Event("Warning", "UnsealedStatusChange",
                            f"{need.name}: status.reason and status.message were rewritten by someone other than the "
                            f"operator (its verdict: {verdict['phase']}, {verdict['reason']}); restored. Only the "
                            f"operator writes a profile's reason and message"))
    if view.forged:
        said = f"the operator's verdict is {verdict['phase']}" if verdict else "the operator has decided nothing yet"
        events.append(Event("Warning", "UnsealedStatusChange",
                            f"{need.name}: status.phase was set to {view.written} by someone other than the operator "
                            f"({said}); ignored and restored. Only the operator decides a profile's phase; a "
                            f"benchmark Job writes only its sealed result"))
    if verdict is not None:
        restored = {"phase": verdict["phase"], "reason": verdict["reason"], "message": verdict["message"]}
    elif view.forged:
        restored = {"phase": "Running" if view.phase == "Succeeded" else view.phase}
    else:
        return view.profile
    await ctx.kube.patch("speculationprofiles", namespace, need.name, {"status": restored}, subresource="status")
    return view.profile


async def _accept_result(ctx: Context, namespace: str, need: Need, profile: dict,
                         events: list[Event]) -> None:
    """Record the operator's verdict on a complete, sealed and plausible result: Succeeded."""
    reason = "Measured"
    message = "the benchmark Job's sealed result passed the operator's checks"
    await ctx.kube.patch("speculationprofiles", namespace, need.name, {"metadata": {"annotations": {
        VERDICT_ANNOTATION: verdict_annotation("Succeeded", reason, message)}}})
    await ctx.kube.patch("speculationprofiles", namespace, need.name,
                         {"status": {"phase": "Succeeded", "reason": reason, "message": message}},
                         subresource="status")
    events.append(Event("Normal", "Profiled", f"{need.key} on {need.sku} ({need.name}): result accepted"))


def _sealed_bench_failure(ctx: Context, namespace: str, profile: dict) -> dict | None:
    """The benchmark's own account of why it stopped (status.benchFailure), only when the profile's seal holds
    (its Job wrote it, not tenant code or another writer); None otherwise. The engine's log lines it carries are
    quoted as the engine's text (job_failure.bench_account)."""
    failure = (profile.get("status") or {}).get("benchFailure")
    if not isinstance(failure, dict) or seal.seal_problem(ctx.result_key, namespace, profile) is not None:
        return None
    return failure


def _job_tokens(ctx: Context, namespace: str, profile: dict, job: dict | None = None) -> list[str]:
    """The result tokens of the profile's recorded Jobs, and of `job` (whose nonce may not be recorded yet):
    scrubbed from any pod text quoted."""
    meta = profile.get("metadata") or {}
    nonces = ((meta.get("annotations") or {}).get(seal.NONCE_ANNOTATION) or "").split()
    job_nonce = (((job or {}).get("metadata") or {}).get("annotations") or {}).get(seal.NONCE_ANNOTATION)
    if job_nonce and job_nonce not in nonces:
        nonces.append(job_nonce)
    return [seal.job_token(ctx.result_key, namespace, meta.get("name", ""), nonce) for nonce in nonces]


async def _job_pods(ctx: Context, namespace: str, job: dict) -> list[dict]:
    return await ctx.kube.list("pods", namespace, label_selector=job_failure.job_pod_selector(job))


async def _failed_pods_account(ctx: Context, namespace: str, profile: dict, job: dict | None,
                               view: profiling.ProfileView) -> tuple[str, str]:
    """What the pods of a Job that failed for good say about why (`job_failure.pod_account`), and the engine
    container's message as written (`job_failure.engine_message`, for the planner to read, not quote), read once:
    when the profile is still measuring, so its failure is about to be recorded; ("", "") otherwise."""
    if job is None or view.phase not in profiling.MEASURING or job_state(job) != "Failed":
        return "", ""
    meta = job.get("metadata") or {}
    uid = meta.get("uid") or None
    earlier = (ctx.pod_checks.get(uid) or (0.0, "", ""))[2] if uid else ""
    pods = await _job_pods(ctx, namespace, job)
    return (job_failure.pod_account(pods, job_uid=uid, bench_said=bool(view.bench_said),
                                    known_secrets=_job_tokens(ctx, namespace, profile, job), earlier=earlier),
            job_failure.engine_message(pods, uid))


async def _check_pod_start(ctx: Context, namespace: str, need: Need, job: dict | None,
                           events: list[Event]) -> None:
    """An active Job with no pod ready (Job status.ready, where the cluster reports it): read its pods, at most
    every POD_CHECK_S, and when one cannot start (`job_failure.pod_not_starting`) say why in the profile's
    status and a BenchmarkPodNotStarting Warning Event, once per cause. The profile is not failed: Kubernetes
    keeps trying (a registry back, a node added) until the Job's deadline."""
    status = (job or {}).get("status") or {}
    meta = (job or {}).get("metadata") or {}
    uid = meta.get("uid")
    if not uid or job_state(job) != "Active":
        return
    last_at, last_said, reported = ctx.pod_checks.get(uid) or (None, "", "")
    if status.get("ready") != 0 or not int(status.get("active") or 0):
        if last_said:  # it started after all: the profile no longer says it cannot
            ctx.pod_checks[uid] = (last_at, "", reported)
            await ctx.kube.patch("speculationprofiles", namespace, need.name, {"status": {
                "reason": "Measuring", "message": f"the benchmark Job {meta.get('name')} is running"}},
                subresource="status")
        return
    if last_at is not None and time.monotonic() - last_at < min(POD_CHECK_S,
                                                                4 * ctx.config.reconcile_interval_seconds):
        return
    said = job_failure.pod_not_starting(await _job_pods(ctx, namespace, job), uid)
    ctx.pod_checks[uid] = (time.monotonic(), said, said or reported)
    if not said or said == last_said:
        return
    message = (f"the benchmark Job {meta.get('name')} cannot start: {said}; Kubernetes keeps trying until the Job's "
               f"deadline (spec.profiling.jobDeadlineSeconds)")
    await ctx.kube.patch("speculationprofiles", namespace, need.name,
                         {"status": {"reason": "PodNotStarting", "message": message}}, subresource="status")
    events.append(Event("Warning", "BenchmarkPodNotStarting", f"{need.key} on {need.sku} ({need.name}): {message}"))


async def _start_job(ctx: Context, spec: SpeculativeDeploymentSpec, namespace: str, sdep_name: str, pool: GpuPool,
                     need: Need, profile: dict) -> None:
    """Create the profile's benchmark Job, with a fresh result nonce (api.seal), and record it."""
    created, nonce = await _create_sealed_job(ctx, spec, namespace, sdep_name, pool, need, profile)
    if created is None:
        return  # created already (its nonce is recorded by whoever created it), or the last one is going away
    await ctx.kube.patch("speculationprofiles", namespace, need.name, {"metadata": {"annotations": {
        JOB_UID_ANNOTATION: created.get("metadata", {}).get("uid", ""), seal.NONCE_ANNOTATION: nonce}}})
    # The phase is left as it is (Pending since the profile was created or restarted): the Job may already
    # have written Running or its result, and this patch must not undo that.
    await ctx.kube.patch("speculationprofiles", namespace, need.name,
                         {"status": {"jobName": created["metadata"]["name"], "reason": "JobCreated"}},
                         subresource="status")


def _job_nonce(profile: dict, job: dict) -> str | None:
    """The current Job's result nonce (the Job carries it in an annotation) when the profile does not record it
    yet, else None."""
    job_nonce = (((job.get("metadata") or {}).get("annotations")) or {}).get(seal.NONCE_ANNOTATION)
    recorded = ((((profile.get("metadata") or {}).get("annotations")) or {}).get(seal.NONCE_ANNOTATION) or "").split()
    return job_nonce if job_nonce and job_nonce not in recorded else None


async def _adopted(ctx: Context, namespace: str, need: Need, profile: dict, job: dict,
                   events: list[Event]) -> dict | None:
    """A Job of the profile's name whose nonce the profile does not record: the operator's own, created before it
    stopped (recorded next, by RecordJob), or not (api.seal.adoption_problem: a replayed nonce, a Job someone
    else made), which is refused, reported and deleted so the operator's own can be created. A Job already
    going away is neither."""
    meta = job.get("metadata") or {}
    if meta.get("deletionTimestamp"):
        return job
    full = await ctx.kube.get("jobs", namespace, meta.get("name", ""))  # the index keeps no pod template
    problem = seal.adoption_problem(ctx.result_key, namespace, profile, full)
    if problem is None:
        return job
    events.append(Event("Warning", "ForeignBenchmarkJob",
                        f"Job {meta.get('name')} is not {need.key} on {need.sku}'s benchmark Job: {problem}; it is "
                        f"deleted and the operator's own is created (only the operator creates benchmark Jobs)"))
    await ctx.kube.delete("jobs", namespace, meta.get("name", ""))
    return None


def _with_nonce(profile: dict, job: dict) -> dict:
    """The profile with its current Job's result nonce recorded (as `_record_job` leaves it)."""
    job_nonce = _job_nonce(profile, job)
    if job_nonce is None:
        return profile
    meta = profile.get("metadata") or {}
    return {**profile, "metadata": {**meta, "annotations": {**(meta.get("annotations") or {}),
                                                             seal.NONCE_ANNOTATION: job_nonce}}}


async def _record_job(ctx: Context, namespace: str, name: str, profile: dict, job: dict) -> None:
    """The profile records its current Job (the planner's RecordJob): after an operator that stopped, or an API
    server that went away, between creating the Job and recording it, the next reconciliation catches up with
    what was lost: the result nonce and the Job's uid (annotations), and status.jobName (alone: the phase the
    Job may have written since stays). A Job being deleted (the one a restart replaces) is not recorded."""
    if (job.get("metadata") or {}).get("deletionTimestamp"):
        return
    annotations = {}
    job_nonce = _job_nonce(profile, job)
    if job_nonce is not None:
        annotations[seal.NONCE_ANNOTATION] = job_nonce
    recorded = ((profile.get("metadata") or {}).get("annotations")) or {}
    uid = (job.get("metadata") or {}).get("uid")
    if uid and JOB_UID_ANNOTATION not in recorded:
        annotations[JOB_UID_ANNOTATION] = uid
    if annotations:
        await ctx.kube.patch("speculationprofiles", namespace, name, {"metadata": {"annotations": annotations}})
    job_name = (job.get("metadata") or {}).get("name")
    if job_name and (profile.get("status") or {}).get("jobName") != job_name:
        await ctx.kube.patch("speculationprofiles", namespace, name, {"status": {"jobName": job_name}},
                             subresource="status")


def _result_refusal(ctx: Context, namespace: str, profile: dict) -> tuple[str, str] | None:
    """Why a Succeeded result must not reach a decision: it was not written by the profile's own current
    benchmark Job (api.seal; anyone who may patch profiles' status in the namespace could have written it,
    and every deployment needing the profile would act on it), or no GPU can produce it. Checked once per
    resourceVersion."""
    meta = profile.get("metadata") or {}
    nonces = (meta.get("annotations") or {}).get(seal.NONCE_ANNOTATION, "")
    key = f"{namespace}/{meta.get('name')}@{meta.get('resourceVersion', '')}/{nonces}"
    if key not in ctx.verified:
        unsealed = seal.seal_problem(ctx.result_key, namespace, profile)
        implausible = "; ".join(checked_result_problems(profile, ctx.catalog)) if unsealed is None else ""
        ctx.verified[key] = ("UnsealedResult", unsealed) if unsealed else (
            ("ImplausibleResult", implausible) if implausible else None)
    return ctx.verified[key]


def _as_left_here(ctx: Context, namespace: str, profile: dict | None) -> dict | None:
    """The profile as this operator last left it. While the view is still a version it wrote over (the index
    lags the write), it reads as that write left it: Failed when it failed the profile from there, Pending
    with no current Job when it restarted it (`restart_profile`'s two patches: the view before them or the
    one between). Otherwise the view itself."""
    if profile is None:
        return None
    meta = profile.get("metadata") or {}
    version = meta.get("resourceVersion")
    left = ctx.profiles_written_over.get(f"{namespace}/{meta.get('name')}")
    if not version or left is None or version not in left[1]:
        return profile
    if left[0] == "Failed":
        status = profile.get("status") or {}
        annotations = {**(meta.get("annotations") or {}), VERDICT_ANNOTATION: verdict_annotation(
            "Failed", status.get("reason"), status.get("message"))}
        return {**profile, "metadata": {**meta, "annotations": annotations}, "status": {**status, "phase": "Failed"}}
    return _restarted(profile)


async def _fail_profile(ctx: Context, namespace: str, need: Need, profile: dict,
                        events: list[Event], status: dict, event_message: str) -> str:
    """Mark a profile Failed for good (with `status`'s reason and message): the operator's verdict first (the
    annotation), then the status that mirrors it; say so in a ProfilingFailed Warning Event and count it; returns
    the new phase. Remembers the versions it wrote over (_as_left_here)."""
    between = await ctx.kube.patch("speculationprofiles", namespace, need.name, {"metadata": {"annotations": {
        VERDICT_ANNOTATION: verdict_annotation("Failed", status.get("reason"), status.get("message"))}}})
    # The status carries the verdict's text exactly (the annotation bounds the message): a rewrite shows.
    status = {**status, "message": verdict_message(status.get("message"))}
    await ctx.kube.patch("speculationprofiles", namespace, need.name, {"status": {"phase": "Failed", **status}},
                         subresource="status")
    versions = tuple(v for v in ((profile.get("metadata") or {}).get("resourceVersion"),
                                 ((between or {}).get("metadata") or {}).get("resourceVersion")) if v)
    if versions:
        ctx.profiles_written_over[f"{namespace}/{need.name}"] = ("Failed", versions)
    events.append(Event("Warning", "ProfilingFailed", f"{need.key} on {need.sku}: {event_message}"))
    ctx.metrics.profiling_jobs.labels(namespace, "failed").inc()
    return "Failed"


async def _create_profile(ctx: Context, namespace: str, need: Need,
                          reprofile: str | None) -> dict:
    annotations = {seal.EPOCH_ANNOTATION: seal.new_epoch(), **({REPROFILE_ANNOTATION: reprofile} if reprofile else {})}
    obj = SpeculationProfile(metadata={
        "name": need.name, "namespace": namespace,
        "labels": {"app.kubernetes.io/managed-by": "specpilot", "specpilot.io/sku": names.label_value(need.sku),
                   "specpilot.io/method": names.label_value(need.key)},
        "annotations": annotations,
    }, spec=need.spec).dump()
    created, _ = await ctx.kube.ensure(obj)
    if not (created.get("status") or {}).get("phase"):
        await ctx.kube.patch("speculationprofiles", namespace, need.name,
                             {"status": {"phase": "Pending", "reason": "Created"}}, subresource="status")
        created = {**created, "status": {"phase": "Pending"}}
    return created


def _restarted(profile: dict, epoch: str | None = None) -> dict:
    """How a profile looks right after `_restart_profile` (which began measurement `epoch`): Pending, with no
    current Job and no verdict."""
    meta = dict(profile.get("metadata") or {})
    annotations = {**(meta.get("annotations") or {}), JOB_UID_ANNOTATION: ""}
    if epoch:
        annotations[seal.EPOCH_ANNOTATION] = epoch
    meta["annotations"] = {k: v for k, v in annotations.items() if k != VERDICT_ANNOTATION}
    return {**profile, "metadata": meta, "status": {"phase": "Pending"}}


async def restart_profile(ctx: Context, namespace: str, name: str, profile: dict, reprofile: str | None) -> str:
    """Measure again: drop the old Job and reset the status (the identity, hence the name, is unchanged); a new
    measurement epoch, so no Job of the old one (nor its nonce) is adopted again. Returns the epoch.
    Remembers the versions it wrote over (_as_left_here): a reconciliation that still sees the profile as it
    was, or as the first patch left it, does not restart it again (deleting the Job just created)."""
    await ctx.kube.delete("jobs", namespace, names.bench_job_name(name))
    epoch = seal.new_epoch()
    annotations: dict[str, str | None] = {JOB_UID_ANNOTATION: None, seal.NONCE_ANNOTATION: None,
                                          REFINE_LEVELS_ANNOTATION: None,
                                          VERDICT_ANNOTATION: None, seal.EPOCH_ANNOTATION: epoch}
    if reprofile:
        annotations[REPROFILE_ANNOTATION] = reprofile
    between = await ctx.kube.patch("speculationprofiles", namespace, name, {"metadata": {"annotations": annotations}})
    versions = tuple(v for v in ((profile.get("metadata") or {}).get("resourceVersion"),
                                 ((between or {}).get("metadata") or {}).get("resourceVersion")) if v)
    if versions:
        ctx.profiles_written_over[f"{namespace}/{name}"] = ("Restarted", versions)
    await ctx.kube.patch("speculationprofiles", namespace, name, {"status": {
        "phase": "Pending", "reason": "Reprofiling", "message": None, "attempts": 0, "runs": None,
        "completedAt": None, "seal": None, "benchFailure": None}}, subresource="status")
    return epoch




async def start_refinement(ctx: Context, spec: SpeculativeDeploymentSpec, namespace: str, sdep_name: str,
                           pool: GpuPool, need: Need, profile: dict, job: RefinementJob,
                           round_index: int, jobs: dict[str, dict]) -> None:
    """Create one refinement Job (policy.planner asked for it): it appends its points to the profile. Waits
    while another Job measures the same profile (its other part in this round, or a deployment sharing it
    that refines it too): appends to one profile go one Job at a time, and the new Job's nonce joins the one
    that sealed the current result, so both stay verifiable until it publishes."""
    label = names.label_value(need.name)
    for other in jobs.values():
        meta = other.get("metadata") or {}
        if meta.get("namespace", namespace) == namespace and (meta.get("labels") or {}).get(
                names.LABEL_PROFILE) == label and job_state(other) == "Active":
            return
    await _record_refine_levels(ctx, namespace, need.name, job.levels or need.spec.concurrency_levels)
    created, nonce = await _create_sealed_job(ctx, spec, namespace, sdep_name, pool, need, profile, RefineRun(
        round=round_index, levels=job.levels, ks=job.ks, repeat=job.repeat, append=True, part=job.part))
    if created is None:
        return  # created by an earlier reconciliation (or another deployment's), which recorded its nonce
    sealing = seal.sealing_nonce(ctx.result_key, namespace, profile)
    await ctx.kube.patch("speculationprofiles", namespace, need.name, {"metadata": {"annotations": {
        seal.NONCE_ANNOTATION: f"{sealing} {nonce}" if sealing else nonce}}})


async def _record_refine_levels(ctx: Context, namespace: str, name: str, levels: list[int]) -> None:
    """The round's levels join the profile's REFINE_LEVELS_ANNOTATION before its Job exists (the plausibility
    check accepts points at the spec's levels and these only). Read afresh: the parts of a round may start in
    one pass, each with the same view."""
    current = await ctx.kube.get("speculationprofiles", namespace, name)
    recorded = ((current.get("metadata") or {}).get("annotations") or {}).get(REFINE_LEVELS_ANNOTATION)
    merged = refine_levels_annotation(recorded, levels)
    if merged != recorded:
        await ctx.kube.patch("speculationprofiles", namespace, name,
                             {"metadata": {"annotations": {REFINE_LEVELS_ANNOTATION: merged}}})


async def _create_sealed_job(ctx: Context, spec: SpeculativeDeploymentSpec, namespace: str, sdep_name: str,
                             pool: GpuPool, need: Need, profile: dict,
                             refine: RefineRun | None = None) -> tuple[dict | None, str]:
    """Create a benchmark Job of the profile (`refine`: one Job of a refinement round) owned by
    it, with a fresh result nonce (api.seal) in its annotation and its token in the bench container: a token
    of an earlier Job, or another profile's, seals nothing here. Returns (the created Job, or None when one
    of that name exists; the nonce); the caller records the nonce in the profile only once the Job exists,
    so a reconciliation that lost the race to create it (another deployment sharing the profile) replaces
    nothing."""
    owner = {"apiVersion": "specpilot.io/v1alpha1", "kind": "SpeculationProfile", "name": need.name,
             "uid": (profile.get("metadata") or {}).get("uid", "")}
    if not owner["uid"]:
        fetched = await ctx.kube.get("speculationprofiles", namespace, need.name)
        owner["uid"] = fetched["metadata"].get("uid", "")
    epoch = ((profile.get("metadata") or {}).get("annotations") or {}).get(seal.EPOCH_ANNOTATION)
    if not epoch:  # a profile from before measurements had one: give it one before its Job exists
        epoch = seal.new_epoch()
        await ctx.kube.patch("speculationprofiles", namespace, need.name,
                             {"metadata": {"annotations": {seal.EPOCH_ANNOTATION: epoch}}})
    nonce = seal.new_nonce(epoch)
    job = benchmark_job(profile_name=need.name, namespace=namespace, profile_spec=need.spec, spec=spec, pool=pool,
                        bench_image=ctx.config.benchmark_image, owner=owner, sdep_name=sdep_name,
                        tenancy=ctx.config.tenancy,
                        result_token=seal.job_token(ctx.result_key, namespace, need.name, nonce), refine=refine)
    job["metadata"].setdefault("annotations", {})[seal.NONCE_ANNOTATION] = nonce
    try:
        created = await ctx.kube.create(job)
    except Conflict:
        return None, nonce
    ctx.metrics.profiling_jobs.labels(namespace, "created").inc()
    return created or job, nonce
