"""kopf handlers: thin. Each reads the object, calls `reconcile`, writes status and posts Events.

Indexes keep Nodes, SpeculationProfiles and specpilot's Jobs in memory from watch streams, so a
reconciliation reads no lists from the API server.
"""

from __future__ import annotations

import logging
import random
import time
from typing import Any

import kopf

from ..manifests.names import LABEL_PROFILE, label_value
from .reconcile import Context, reconcile

GROUP, VERSION = "specpilot.io", "v1alpha1"
SDEP = (GROUP, VERSION, "speculativedeployments")
SPROF = (GROUP, VERSION, "speculationprofiles")
RETRY_S = 10
"""Seconds before a failed reconciliation is retried (kopf's default is 60)."""
STOP_GRACE_S = 15
"""On shutdown, how long a timer that is mid-reconciliation may take to finish (kopf's default gives it a few
event-loop cycles, then leaves it orphaned and the process exits under it). Below the pod's 30 s grace."""
PERIODIC_ID = "periodic"
"""The timer that reconciles every deployment each reconcileIntervalSeconds (and observes its load)."""
PROFILE_WATCH_ID = "profiles-watch"
"""The timer that reconciles a deployment once one of its profiles or benchmark Jobs changed."""


def register(registry: kopf.OperatorRegistry, ctx: Context, *, peering: bool) -> None:
    """Attach every handler to `registry`; intervals come from the operator config."""
    kopf_objects = logging.getLogger("kopf.objects")
    if not any(isinstance(f, _QuietTimers) for f in kopf_objects.filters):  # once per process
        kopf_objects.addFilter(_QuietTimers())

    @kopf.on.startup(registry=registry)
    async def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
        # Our CRDs' status schema is structural: kopf's own bookkeeping must live in annotations.
        settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="specpilot.io")
        settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
            prefix="specpilot.io", key="last-handled-configuration")
        settings.persistence.finalizer = "specpilot.io/finalizer"
        settings.posting.level = logging.INFO
        settings.watching.server_timeout = 300
        settings.watching.client_timeout = 330
        settings.networking.request_timeout = 60
        # A timer caught mid-run by SIGTERM finishes it (a new run starts no more: see `stopped` below).
        settings.background.instant_exit_timeout = STOP_GRACE_S
        if peering:
            # Equal priorities make every peer pause: give each replica its own.
            settings.peering.priority = random.randint(1, 10_000)
        settings.peering.mandatory = peering

    @kopf.on.cleanup(registry=registry)
    async def close(**_: Any) -> None:
        # Sessions left open when the process exits are reported as "Unclosed connector".
        await ctx.close()

    @kopf.on.login(registry=registry)
    def login(**_: Any) -> kopf.ConnectionInfo:
        return ctx.connection.kopf_connection_info()

    @kopf.index("", "v1", "nodes", id="nodes_index", registry=registry)
    def nodes_index(body: kopf.Body, name: str, **_: Any) -> dict[str, dict]:
        return {name: {"metadata": {"name": name, "labels": dict(body.metadata.labels)},
                       "status": {"conditions": list(body.get("status", {}).get("conditions") or [])}}}

    @kopf.index(*SPROF, id="profiles_index", registry=registry)
    def profiles_index(body: kopf.Body, namespace: str, name: str, **_: Any) -> dict[str, dict]:
        _profile_moved(ctx, namespace, label_value(name))
        return {f"{namespace}/{name}": {"metadata": dict(body.metadata), "spec": dict(body.spec),
                                        "status": dict(body.get("status") or {})}}

    @kopf.index("batch", "v1", "jobs", labels={"app.kubernetes.io/managed-by": "specpilot"},
                id="jobs_index", registry=registry)
    def jobs_index(body: kopf.Body, namespace: str, name: str, **_: Any) -> dict[str, dict]:
        profile = body.metadata.labels.get(LABEL_PROFILE)
        if profile:
            _profile_moved(ctx, namespace, profile)
        return {f"{namespace}/{name}": {"metadata": dict(body.metadata), "status": dict(body.get("status") or {})}}

    async def run(body: kopf.Body, patch: kopf.Patch, logger: logging.Logger, nodes_index: kopf.Index,
                  profiles_index: kopf.Index, jobs_index: kopf.Index, observe: bool, memo: Context,
                  stopped: kopf.DaemonStopped | None = None) -> None:
        namespace = body.metadata.namespace
        started = time.perf_counter()
        async with ctx.lock(body.metadata.uid):
            if stopped is not None and stopped.is_set():
                return  # the operator is stopping: a timer that waited for the lock starts nothing new
            # Read under the lock, and as last computed here: a reconciliation that waited for the lock
            # starts from what the one before it decided, even before kopf has written that.
            raw = dict(body)
            view = ctx.latest(raw)
            memo.profiles_seen = profiles_fingerprint(ctx, view)
            try:
                result = await reconcile(
                    ctx, view,
                    nodes=[v for values in nodes_index.values() for v in values],
                    profiles={k.split("/", 1)[1]: next(iter(vs)) for k, vs in profiles_index.items()
                              if k.startswith(f"{namespace}/")},
                    jobs={k: next(iter(vs)) for k, vs in jobs_index.items()},
                    observe=observe)
            except Exception as exc:
                ctx.metrics.reconcile_errors.labels(namespace, type(exc).__name__).inc()
                raise
            finally:
                ctx.metrics.reconcile_seconds.labels(namespace).observe(time.perf_counter() - started)
            ctx.written[body.metadata.uid] = result.status
        patch.status.update(_nulls_for_removed({**(raw.get("status") or {}), **(view.get("status") or {})},
                                               result.status))
        for event in result.events:
            kopf.event(body, type=event.type, reason=event.reason, message=event.message)
            (logger.warning if event.type == "Warning" else logger.info)(f"{event.reason}: {event.message}")

    @kopf.on.resume(*SDEP, id="reconcile", backoff=RETRY_S, registry=registry)
    @kopf.on.create(*SDEP, id="reconcile", backoff=RETRY_S, registry=registry)
    @kopf.on.update(*SDEP, id="reconcile", backoff=RETRY_S, registry=registry)
    async def on_change(body: kopf.Body, patch: kopf.Patch, logger: logging.Logger, nodes_index: kopf.Index,
                        profiles_index: kopf.Index, jobs_index: kopf.Index, memo: Context, **_: Any) -> None:
        await run(body, patch, logger, nodes_index, profiles_index, jobs_index, observe=False, memo=memo)

    @kopf.on.delete(*SDEP, id="forget", optional=True, registry=registry)
    async def on_delete(body: kopf.Body, **_: Any) -> None:
        ctx.forget(body.metadata.uid)

    @kopf.timer(*SDEP, id=PERIODIC_ID, interval=ctx.config.reconcile_interval_seconds, sharp=False, backoff=RETRY_S,
                registry=registry)
    async def on_timer(body: kopf.Body, patch: kopf.Patch, logger: logging.Logger, nodes_index: kopf.Index,
                       profiles_index: kopf.Index, jobs_index: kopf.Index, memo: Context,
                       stopped: kopf.DaemonStopped, **_: Any) -> None:
        if stopped.is_set():
            return
        await run(body, patch, logger, nodes_index, profiles_index, jobs_index, observe=True, memo=memo,
                  stopped=stopped)

    @kopf.timer(*SDEP, id=PROFILE_WATCH_ID, interval=ctx.config.profile_watch_seconds, sharp=False,
                backoff=RETRY_S, registry=registry)
    async def on_profiles(body: kopf.Body, patch: kopf.Patch, logger: logging.Logger, nodes_index: kopf.Index,
                          profiles_index: kopf.Index, jobs_index: kopf.Index, memo: Context,
                          stopped: kopf.DaemonStopped, **_: Any) -> None:
        # in memory only: reconcile at once when a profile or its Job moved since the last reconciliation
        seen = memo.profiles_seen
        if not stopped.is_set() and seen is not None and seen != profiles_fingerprint(ctx, ctx.latest(dict(body))):
            await run(body, patch, logger, nodes_index, profiles_index, jobs_index, observe=False, memo=memo,
                      stopped=stopped)


def _profile_moved(ctx: Context, namespace: str, profile_label: str) -> None:
    """Count a watch event of a profile or of its benchmark Job (the index handlers see every one)."""
    key = f"{namespace}/{profile_label}"
    ctx.profile_events[key] = ctx.profile_events.get(key, 0) + 1


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
