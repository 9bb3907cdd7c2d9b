"""kopf handlers: thin. Each reads the object, calls `reconcile`, writes status and posts Events.

Indexes keep Nodes, SpeculationProfiles and specpilot's Jobs in memory from watch streams, so a
reconciliation reads no lists from the API server.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import hashlib
import json
import logging
import random
import time
import traceback
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import kopf
from pydantic import ValidationError

from ..api.base import Condition
from ..api.sanitize import bounded_status
from ..manifests.names import LABEL_MANAGED_BY, LABEL_PROFILE, MANAGED_BY, label_value
from ..policy.conditions import set_condition
from .kube import Refused, Unreachable, kopf_connection_info
from .profile_index import Packed, bounded, pack
from .reconcile import Context, reconcile

GROUP, VERSION = "specpilot.io", "v1alpha1"
SDEP = (GROUP, VERSION, "speculativedeployments")
SPROF = (GROUP, VERSION, "speculationprofiles")
RETRY_S = 10
"""Seconds before a failed reconciliation is retried (kopf's default is 60); doubled per failure in a row."""
RETRY_MAX_S = 60
"""The longest wait between retries of a reconciliation that keeps failing."""
RECONCILED = "Reconciled"
"""The condition that says whether the last reconciliation ran to its end and its status was written."""
DIFFBASE_INLINE_BYTES = 64 * 1024
"""kopf keeps the last handled spec, labels and annotations in an annotation; the API server refuses an
object whose annotations exceed 256 KiB in all, after which every write kopf makes to it fails. Beyond this
size only a digest of them is kept (the handlers read the object itself, never kopf's diff)."""
STOP_GRACE_S = 15
"""On shutdown, how long a timer that is mid-reconciliation may take to finish (kopf's default gives it a few
event-loop cycles, then leaves it orphaned and the process exits under it). Below the pod's 30 s grace."""
PERIODIC_ID = "periodic"
"""The timer that reconciles every deployment each reconcileIntervalSeconds (and observes its load)."""
PROFILE_WATCH_ID = "profiles-watch"
"""The timer that reconciles a deployment once one of its profiles or benchmark Jobs changed."""
MAX_CONCURRENT_RECONCILES = 16
"""Reconciliations that run at once (the others wait their turn). kopf starts every object's handlers and timers
together, so a burst (many deployments created, many profiles finishing) had a hundred and more reconciliations
in flight, each holding its deployment's spec, profiles (unpacked and validated) and plans while it waited on
the API server: the operator's live objects nearly double for the burst, and its RSS keeps that peak (CPython
hands an arena back only when every object in it is freed). 16 keep the API client's 32 connections and the
event loop busy without that peak; fewer slow a burst of creations (docs/operator.md has the measurements of
benchmarks/operator_scale.py)."""


class Slots:
    """MAX_CONCURRENT_RECONCILES reconciliation slots, handed first to the reconciliations of something that
    changed (a deployment created or edited, a profile result or Job that moved: `urgent`), then to the
    periodic ones, each in the order they asked. Under a backlog (many profiles finishing at once, hundreds of
    deployments created together) the periodic reconciliations of deployments where nothing changed no longer
    queue ahead of the ones that have news: with a thousand deployments the periodic timers alone ask for
    dozens of reconciliations a second."""

    def __init__(self, slots: int) -> None:
        self._free = slots
        self._waiting: tuple[collections.deque[asyncio.Future], collections.deque[asyncio.Future]] = (
            collections.deque(), collections.deque())

    async def acquire(self, urgent: bool) -> None:
        if self._free > 0 and not any(self._waiting):
            self._free -= 1
            return
        turn = asyncio.get_running_loop().create_future()
        queue = self._waiting[0 if urgent else 1]
        queue.append(turn)
        try:
            await turn
        except asyncio.CancelledError:
            if turn.done() and not turn.cancelled():
                self.release()  # handed a slot just as it was cancelled: pass it on
            elif turn in queue:  # (a release in between may have dropped it already)
                queue.remove(turn)
            raise

    def release(self) -> None:
        for queue in self._waiting:
            while queue:
                turn = queue.popleft()
                if not turn.done():
                    turn.set_result(None)
                    return
        self._free += 1


@contextlib.asynccontextmanager
async def _counted(metrics: Any, _queue: dict[str, int], lock: asyncio.Lock, slots: Slots, urgent: bool):
    """Hold the object's lock and a reconciliation slot, counted in specpilot_reconciles_waiting while waiting for
    them and in specpilot_reconciles_running while holding them: how far the operator is behind its timers.
    `_queue`: the registration's counts ("waiting", "running")."""
    _queue["waiting"] += 1
    metrics.reconciles_waiting.labels().set(_queue["waiting"])
    acquired = False
    try:
        # The slot first, then the object's lock: a periodic reconciliation waiting for a slot must not hold the
        # lock that an urgent one of the same deployment needs (it would wait behind every periodic one).
        await slots.acquire(urgent)
        try:
            async with lock:
                acquired = True
                _queue["waiting"] -= 1
                _queue["running"] += 1
                metrics.reconciles_waiting.labels().set(_queue["waiting"])
                metrics.reconciles_running.labels().set(_queue["running"])
                try:
                    yield
                finally:
                    _queue["running"] -= 1
                    metrics.reconciles_running.labels().set(_queue["running"])
        finally:
            slots.release()
    finally:
        if not acquired:
            _queue["waiting"] -= 1
            metrics.reconciles_waiting.labels().set(_queue["waiting"])


def phase_offset(uid: str, interval_s: float) -> float:
    """Where in its interval an object's timer ticks: a fixed point in [0, interval) drawn from its uid.

    Timers of objects created (or found at start-up) together otherwise tick together for ever (kopf starts
    each at once and sleeps the same interval after each run), so every reconcile interval began with a burst
    of all of them queueing for the API server and the event loop. Spread over the interval, the same work
    arrives at an even rate. The object's create/resume handler reconciles it at once, so the first periodic
    run loses nothing by coming later."""
    if interval_s <= 0:
        return 0.0
    fraction = int.from_bytes(hashlib.sha256(uid.encode()).digest()[:8], "big") / 2 ** 64
    return fraction * interval_s


def register(registry: kopf.OperatorRegistry, ctx: Context, *, peering: bool) -> None:
    """Attach every handler and index to `registry`; intervals come from the operator config."""
    kopf_objects = logging.getLogger("kopf.objects")
    if not any(isinstance(f, _QuietTimers) for f in kopf_objects.filters):  # once per process
        kopf_objects.addFilter(_QuietTimers())
    handlers, indexes = Handlers(ctx, peering=peering), Indexes(ctx)
    kopf.on.startup(registry=registry)(handlers.configure)
    kopf.on.cleanup(registry=registry)(handlers.close)
    kopf.on.login(registry=registry)(handlers.login)
    kopf.index("", "v1", "nodes", id="nodes_index", registry=registry)(indexes.nodes_index)
    kopf.index(*SDEP, id="sdep_profiles_index", registry=registry)(indexes.sdep_profiles_index)
    kopf.index(*SPROF, id="profiles_index", registry=registry)(indexes.profiles_index)
    kopf.index("apps", "v1", "deployments", labels={LABEL_MANAGED_BY: MANAGED_BY}, id="deployments_index",
               registry=registry)(indexes.deployments_index)
    kopf.index("batch", "v1", "jobs", labels={LABEL_MANAGED_BY: MANAGED_BY}, id="jobs_index",
               registry=registry)(indexes.jobs_index)
    for on in (kopf.on.update, kopf.on.create, kopf.on.resume):
        on(*SDEP, id="reconcile", backoff=RETRY_S, registry=registry)(handlers.on_change)
    kopf.on.delete(*SDEP, id="forget", optional=True, registry=registry)(handlers.on_delete)
    interval, watch = ctx.config.reconcile_interval_seconds, ctx.config.profile_watch_seconds
    kopf.timer(*SDEP, id=PERIODIC_ID, interval=interval, sharp=False, backoff=RETRY_S,
               initial_delay=_spread(interval), registry=registry)(handlers.on_timer)
    kopf.timer(*SDEP, id=PROFILE_WATCH_ID, interval=watch, sharp=False, backoff=RETRY_S,
               initial_delay=_spread(watch), when=profiles_in_flight, registry=registry)(handlers.on_profiles)


def _spread(interval_s: float):
    return lambda uid="", **_: phase_offset(uid, interval_s)


class Indexes:
    """The watch streams kept in memory (informers' caches): Nodes, which deployment uses which profiles,
    SpeculationProfiles (packed), specpilot's serving Deployments and Jobs. A reconciliation reads these, not
    lists from the API server."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx

    def nodes_index(self, body: kopf.Body, name: str, **_: Any) -> dict[str, dict]:
        return {name: {"metadata": {"name": name, "labels": dict(body.metadata.labels)},
                       "status": {"conditions": list(body.get("status", {}).get("conditions") or [])}}}

    def sdep_profiles_index(self, body: kopf.Body, uid: str, namespace: str, **_: Any) -> None:
        # Which deployments use which profiles (their status lists them), before any handler runs: live
        # evidence from one deployment never re-measures a profile another one shares.
        self.ctx.use_profiles(namespace, uid, profile_names(body))

    def profiles_index(self, body: kopf.Body, namespace: str, name: str, **_: Any) -> dict[str, Any]:
        _profile_moved(self.ctx, namespace, label_value(name))
        # packed (profile_index): a measured profile's status is ~45 KB as Python objects, ~3 KB packed
        return {f"{namespace}/{name}": pack({"metadata": _kept_metadata(body), "spec": dict(body.spec),
                                             "status": dict(body.get("status") or {})})}

    def deployments_index(self, body: kopf.Body, namespace: str, name: str, **_: Any) -> dict[str, Any]:
        # The serving Deployments as the watch shows them (an informer's cache): a reconciliation reads its
        # pools' Deployments here instead of a get each: with nothing changing, no request at all.
        return deployment_entry(body, namespace, name)

    def jobs_index(self, body: kopf.Body, namespace: str, name: str, **_: Any) -> dict[str, dict]:
        profile = body.metadata.labels.get(LABEL_PROFILE)
        if profile:
            _profile_moved(self.ctx, namespace, profile)
        status = body.get("status") or {}
        return {f"{namespace}/{name}": {"metadata": _kept_metadata(body),
                                        "status": {k: status[k] for k in JOB_STATUS_KEPT if k in status}}}


class Handlers:
    """The operator's kopf handlers over one Context: each reads the object, calls `reconcile`, writes status
    and posts Events; a failure is a condition, one Event per cause, and a retry with back-off."""

    def __init__(self, ctx: Context, *, peering: bool) -> None:
        self.ctx = ctx
        self.peering = peering
        self.reported: dict[str, str] = {}
        """Per object: the failure message last posted as an Event (one Event per distinct failure, not per
        retry; released when the object goes or reconciles)."""
        self.slots = Slots(MAX_CONCURRENT_RECONCILES)
        self.queue = {"waiting": 0, "running": 0}

    async def configure(self, settings: kopf.OperatorSettings, **_: Any) -> None:
        # Our CRDs' status schema is structural: kopf's own bookkeeping must live in annotations.
        settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="specpilot.io")
        settings.persistence.diffbase_storage = BoundedDiffBaseStorage(
            prefix="specpilot.io", key="last-handled-configuration")
        settings.persistence.finalizer = "specpilot.io/finalizer"
        settings.posting.level = logging.INFO
        # Only specpilot's Jobs and Deployments reach the operator: the API server filters the watches (the
        # indexes filter again, for API servers that ignore a selector), so a cluster's other Jobs and
        # Deployments cost it neither memory nor CPU.
        for resource in (("batch", "v1", "jobs"), ("apps", "v1", "deployments")):
            settings.watching.label_selectors[resource] = f"{LABEL_MANAGED_BY}={MANAGED_BY}"
        settings.watching.server_timeout = 300
        settings.watching.client_timeout = 330
        settings.networking.request_timeout = 60
        # A timer caught mid-run by SIGTERM finishes it (a new run starts no more: see `stopped` below).
        settings.background.instant_exit_timeout = STOP_GRACE_S
        if self.peering:
            # Equal priorities make every peer pause: give each replica its own.
            settings.peering.priority = random.randint(1, 10_000)
        settings.peering.mandatory = self.peering

    async def close(self, **_: Any) -> None:
        # Sessions left open when the process exits are reported as "Unclosed connector".
        await self.ctx.close()

    def login(self, **_: Any) -> kopf.ConnectionInfo:
        return kopf_connection_info(self.ctx.connection)

    async def run(self, body: kopf.Body, logger: logging.Logger, indexes: dict[str, kopf.Index], observe: bool,
                  retry: int = 0, stopped: kopf.DaemonStopped | None = None, periodic: bool = False) -> None:
        """One reconciliation under the object's lock and a slot; `periodic`: the reconcile interval's tick,
        which waits behind the reconciliations of a change."""
        ctx = self.ctx
        namespace, uid = body.metadata.namespace, body.metadata.uid
        started = time.perf_counter()
        async with _counted(ctx.metrics, self.queue, ctx.lock(uid), self.slots, urgent=not periodic):
            if stopped is not None and stopped.is_set():
                return  # the operator is stopping: a timer that waited for the lock starts nothing new
            # Read under the lock, and as last computed here: a reconciliation that waited for the lock
            # starts from what the one before it decided, even before the watch shows that.
            raw = dict(body)
            view = ctx.latest(raw)
            ctx.cache(uid).profiles_seen = profiles_fingerprint(ctx, view)
            try:
                result = await reconcile(
                    ctx, view, nodes=[v for values in indexes["nodes_index"].values() for v in values],
                    profiles=IndexView(indexes["profiles_index"], prefix=f"{namespace}/"),
                    jobs=IndexView(indexes["jobs_index"]), deployments=IndexView(indexes["deployments_index"]),
                    observe=observe, profile_users=ctx.users_of_profiles(namespace))
            except Exception as exc:
                ctx.metrics.reconcile_errors.labels(namespace, type(exc).__name__).inc()
                await self.fail(body, view, exc, logger, retry)
                raise AssertionError("unreachable")  # fail() raises
            finally:
                ctx.metrics.reconcile_seconds.labels(namespace).observe(time.perf_counter() - started)
            await self._write_status(body, raw, view, result.status, logger, retry)
            self.reported.pop(uid, None)
        for event in result.events:
            kopf.event(body, type=event.type, reason=event.reason, message=event.message)
            (logger.warning if event.type == "Warning" else logger.info)(f"{event.reason}: {event.message}")

    async def _write_status(self, body: kopf.Body, raw: dict, view: dict, computed: dict, logger: logging.Logger,
                            retry: int) -> None:
        """Write what changed of the computed status (with Reconciled=True), bounded."""
        ctx, uid = self.ctx, body.metadata.uid
        status = with_condition(computed, RECONCILED, True, "Reconciled", "the last reconciliation ran to its end",
                                body.metadata.get("generation"))
        status, cut = bounded_status(status)
        if cut:
            logger.warning(f"status sanitised before writing: {cut}")
        old = {**(raw.get("status") or {}), **(view.get("status") or {})}
        try:
            # Written here rather than through kopf's `patch`: kopf applies a timer's patch after the handler
            # returns (daemons._timer -> application.patch_and_check), outside any handler error handling, so
            # a refused patch (422 for NaN, 413 for size) escapes the timer task, whose runner then marks the
            # timer `forever_stopped` for that object until the operator restarts. Here a refusal is a
            # handler error: reported, and retried with back-off like any other.
            # Only what changed: an unchanged status is not written (no request, no watch event that
            # every watcher of the object then processes).
            changes = {k: v for k, v in _nulls_for_removed(old, status).items() if old.get(k) != v}
            if changes:
                await ctx.kube.patch(SDEP[2], body.metadata.namespace, body.metadata.name, {"status": changes},
                                     subresource="status")
        except Exception as exc:
            ctx.written.pop(uid, None)
            ctx.metrics.reconcile_errors.labels(body.metadata.namespace, type(exc).__name__).inc()
            await self.fail(body, view, exc, logger, retry)
        ctx.remember_written(uid, status, raw.get("status"))

    async def fail(self, body: kopf.Body, view: dict, exc: Exception, logger: logging.Logger, retry: int) -> None:
        """Report a failed reconciliation (condition Reconciled=False, one Warning Event per distinct cause),
        then raise kopf.TemporaryError so kopf retries it with back-off: the object is never dropped."""
        ctx, uid = self.ctx, body.metadata.uid
        reason, message = explain_failure(exc)
        delay = retry_delay(retry)
        logger.error(f"{reason}: {message} (retrying in {delay} s)",
                     exc_info=not isinstance(exc, (Refused, kopf.TemporaryError)))
        old = (view.get("status") or {})
        already = any(c.get("type") == RECONCILED and c.get("status") == "False" and c.get("message") == message
                      for c in old.get("conditions") or [])
        status = with_condition({"conditions": old.get("conditions") or []}, RECONCILED, False, reason, message,
                                body.metadata.get("generation"))
        if not old.get("phase"):
            status["phase"] = "Pending"
        try:
            status, _ = bounded_status(status)
            await ctx.kube.patch(SDEP[2], body.metadata.namespace, body.metadata.name, {"status": status},
                                 subresource="status")
            if uid in ctx.written:
                ctx.written[uid] = {**ctx.written[uid], **status}
        except Exception as write_error:  # the status itself is refused: the Event and the log still say it
            logger.error(f"could not write the {RECONCILED} condition: {explain_failure(write_error)[1]}")
        if self.reported.get(uid) != message and not already:
            self.reported[uid] = message
            kopf.event(body, type="Warning", reason=reason, message=message)
        raise kopf.TemporaryError(f"{reason}: {message}", delay=delay)

    async def on_change(self, body: kopf.Body, logger: logging.Logger, nodes_index: kopf.Index,
                        profiles_index: kopf.Index, jobs_index: kopf.Index, deployments_index: kopf.Index,
                        retry: int, **_: Any) -> None:
        await self.run(body, logger, _indexes(nodes_index, profiles_index, jobs_index, deployments_index),
                       observe=False, retry=retry)

    async def on_delete(self, body: kopf.Body, **_: Any) -> None:
        self.ctx.forget(body.metadata.uid)
        self.ctx.metrics.forget_deployment(body.metadata.namespace, body.metadata.name)
        self.reported.pop(body.metadata.uid, None)

    async def on_timer(self, body: kopf.Body, logger: logging.Logger, nodes_index: kopf.Index,
                       profiles_index: kopf.Index, jobs_index: kopf.Index, deployments_index: kopf.Index,
                       stopped: kopf.DaemonStopped, retry: int, **_: Any) -> None:
        if stopped.is_set():
            return
        await self.run(body, logger, _indexes(nodes_index, profiles_index, jobs_index, deployments_index),
                       observe=True, retry=retry, stopped=stopped, periodic=True)

    async def on_profiles(self, body: kopf.Body, logger: logging.Logger, nodes_index: kopf.Index,
                          profiles_index: kopf.Index, jobs_index: kopf.Index, deployments_index: kopf.Index,
                          stopped: kopf.DaemonStopped, **_: Any) -> None:
        # in memory only: reconcile at once when a profile or its Job moved since the last reconciliation
        seen = self.ctx.cache(body.metadata.uid).profiles_seen
        if not stopped.is_set() and seen is not None and \
                seen != profiles_fingerprint(self.ctx, self.ctx.latest(dict(body))):
            await self.run(body, logger, _indexes(nodes_index, profiles_index, jobs_index, deployments_index),
                           observe=False, stopped=stopped)


def _indexes(nodes: kopf.Index, profiles: kopf.Index, jobs: kopf.Index, deployments: kopf.Index
             ) -> dict[str, kopf.Index]:
    return {"nodes_index": nodes, "profiles_index": profiles, "jobs_index": jobs, "deployments_index": deployments}


METADATA_KEPT = ("name", "namespace", "uid", "resourceVersion", "generation", "creationTimestamp", "labels",
                 "annotations", "ownerReferences")
"""What the indexes keep of an object's metadata (not managedFields, finalizers or kopf's own annotations'
history: at a few hundred profiles and Jobs those made up much of the operator's memory)."""
JOB_STATUS_KEPT = ("conditions", "failed", "succeeded", "active", "ready", "startTime", "completionTime")
"""What the Jobs index keeps of a Job's status."""


def deployment_entry(body: Any, namespace: str, name: str) -> dict[str, Any]:
    """The Deployments index's entry for one Deployment: only one a SpeculativeDeployment owns (anyone who may
    create Deployments can set the label; the owner is what the operator made), without annotations (the
    operator sets none on a Deployment, and a tenant's would only take memory), packed as profiles are (about
    1.5 KB; a reconciliation unpacks the one or two it reads), and NOT_INDEXED past MAX_ENTRY_BYTES (the
    reconciliation then reads it from the API server)."""
    owners = (body.get("metadata") or {}).get("ownerReferences") or []
    if not any(isinstance(o, Mapping) and o.get("kind") == "SpeculativeDeployment"
               and str(o.get("apiVersion", "")).startswith(f"{GROUP}/") for o in owners):
        return {}
    metadata = _kept_metadata(body)
    metadata.pop("annotations", None)
    return {f"{namespace}/{name}": bounded({"apiVersion": body.get("apiVersion"), "kind": body.get("kind"),
                                            "metadata": metadata, "spec": dict(body.get("spec") or {}),
                                            "status": dict(body.get("status") or {})})}


def _kept_metadata(body: Any) -> dict:
    meta = body.get("metadata") or {}
    kept = {k: meta[k] for k in METADATA_KEPT if k in meta}
    if "annotations" in kept:  # kopf's last-handled copy and progress records are not the operator's to read
        kept["annotations"] = {k: v for k, v in kept["annotations"].items() if not k.startswith("kopf.")
                               and "last-handled-configuration" not in k}
    return kept


class IndexView(Mapping):
    """A kopf index read as a mapping of one object per key, looked up on demand: a reconciliation reads the
    few profiles and Jobs it needs instead of copying every entry of the cluster's indexes (O(1) per lookup;
    iterating, which nothing on the hot path does, walks the index). `prefix` scopes it (and is left out of
    its keys): "namespace/" for the namespace's profiles by name. A packed entry (profile_index) is unpacked
    on its first lookup through the view, and that copy is what the view answers after: a view lives for one
    reconciliation, so each reads one copy of each profile it needs, and the index keeps only the packed one."""

    def __init__(self, index: kopf.Index, prefix: str = "") -> None:
        self._index, self._prefix = index, prefix
        self._unpacked: dict[str, tuple[Packed, dict]] = {}

    def __getitem__(self, key: str) -> dict:
        try:
            values = self._index[self._prefix + key]
        except KeyError:
            raise KeyError(key) from None
        for value in values:
            if not isinstance(value, Packed):
                return value
            seen = self._unpacked.get(key)
            if seen is None or seen[0] is not value:  # first lookup, or the index took a newer version since
                seen = self._unpacked[key] = (value, value.unpack())
            return seen[1]
        raise KeyError(key)

    def __iter__(self):
        return (k[len(self._prefix):] for k in list(self._index) if k.startswith(self._prefix))

    def __len__(self) -> int:
        return sum(1 for _ in self)


def _profile_moved(ctx: Context, namespace: str, profile_label: str) -> None:
    """Count a watch event of a profile or of its benchmark Job (the index handlers see every one)."""
    key = f"{namespace}/{profile_label}"
    ctx.profile_events[key] = ctx.profile_events.get(key, 0) + 1


def profile_names(body: Any) -> frozenset[str]:
    """The profiles a deployment's status lists."""
    return frozenset(name for pool in (body.get("status") or {}).get("pools") or []
                     for name in ((pool.get("profiles") or {}).get("names") or []))


def profiles_in_flight(body: Any, **_: Any) -> bool:
    """Whether the deployment waits on profiles or refinement Jobs: only then does the profile watch run (kopf
    starts the timer when this turns true at a watch event of the deployment, and stops it when it turns false).
    A Serving deployment whose profiles are all in (or failed for good) and whose refinement is not measuring
    gets nothing sooner from a profile event than from its periodic reconciliation, which sees a profile
    restarted under it (by a drift re-measure or a shared profile's other user) within reconcileIntervalSeconds
    and then lists it as pending, which starts the watch again. Kept on for every deployment, the watch would be
    a kopf timer run per deployment every profileWatchSeconds and a task held for each."""
    status = body.get("status")
    if not isinstance(status, Mapping) or status.get("phase") != "Serving":
        return True
    pools = status.get("pools") or []
    if not isinstance(pools, list):
        return True
    for pool in pools:
        if not isinstance(pool, Mapping):
            return True  # not the operator's own writing: watch, and let the reconciliation judge it
        progress, refinement = pool.get("profiles"), pool.get("refinement")
        if not isinstance(progress, Mapping) or not isinstance(refinement, Mapping | None):
            return True
        counts = [progress.get(k) or 0 for k in ("ready", "failed", "total")]
        if not all(isinstance(c, int | float) for c in counts) or counts[0] + counts[1] < counts[2]:
            return True
        if (refinement or {}).get("state") == "Measuring":
            return True
    return False


def profiles_fingerprint(ctx: Context, body: Any) -> tuple[int, ...]:
    """How many watch events the deployment's profiles and their benchmark Jobs have had: it changes when
    one finished, failed or took a run, and a reconciliation then has something to act on. O(its profiles)."""
    namespace = (body.get("metadata") or {}).get("namespace")
    names = sorted({name for pool in (body.get("status") or {}).get("pools") or []
                    for name in ((pool.get("profiles") or {}).get("names") or [])})
    return tuple(ctx.profile_events.get(f"{namespace}/{label_value(name)}", 0) for name in names)


class _QuietTimers(logging.Filter):
    """kopf logs every successful timer run at INFO: a line per deployment every reconcileIntervalSeconds,
    and every profileWatchSeconds from the profile watch, which mostly finds nothing. Those lines are
    dropped; what a run changes still logs (Events, patches at debug), and failures are kept."""

    QUIET = tuple(f"Timer '{timer}' succeeded" for timer in (PERIODIC_ID, PROFILE_WATCH_ID))

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(self.QUIET)


def _nulls_for_removed(old: dict, new: dict) -> dict:
    """A merge patch keeps keys it does not mention: send null for top-level status keys that went away."""
    return {**{k: None for k in old if k not in new}, **new}


def retry_delay(retry: int) -> int:
    """Seconds before the next attempt after `retry` failures in a row: RETRY_S, doubled, at most RETRY_MAX_S."""
    return min(RETRY_MAX_S, RETRY_S * 2 ** max(0, min(retry, 6)))


def explain_failure(exc: BaseException) -> tuple[str, str]:
    """(reason, message) for a failed reconciliation: the cause in the operator's own words and the fix where
    one is known. Stable across retries of the same cause (no times or counts), so one Event per cause.
    Nothing an untrusted endpoint sent is echoed: an unexpected exception is named by its type and place."""
    retrying = f"the operator retries with back-off ({RETRY_S}-{RETRY_MAX_S} s)"
    if isinstance(exc, Refused):
        what = f"{exc.method} of {exc.target}"
        if exc.status == 413:
            return "WriteRefused", (f"the API server refused {what}: HTTP 413, the request body is too large: "
                                    f"shorten the spec's lists and free-form fields; {retrying}")
        if exc.status == 422:
            return "WriteRefused", (f"the API server refused {what}: HTTP 422 ({exc.detail}): the body was "
                                    f"refused as invalid; check the field it names (a schema bound, or an admission "
                                    f"policy or webhook of the cluster); {retrying}")
        if exc.status in (401, 403):
            return "Forbidden", (f"the API server refused {what}: HTTP {exc.status} ({exc.detail}): the operator's "
                                 f"ServiceAccount lacks this permission; install the chart of the same version as "
                                 f"the operator image; {retrying}")
        return "WriteRefused", f"the API server refused {what}: HTTP {exc.status} ({exc.detail}); {retrying}"
    if isinstance(exc, Unreachable) or (isinstance(exc, kopf.TemporaryError) and "API server" in str(exc)):
        return "ApiServerUnavailable", f"{str(exc)[:300]}; {retrying}"
    if isinstance(exc, ValidationError):
        return "ReconcileError", (f"a stored object did not validate ({exc.error_count()} error(s), first at "
                                  f"{'.'.join(str(p) for p in exc.errors()[0]['loc'])}): {retrying}")
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if "specpilot" in f.filename]
    where = ""
    if frames:
        frame = frames[-1]
        module = frame.filename.replace("\\", "/").rsplit("specpilot/", 1)[-1].removesuffix(".py").replace("/", ".")
        where = f" in {module}.{frame.name} (line {frame.lineno})"
    return "ReconcileError", (f"the reconciliation failed with {type(exc).__name__}{where}: an input specpilot "
                              f"does not handle, or a bug; the operator log has the traceback; {retrying}")


