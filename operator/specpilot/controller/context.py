"""What the operator process keeps between reconciliations: clients, config, and caches.

Decision state never lives here: it is in each resource's status (see `policy.planner`), so a restart or a
new leader continues exactly. What is kept here is a cache that can be dropped at any moment (the worst a
dropped entry costs is one observation window without rates, or one extra API read), kept per object where
it belongs to one, and released when the object goes (`forget`). Process-wide caches are bounded.
"""

from __future__ import annotations

import asyncio
import secrets
import threading
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field

from ..config import OperatorConfig
from ..observe.pods import PodScrapeSource
from ..observe.prometheus import PrometheusSource
from ..perf.catalog import DEFAULT_CATALOG, GpuCatalog
from .kube import Connection, Kube
from .metrics import OperatorMetrics

MAX_PROMETHEUS_SOURCES = 64
"""Bound on open Prometheus clients (one per URL and window); the least recently used is closed first."""
MAX_REMEMBERED = 10_000
"""Bound on each process-wide memory of names and uids (ReplicaSet owners, counted Jobs, profile events)."""


@dataclass
class ObjectCache:
    """What is kept for one SpeculativeDeployment (by uid) between its reconciliations."""

    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    profiles_seen: tuple | None = None
    """The fingerprint of its profiles and benchmark Jobs its last reconciliation saw
    (handlers.profiles_fingerprint)."""
    last_observed_at: dict[str, float] = field(default_factory=dict)
    """Pool -> when its pods were last observed (monotonic seconds): observations every interval only."""
    last_cut: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """Pool -> what the read bounds left out of its last observation (read once per reconcile)."""
    pod_sources: dict[str, PodScrapeSource] = field(default_factory=dict)
    """Pool -> its pod scraper (holds the counter samples rates are computed from)."""


class Bounded(OrderedDict):
    """A dict that forgets its oldest entries beyond `limit`."""

    def __init__(self, limit: int = MAX_REMEMBERED) -> None:
        super().__init__()
        self.limit = limit

    def __setitem__(self, key, value) -> None:
        super().__setitem__(key, value)
        self.move_to_end(key)
        while len(self) > self.limit:
            self.popitem(last=False)


