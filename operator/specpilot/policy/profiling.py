"""Profiling as a pure planner: from the profiles a deployment needs, the profiles and benchmark Jobs that exist
and the time, what to do next (create a profile, restart it, start its Job, wait, record a retry, mark it
Running, accept its result, mark it Failed with a reason) and the deployment's phase.

No kopf, no client, no clock: the controller (`controller.profiles`) reads the cluster into these inputs, calls
the planner and executes the actions (API writes, Events, counters); the simulator (`sim.mixed`) runs the same
planner over simulated Jobs, so a GPU type that joins a fleet spends its profiling time before it serves.

The profile's state machine, as the operator decides it (the benchmark Job writes only its sealed result):

- no profile: `CreateProfile` (it starts Pending);
- Succeeded and older than the max age (from its completion; any age with 0), or the deployment's reprofile
  annotation asks for a new measurement: `Restart` (Pending again, no Job); Failed and asked for: `Restart`;
  Failed because the Hugging Face Hub refused the model, and the deployment's spec changed since (a token set,
  the model id or revision mended): `Restart`;
- Pending or Running without a current Job: it waits for a Job slot; at most `max_parallel_jobs` Jobs run per
  pool at once, the oldest waiting first (`StartJob`);
- with its Job: the Job Failed (its backoff limit spent: Kubernetes retried it) -> `MarkFailed` with the Job's
  reason; Complete but no result within the grace (`result_grace_s`, the watch order) -> `MarkFailed`
  NoResult, and `Wait` until the grace ends before that; Active and started -> `MarkRunning`; Active after a
  failed attempt -> `RecordRetry` (the attempt count);
- the Job Failed, or Active after an attempt whose engine the Hugging Face Hub refused the model
  (`policy.model_access`: a gated model without a token, no such repository or revision) -> `MarkFailed` with
  ModelAccessDenied or ModelNotFound at once, and an Active Job deleted: every retry would be refused the same
  way until the spec or the token changes;
- Succeeded (a complete result): refused (unsealed or implausible; the caller checks) -> `MarkFailed`;
  otherwise `Accept` once (the operator's verdict).

The deployment's phase (`overall_phase`): Pending with nothing to profile, Profiling while measurements are
outstanding, Degraded once some failed for good, Serving when all are in.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta

from ..api.deployment_status import Phase
from ..api.methods import CandidateMethod
from ..api.profile import SpeculationProfileSpec
from .events import Event
from .model_access import MODEL_ACCESS_DENIED, MODEL_NOT_FOUND, HubRefusal, hub_refusal

__all__ = [
    "RESULT_GRACE_S",
    "RETRY_HINT",
    "Accept",
    "Action",
    "CreateProfile",
    "JobView",
    "MarkFailed",
    "MarkRunning",
    "Need",
    "ProfileView",
    "ProfilingInputs",
    "ProfilingPlan",
    "RecordJob",
    "RecordRetry",
    "Restart",
    "Rollup",
    "Round",
    "StartJob",
    "Wait",
    "follow",
    "is_fresh",
    "jobs_allowed",
    "overall_phase",
    "all_accepted",
    "plan_profiling",
    "renewal",
    "result_overdue",
    "rollup",
]

RESULT_GRACE_S = 60
"""How long after a benchmark Job completes its result may take to reach the profile (watch order)."""
HUB_REFUSALS = frozenset({MODEL_ACCESS_DENIED, MODEL_NOT_FOUND})
"""Failures a change of the spec can mend (the token, the model id or revision): measured again after one."""
REPROFILE_ANNOTATION = "specpilot.io/reprofile"
RETRY_HINT = f"set the annotation {REPROFILE_ANNOTATION} on the SpeculativeDeployment to retry"
"""How a profile that failed for good is measured again, as its message says."""

ACTIVE, COMPLETE, FAILED = "Active", "Complete", "Failed"
PENDING, RUNNING, SUCCEEDED = "Pending", "Running", "Succeeded"
MEASURING = (PENDING, RUNNING)


# --- inputs ---------------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Need:
    """A profile the deployment needs: its name (the measurement's identity), the pool asking for it, what it
    measures ("baseline" or the candidate's key) and on which GPU type; with the candidate and the profile's spec
    when the deployment's spec made it (`policy.needs.needed_profiles`)."""

    name: str
    pool: str
    key: str
    sku: str
    candidate: CandidateMethod | None = dataclasses.field(default=None, compare=False)
    spec: SpeculationProfileSpec | None = dataclasses.field(default=None, compare=False, repr=False)

    @classmethod
    def of(cls, pool: str, sku: str, candidate: CandidateMethod | None, spec: SpeculationProfileSpec) -> Need:
        """The need for the measurement `spec` (named by its identity) of `candidate` (None: the baseline)."""
        return cls(spec.object_name(), pool, candidate.key if candidate else "baseline", sku, candidate, spec)


@dataclasses.dataclass(frozen=True)
class JobView:
    """The profile's current benchmark Job as observed."""

    name: str
    state: str
    """Active, Complete or Failed (Kubernetes' conditions: Failed once its backoff limit is spent)."""
    active: int = 0
    """Pods running now."""
    failed: int = 0
    """Failed attempts so far (Kubernetes retries them up to the Job's backoff limit)."""
    completed_at: datetime | None = None
    failure: tuple[str, str] = ("JobFailed", "the benchmark Job failed")
    """(reason, message) of its Failed condition."""
    pods_said: str = ""
    """What its last pod's status says about the failure (`policy.job_failure.pod_account`; "" when nothing, or
    not read: the controller reads the pods only of a Job that failed for good)."""
    engine_text: str = ""
    """Its last pod's engine container's termination message as written (`policy.job_failure.engine_message`,
    read with `pods_said`): untrusted, read by `policy.model_access` and never quoted."""
    nonce_recorded: bool = True
    """The profile records the Job's result nonce (False: the operator stopped between creating the Job and
    recording it; the next reconciliation catches up)."""
    name_recorded: bool = True
    """The profile's status.jobName names this Job (False: the API server went away, or the operator stopped,
    between creating the Job and writing its name; the next reconciliation catches up)."""


@dataclasses.dataclass(frozen=True)
class ProfileView:
    """A profile as the operator reads it (its verdict wins over status; before one, a complete result is a
    Succeeded candidate, anything else Pending or Running)."""

    phase: str
    """Pending, Running, Succeeded or Failed."""
    verdict: bool = False
    """The operator has recorded its verdict (Succeeded or Failed) on it."""
    completed_at: datetime | None = None
    attempts: int = 0
    """status.attempts: the failed attempts of its Job already recorded."""
    reprofile_mark: str | None = None
    """The deployment reprofile annotation value it was last (re)measured for."""
    refusal: tuple[str, str] | None = None
    """Why a Succeeded result may not be used (reason, what is wrong): unsealed or implausible; the caller
    checks (it holds the result key and the GPU catalog)."""
    bench_said: str = ""
    """The benchmark's own account of a failure, quoted in messages ("" when none, or unsealed)."""
    bench_text: str = ""
    """That account's message as the bench wrote it, the engine's log lines in it ("" when none, or unsealed):
    untrusted, read by `policy.model_access` and never quoted."""
    failure_reason: str | None = None
    """The reason of the operator's Failed verdict (None: no such verdict)."""


@dataclasses.dataclass(frozen=True)
class ProfilingInputs:
    needed: Sequence[Need]
    """In the deployment's order (pools, then SKUs, baseline first); a name may repeat (pools sharing it)."""
    profiles: Mapping[str, ProfileView]
    """The needed profiles that exist, by name."""
    jobs: Mapping[str, JobView]
    """Each profile's current Job, by profile name."""
    now: datetime
    max_parallel_jobs: int = 1
    """Benchmark Jobs at once per pool."""
    max_age_hours: float = 168.0
    """A Succeeded profile older than this (from its completion) is measured again; 0: never."""
    reprofile: str | None = None
    """The deployment's reprofile annotation: a value a profile was not measured for asks for a new one."""
    spec_changed: bool = False
    """The deployment's spec changed since its last reconciliation (metadata.generation past
    status.observedGeneration): a profile the Hugging Face Hub refused is measured again, since the edit may be
    the token, the model id or the revision it lacked."""
    result_grace_s: float = RESULT_GRACE_S


def all_accepted(needed: Sequence[Need], now: datetime) -> ProfilingInputs:
    """The profiling inputs of a deployment whose every needed profile holds a result the operator accepted and
    keeps (never re-measured by age): the simulator's deployments, profiled before the trace starts."""
    return ProfilingInputs(needed=needed, profiles={n.name: ProfileView(SUCCEEDED, verdict=True) for n in needed},
                           jobs={}, now=now, max_age_hours=0)


# --- actions --------------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class CreateProfile:
    name: str
    reprofile: str | None

    def event(self, need: Need) -> Event:
        return Event("Normal", "Profiling", f"measuring {need.key} on {need.sku} ({need.name})")


@dataclasses.dataclass(frozen=True)
class Restart:
    """Measure again: drop the old Job, reset the status to Pending."""

    name: str
    reprofile: str | None
    why: str

    def event(self, need: Need) -> Event:
        return Event("Normal", "Reprofiling", f"re-measuring {need.name}: {self.why}")


@dataclasses.dataclass(frozen=True)
class StartJob:
    name: str
    pool: str


@dataclasses.dataclass(frozen=True)
class RecordJob:
    """Record the current Job on the profile where a write after its creation was lost: its result nonce
    (annotation) and its name (status.jobName), whichever is missing."""

    name: str


@dataclasses.dataclass(frozen=True)
class MarkRunning:
    name: str
    job_name: str


@dataclasses.dataclass(frozen=True)
class RecordRetry:
    name: str
    attempts: int


@dataclasses.dataclass(frozen=True)
class Wait:
    """Nothing to do before `until` (None: until the Job changes)."""

    name: str
    until: datetime | None
    why: str


@dataclasses.dataclass(frozen=True)
class Accept:
    """Record the verdict Succeeded on a complete, sealed and plausible result."""

    name: str


@dataclasses.dataclass(frozen=True)
class MarkFailed:
    """Fail the profile for good: `status` (reason, message, maybe attempts) goes to its status, `event_message`
    to the ProfilingFailed Event."""

    name: str
    reason: str
    message: str
    event_message: str
    attempts: int | None = None
    delete_job: str | None = None
    """The profile's Job, still retrying what cannot succeed: deleted (its pods with it)."""

    @property
    def status(self) -> dict:
        out: dict = {"reason": self.reason}
        if self.attempts is not None:
            out["attempts"] = self.attempts
        out["message"] = self.message
        return out


Action = CreateProfile | Restart | StartJob | RecordJob | MarkRunning | RecordRetry | Wait | Accept | MarkFailed


# --- rules ----------------------------------------------------------------------------------------------------

def is_fresh(phase: str, completed_at: datetime | None, max_age_hours: float, now: datetime) -> bool:
    """A Succeeded profile younger than the max age (measured from completion); any age when it is 0."""
    if phase != SUCCEEDED:
        return False
    if completed_at is None or max_age_hours == 0:
        return True
    return now - completed_at <= timedelta(hours=max_age_hours)


def result_overdue(completed_at: datetime | None, now: datetime, grace_s: float) -> bool:
    """A Job that completed more than `grace_s` ago without its profile holding a result (a Job with no
    completion time is never overdue). The bench exits 0 only after publishing, so a result normally arrives
    before (or with, by watch order) the Job's completion; the grace covers the watch order."""
    return completed_at is not None and (now - completed_at).total_seconds() > grace_s


def jobs_allowed(pending: Sequence, running: int, max_parallel: int) -> list:
    """Which waiting profiles may get a Job now, oldest-first order preserved."""
    return list(pending[: max(0, max_parallel - running)])


def overall_phase(profiles_ready: int, profiles_total: int, profiles_failed: int) -> Phase:
    """Pending: nothing to profile yet (no pool has a known GPU type); Profiling: measurements outstanding;
    Degraded: some measurements failed for good (those pools serve without them); Serving: all decided."""
    if profiles_total == 0:
        return Phase.PENDING
    if profiles_failed:
        return Phase.DEGRADED
    if profiles_ready < profiles_total:
        return Phase.PROFILING
    return Phase.SERVING


def renewal(need: Need, profile: ProfileView | None, reprofile: str | None, max_age_hours: float,
            now: datetime, spec_changed: bool = False) -> CreateProfile | Restart | None:
    """Whether the profile is to be created or measured again before anything else (None: as it is)."""
    if profile is None:
        return CreateProfile(need.name, reprofile)
    stale_request = reprofile is not None and profile.reprofile_mark != reprofile
    if profile.phase == SUCCEEDED and (stale_request or not is_fresh(profile.phase, profile.completed_at,
                                                                      max_age_hours, now)):
        return Restart(need.name, reprofile, "requested by annotation" if stale_request
                       else f"older than {max_age_hours:g} h")
    if profile.phase == FAILED and stale_request:
        return Restart(need.name, reprofile, "requested by annotation")
    if profile.phase == FAILED and spec_changed and profile.failure_reason in HUB_REFUSALS:
        return Restart(need.name, profile.reprofile_mark,
                       f"the spec changed since the Hugging Face Hub refused the model ({profile.failure_reason})")
    return None


def renewed(profile: ProfileView | None, action: CreateProfile | Restart | None) -> ProfileView | None:
    """The profile as it looks right after `action`: Pending, no verdict, no Job."""
    if action is None:
        return profile
    return ProfileView(PENDING, reprofile_mark=action.reprofile)


@dataclasses.dataclass(frozen=True)
class Step:
    """One profile's next step: the actions, its phase after them, and whether it waits for a Job slot or
    holds one (an Active Job)."""

    actions: tuple[Action, ...]
    phase: str
    waiting: bool = False
    running: bool = False


def follow(need: Need, profile: ProfileView, job: JobView | None, now: datetime,
           grace_s: float = RESULT_GRACE_S) -> Step:
    """The profile's state machine, from its phase and its current Job's state."""
    phase = profile.phase
    if phase in MEASURING and job is None:
        return Step((), phase, waiting=True)
    if phase in MEASURING:
        actions: list[Action] = [] if job.nonce_recorded and job.name_recorded else [RecordJob(need.name)]
        phase, more = _follow_job(need, profile, job, now, grace_s)
        actions.extend(more)
        return Step(tuple(actions), phase, running=phase in MEASURING and job.state == ACTIVE)
    if phase == SUCCEEDED and profile.refusal is not None:
        reason, shown = profile.refusal
        return Step((MarkFailed(need.name, reason, f"result refused: {shown}; {RETRY_HINT}", f"{reason}: {shown}"),),
                    FAILED)
    if phase == SUCCEEDED and not profile.verdict:
        return Step((Accept(need.name),), SUCCEEDED)
    return Step((), phase)


def _refused(need: Need, job: JobView, refused: HubRefusal, said: str) -> MarkFailed:
    """Fail the profile whose engine the Hub refused the model: the operator's words first (the Event's message
    is cut at 1 KiB), then the accounts it read them from, quoted."""
    pods = f"; {job.pods_said}" if job.pods_said else ""
    stop = "; not retried (its Job is deleted): " if job.state == ACTIVE else "; "
    stop += "each retry would be refused the same way until the spec or the token changes"
    return MarkFailed(need.name, refused.reason, f"{refused.message}{stop}{said}{pods}; a change of the spec "
                      f"measures it again (a fix outside the spec: {RETRY_HINT})",
                      f"{refused.reason}: {refused.message}{stop}{said}{pods}",
                      # an Active Job's failed attempt may not be counted in its status yet
                      attempts=max(job.failed, 1), delete_job=job.name if job.state == ACTIVE else None)


def _follow_job(need: Need, profile: ProfileView, job: JobView, now: datetime,
                grace_s: float) -> tuple[str, list[Action]]:
    said = profile.bench_said
    refused = hub_refusal((profile.bench_text, job.engine_text), need.spec) if job.state != COMPLETE else None
    if refused is not None:
        return FAILED, [_refused(need, job, refused, said)]
    if job.state == FAILED:
        reason, message = job.failure
        attempts = job.failed
        if reason == "DeadlineExceeded":
            message = f"{message} (spec.profiling.jobDeadlineSeconds)"
        pods = f"; {job.pods_said}" if job.pods_said else ""
        return FAILED, [MarkFailed(need.name, reason,
                                   f"{message} after {attempts} attempt(s){said}{pods}; {RETRY_HINT}",
                                   f"{reason}: {message} ({attempts} attempts){said}{pods}", attempts=attempts)]
    if job.state == COMPLETE:
        # The result is on its way (watch order); past the grace it never will come, and waiting longer would
        # hang the pool at Profiling.
        if not result_overdue(job.completed_at, now, grace_s):
            until = job.completed_at + timedelta(seconds=grace_s) if job.completed_at else None
            return RUNNING, [Wait(need.name, until, "the completed Job's result is on its way")]
        message = (f"the benchmark Job {job.name} completed but no result reached the profile within "
                   f"{grace_s:g} s{said}; see `kubectl logs job/{job.name}`, then {RETRY_HINT}")
        return FAILED, [MarkFailed(need.name, "NoResult", message, f"NoResult: {message}")]
    if profile.phase == PENDING and job.active > 0 and not job.failed:
        return RUNNING, [MarkRunning(need.name, job.name)]
    if job.failed and profile.attempts != job.failed:
        return profile.phase, [RecordRetry(need.name, job.failed)]
    return profile.phase, [Wait(need.name, None, "the benchmark Job is measuring")]


@dataclasses.dataclass(frozen=True)
class Rollup:
    """The deployment's profiles counted over what it needs (a profile two pools share counts twice)."""

    ready: int
    total: int
    failed: int

    @property
    def phase(self) -> Phase:
        return overall_phase(self.ready, self.total, self.failed)

    @property
    def progress(self) -> str:
        return f"profiles {self.ready}/{self.total}" + (f", {self.failed} failed" if self.failed else "")

    @property
    def profiled(self) -> tuple[bool, str]:
        """The Profiled condition's status and reason."""
        done = self.ready == self.total and self.total > 0
        return done, "AllProfilesReady" if done else ("ProfilesFailed" if self.failed else "Profiling")


def rollup(needed: Sequence[Need], states: Mapping[str, str], pool: str | None = None) -> Rollup:
    """Ready, total and failed profiles of the deployment (or of one pool)."""
    mine = [n for n in needed if pool is None or n.pool == pool]
    return Rollup(sum(1 for n in mine if states.get(n.name) == SUCCEEDED), len(mine),
                  sum(1 for n in mine if states.get(n.name) == FAILED))


@dataclasses.dataclass(frozen=True)
class ProfilingPlan:
    actions: tuple[Action, ...]
    """In the order to execute: per profile its renewal and its step, then the Jobs to start."""
    states: dict[str, str]
    """Profile name -> phase after the actions (a started Job's profile stays Pending)."""
    rollup: Rollup

    @property
    def phase(self) -> Phase:
        return self.rollup.phase

    def of(self, kind: type) -> list:
        return [a for a in self.actions if isinstance(a, kind)]

    @property
    def next_wake(self) -> datetime | None:
        """The earliest time a `Wait` ends (None: none waits on the clock)."""
        return min((a.until for a in self.actions if isinstance(a, Wait) and a.until is not None), default=None)


class Round:
    """One pass over a deployment's needed profiles: what each step left (its phase, whether it waits for a Job
    slot or holds one, per pool), and then which waiting profiles may start a Job. `plan_profiling` and the
    controller's executor (which runs each step's actions before the next profile's) both keep their pass in
    one, so the Job slots are counted one way."""

    def __init__(self) -> None:
        self.states: dict[str, str] = {}
        self._waiting: dict[str, list[Need]] = {}
        self._running: dict[str, int] = {}

    def done(self, need: Need) -> bool:
        """Already stepped (a profile two pools share is followed once)."""
        return need.name in self.states

    def add(self, need: Need, step: Step) -> None:
        if step.waiting:
            self._waiting.setdefault(need.pool, []).append(need)
        self._running[need.pool] = self._running.get(need.pool, 0) + step.running
        self.states[need.name] = step.phase

    def starts(self, max_parallel_jobs: int) -> list[StartJob]:
        """Per pool, the waiting profiles that may get a Job now (within the pool's free slots, oldest first)."""
        return [StartJob(need.name, pool) for pool, queue in self._waiting.items()
                for need in jobs_allowed(queue, self._running.get(pool, 0), max_parallel_jobs)]


def plan_profiling(inputs: ProfilingInputs) -> ProfilingPlan:
    """Every needed profile's next step, the Jobs that may start (per pool, within max_parallel_jobs, oldest
    first), and the roll-up. The controller runs the same steps (`renewal`, `follow`, a `Round`) one profile
    at a time, reading back what each write returned."""
    actions: list[Action] = []
    round_ = Round()
    for need in inputs.needed:
        if round_.done(need):
            continue
        stored = inputs.profiles.get(need.name)
        renew = renewal(need, stored, inputs.reprofile, inputs.max_age_hours, inputs.now, inputs.spec_changed)
        profile = renewed(stored, renew)
        if renew is not None:
            actions.append(renew)
        job = inputs.jobs.get(need.name) if renew is None else None
        step = follow(need, profile, job, inputs.now, inputs.result_grace_s)
        actions.extend(step.actions)
        round_.add(need, step)
    actions.extend(round_.starts(inputs.max_parallel_jobs))
    return ProfilingPlan(tuple(actions), round_.states, rollup(inputs.needed, round_.states))