def with_condition(status: dict, type_: str, ok: bool, reason: str, message: str, generation: int | None) -> dict:
    """`status` (a dict as written) with one condition set; lastTransitionTime moves only when it flips."""
    conditions = []
    for raw in status.get("conditions") or []:
        try:
            conditions.append(Condition.model_validate(raw))
        except ValidationError:
            continue  # a condition this version cannot read is dropped rather than failing the write
    now = datetime.now(tz=UTC).replace(microsecond=0)
    conditions = set_condition(conditions, type_, ok, reason, message, generation, now)
    return {**status, "conditions": [c.dump() for c in conditions]}


class BoundedDiffBaseStorage(kopf.AnnotationsDiffBaseStorage):
    """kopf's last-handled-configuration annotation, but never larger than DIFFBASE_INLINE_BYTES: a larger
    essence (a spec near the operator's size cap, big labels or annotations) is kept as its digest, so kopf
    still sees when it changed and the annotation cannot push the object past the API server's limits."""

    def build(self, *, body: Any, extra_fields: Any = None) -> Any:
        essence = super().build(body=body, extra_fields=extra_fields)
        encoded = json.dumps(essence, separators=(",", ":"), sort_keys=True)
        if len(encoded) <= DIFFBASE_INLINE_BYTES:
            return essence
        return {"digest": "sha256:" + hashlib.sha256(encoded.encode()).hexdigest(), "bytes": len(encoded)}