@dataclass
class Context:
    """Process-wide state shared by the handlers (the kopf memo; kopf hands each object a shallow copy,
    so nothing per object is kept in a field of its own: it is in `objects`, by uid)."""

    kube: Kube
    config: OperatorConfig
    metrics: OperatorMetrics
    connection: Connection
    catalog: GpuCatalog = DEFAULT_CATALOG
    result_key: bytes = field(default_factory=lambda: secrets.token_bytes(32), repr=False)
    """The key benchmark Jobs' result tokens derive from (api.seal): from the operator's Secret; a process
    without one draws its own, and results sealed before a restart are then measured again."""
    objects: dict[str, ObjectCache] = field(default_factory=dict)
    written: dict[str, dict] = field(default_factory=dict)
    """Uid -> the status its last reconciliation computed. The watch shows it only later, so the next
    reconciliation (a timer may already wait on the lock) starts from this, not from a body that predates
    it: otherwise it would re-announce the same decision change and append it to history again. Once the body
    shows the same status, this is the body's own object (`remember_written`), not a second copy."""
    prometheus_sources: OrderedDict[tuple[str, int, int], PrometheusSource] = field(default_factory=OrderedDict)
    replicaset_owners: Bounded = field(default_factory=Bounded)
    """ReplicaSet uid -> uid of the Deployment that controls it ("" for none): which pods are the operator's
    own to scrape (a pod that merely carries the labels is not)."""
    bench_identity_checked: Bounded = field(default_factory=Bounded)
    """Namespace -> when its benchmark identity was last ensured (monotonic seconds)."""
    verified: Bounded = field(default_factory=Bounded)
    """"namespace/profile@resourceVersion/nonces" -> (reason, why) its result is refused, or None when its seal
    and physical bounds hold."""
    counted_jobs: Bounded = field(default_factory=Bounded)
    """Uids of benchmark Jobs already counted as succeeded in the metrics."""
    profiles_written_over: Bounded = field(default_factory=Bounded)
    """"namespace/profile" -> ("Failed" or "Restarted", the resourceVersions this operator wrote over): until
    the index shows the write, a reconciliation that still sees one of those versions sees the profile as the
    write left it (and does not fail it again, posting ProfilingFailed and counting it twice, nor restart it
    again, deleting the Job it has just created and posting a second Reprofiling)."""
    pod_checks: Bounded = field(default_factory=Bounded)
    """Benchmark Job uid -> (when its pods were last read while none was ready (monotonic seconds), why its pod
    could not start then ("" when nothing stopped it), the last such cause): the pods are read at most every
    `profiles.POD_CHECK_S`, and the last cause is quoted when the Job fails after the Job controller deleted
    its pods (past its deadline)."""
    served_resources: dict[str, tuple[float, bool]] = field(default_factory=dict)
    """Plural of an optional resource (httproutes, inferencepools) -> (when it was last checked, monotonic seconds;
    whether the cluster serves it): its CRD is checked once a while for every deployment, not by each."""
    profile_events: Bounded = field(default_factory=lambda: Bounded(10 * MAX_REMEMBERED))
    """"namespace/profile" -> watch events of the profile and its benchmark Jobs seen by the index handlers."""

    profile_users: dict[str, dict[str, set[str]]] = field(default_factory=dict)
    """Namespace -> profile name -> uids of the deployments whose status lists it (kept by an index handler,
    which runs in a worker thread, under `_users_lock`; released on delete). Profiles are shared within a
    namespace. Kept inverted, so a reconciliation looks up its few profiles instead of walking every
    deployment of the namespace (which made each reconciliation's cost grow with the namespace's size)."""
    profiles_used: dict[str, tuple[str, frozenset[str]]] = field(default_factory=dict)
    """Deployment uid -> (namespace, the profiles its status lists): what `use_profiles` last recorded."""
    _users_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    closing: set[asyncio.Task] = field(default_factory=set)
    """Closes of evicted Prometheus clients still running (held so they are not collected half-way)."""

    def use_profiles(self, namespace: str, uid: str, names: frozenset[str]) -> None:
        with self._users_lock:
            self._drop_user(uid)
            self.profiles_used[uid] = (namespace, names)
            users = self.profile_users.setdefault(namespace, {})
            for name in names:
                users.setdefault(name, set()).add(uid)

    def _drop_user(self, uid: str) -> None:
        namespace, names = self.profiles_used.pop(uid, ("", frozenset()))
        users = self.profile_users.get(namespace, {})
        for name in names:
            uids = users.get(name)
            if uids is not None:
                uids.discard(uid)
                if not uids:
                    del users[name]
        if namespace in self.profile_users and not users:
            del self.profile_users[namespace]

    def users_of_profiles(self, namespace: str) -> ProfileUsers:
        """Profile name -> uids of the deployments in `namespace` whose status lists it (looked up per name)."""
        return ProfileUsers(self, namespace)

    def cache(self, uid: str) -> ObjectCache:
        return self.objects.setdefault(uid, ObjectCache())

    def lock(self, uid: str) -> asyncio.Lock:
        return self.cache(uid).lock

    def __copy__(self) -> Context:
        """The context itself: kopf gives every object it watches (deployments, profiles, Jobs, nodes) a shallow
        copy of the memo, kept for the object's life, and the handlers keep nothing per object in it (see the
        class docstring): a copy per object would be memory for nothing."""
        return self

    def remember_written(self, uid: str, status: dict, seen: object) -> None:
        """Record `status` as `uid`'s last computed status. When the body's status (`seen`) already is the same
        JSON, that object is kept instead: kopf holds it anyway, so each deployment's status is not held twice.
        Same JSON types and values, so `latest` answers exactly as before."""
        self.written[uid] = seen if same_json(status, seen) else status  # type: ignore[assignment]

    def latest(self, body: dict) -> dict:
        """The object as its next reconciliation must see it: its status as last computed here (when this
        process computed one), which the body may not show yet."""
        written = self.written.get((body.get("metadata") or {}).get("uid", ""))
        return body if written is None else {**body, "status": written}

    def prometheus_source(self, url: str, window_s: int, stale_after_s: int, make) -> PrometheusSource:
        """The client for (url, window); at most MAX_PROMETHEUS_SOURCES stay open."""
        key = (url, window_s, stale_after_s)
        source = self.prometheus_sources.get(key)
        if source is None:
            source = self.prometheus_sources[key] = make()
            while len(self.prometheus_sources) > MAX_PROMETHEUS_SOURCES:
                _, evicted = self.prometheus_sources.popitem(last=False)
                task = asyncio.get_running_loop().create_task(evicted.close())
                self.closing.add(task)
                task.add_done_callback(self.closing.discard)
        self.prometheus_sources.move_to_end(key)
        return source

    async def close(self) -> None:
        """Release what the context holds open: Prometheus HTTP sessions, the API client's pool."""
        for source in list(self.prometheus_sources.values()):
            await source.close()
        self.prometheus_sources.clear()
        await self.kube.close()

    def forget(self, uid: str) -> None:
        """Drop everything kept for an object once it is deleted."""
        self.objects.pop(uid, None)
        self.written.pop(uid, None)
        with self._users_lock:
            self._drop_user(uid)


def same_json(a: object, b: object) -> bool:
    """Whether `a` and `b` are the same JSON document, types included (1 and 1.0, True and 1, a tuple and a
    list are different here, though == says otherwise for the first two)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same_json(v, b[k]) for k, v in a.items())  # type: ignore[union-attr,index]
    if isinstance(a, list):
        return len(a) == len(b) and all(same_json(x, y) for x, y in zip(a, b))  # type: ignore[arg-type]
    return a == b


class ProfileUsers(Mapping):
    """One namespace's profile name -> user uids, read from the context's inverted index under its lock: each
    lookup copies one entry, so a reconciliation pays for the profiles it reads, not for the namespace."""

    def __init__(self, ctx: Context, namespace: str) -> None:
        self._ctx, self._namespace = ctx, namespace

    def __getitem__(self, name: str) -> set[str]:
        with self._ctx._users_lock:
            uids = self._ctx.profile_users.get(self._namespace, {}).get(name)
            if uids is None:
                raise KeyError(name)
            return set(uids)

    def _snapshot(self) -> dict[str, set[str]]:
        with self._ctx._users_lock:
            return {name: set(uids) for name, uids in self._ctx.profile_users.get(self._namespace, {}).items()}

    def __iter__(self):
        return iter(self._snapshot())

    def __len__(self) -> int:
        # counted, not copied: `users or {}` and the like call this on the hot path, and copying every entry
        # made each reconciliation cost grow with the namespace
        with self._ctx._users_lock:
            return len(self._ctx.profile_users.get(self._namespace, {}))
