"""The sandbox cluster's gateway: where a Gateway API HTTPRoute sends each request, across Services and the
Inference Extension's InferencePools.

A real gateway reads the route's rule and sends each request to one of its backendRefs in proportion to their
weights (the Gateway API: a backend's share is its weight over the sum of the rule's weights; weight 0 gets
nothing; an absent weight is 1), then to one endpoint of that backend. A Service's endpoints are the ready pods
its selector matches, on the pod port its targetPort names; an InferencePool's are the ready pods its
selector's matchLabels match, on each of its targetPorts, and its endpoint picker (EPP) chooses among them per
request. The sandbox has neither gateway nor EPP: `resolve_route` finds the backends and their endpoints in
plain objects, `choose` picks one per request, by weight, then the endpoint with the fewest requests in flight
(an EPP's queue scorer; a Service's proxy would pick at random or in turn, the sandbox picks as for a pool so
that the demo's replicas share load alike whichever kind routes to them), ties broken at random.

A request the gateway cannot forward gets the gateway's own answer, exposed in the `Pick` so that a caller
counts it as a failed request: 503 from a backend with weight but no ready endpoint (as Envoy answers, "no
healthy upstream"), 500 from a backendRef that does not resolve (the Gateway API's answer for an invalid
backend), 404 when there is no such route. `Router` reads the sandbox API server and picks with a seeded
random.Random, so a test's picks are reproducible.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .apiserver import SandboxApiServer

INFERENCE_GROUP = "inference.networking.k8s.io"
"""The Inference Extension's API group; an InferencePool backendRef names it."""


@dataclass(frozen=True)
class Endpoint:
    """One address a backend forwards to: a ready pod's IP and a port."""

    pod: str
    ip: str
    port: int

    @property
    def url(self) -> str:
        return f"http://{self.ip}:{self.port}"


@dataclass(frozen=True)
class Backend:
    """One backendRef of the route's rule, resolved."""

    group: str
    """The API group: empty for a Service, the Inference Extension's for an InferencePool."""
    kind: str
    name: str
    weight: int
    """Its share of the rule's requests is weight / the sum of the rule's weights."""
    endpoints: tuple[Endpoint, ...] = ()
    """The ready endpoints, by pod name and port."""
    problem: str | None = None
    """Why the backendRef does not resolve (no such object, a kind the gateway does not route to, another
    namespace); requests sent its way get 500."""


@dataclass(frozen=True)
class Pick:
    """Where one request goes."""

    backend: Backend | None
    """The backend the weighted choice gave it (None: the route has no backend with weight, or no route)."""
    endpoint: Endpoint | None
    """The endpoint that serves it (None: the gateway answers it with `status`)."""
    status: int | None = None
    """The gateway's own HTTP answer when no endpoint serves the request: 404 (no such route), 500 (no backend
    with weight, or one that does not resolve), 503 (a backend with no ready endpoint)."""


def is_ready(pod: dict) -> bool:
    """Whether a pod is an endpoint: it has an IP, is not being deleted and its Ready condition is True (what
    the EndpointSlice controller and the EPP's pod reconciler both ask of a pod)."""
    status = pod.get("status") or {}
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])
    return bool(status.get("podIP")) and not (pod.get("metadata") or {}).get("deletionTimestamp") and ready


def _selects(selector: dict[str, str], pod: dict) -> bool:
    labels = (pod.get("metadata") or {}).get("labels") or {}
    return all(labels.get(key) == value for key, value in selector.items())


def _named_port(pod: dict, name: str) -> int | None:
    """The number of the container port `name` of a pod (None: it has none by that name)."""
    for container in (pod.get("spec") or {}).get("containers") or []:
        for port in container.get("ports") or []:
            if port.get("name") == name:
                return int(port["containerPort"])
    return None


def _service_endpoints(service: dict, port: int | None, pods: list[dict]) -> tuple[Endpoint, ...] | str:
    """The endpoints of a Service's port `port` (its port number, as a backendRef names it), or why there are
    none to resolve."""
    if port is None:
        return f'the backendRef to Service "{service["metadata"]["name"]}" names no port'
    spec = service.get("spec") or {}
    entry = next((p for p in spec.get("ports") or [] if p.get("port") == port), None)
    if entry is None:
        return f'Service "{service["metadata"]["name"]}" has no port {port}'
    selector = spec.get("selector") or {}
    if not selector:
        return ()  # a Service without a selector has hand-made endpoints; the sandbox makes none
    target = entry.get("targetPort", entry["port"])
    endpoints = []
    for pod in pods:
        if _selects(selector, pod):
            # A named targetPort is each pod's own container port of that name; a pod without one is no endpoint.
            number = target if isinstance(target, int) else _named_port(pod, target)
            if number is not None:
                endpoints.append(Endpoint(pod["metadata"]["name"], pod["status"]["podIP"], number))
    return tuple(endpoints)


def _pool_endpoints(pool: dict, pods: list[dict]) -> tuple[Endpoint, ...]:
    """The endpoints of an InferencePool: each of its targetPorts on each ready pod its matchLabels match (an
    empty matchLabels matches every pod, as a LabelSelector does)."""
    spec = pool.get("spec") or {}
    match = (spec.get("selector") or {}).get("matchLabels") or {}
    numbers = [int(p["number"]) for p in spec.get("targetPorts") or []]
    return tuple(Endpoint(pod["metadata"]["name"], pod["status"]["podIP"], number)
                 for pod in pods if _selects(match, pod) for number in numbers)


def resolve_route(route: dict, *, services: Iterable[dict], pools: Iterable[dict],
                  pods: Iterable[dict]) -> list[Backend]:
    """The backends of `route`'s first rule (the operator writes one, matching every path), in its order, each
    with its ready endpoints, from the Services, InferencePools and Pods given (those of another namespace than
    the route's are not looked at)."""
    namespace = route["metadata"].get("namespace")

    def local(objects: Iterable[dict]) -> dict[str, dict]:
        return {o["metadata"]["name"]: o for o in objects if o["metadata"].get("namespace", namespace) == namespace}

    by_service, by_pool = local(services), local(pools)
    ready = sorted((p for p in local(pods).values() if is_ready(p)), key=lambda p: p["metadata"]["name"])
    rules = (route.get("spec") or {}).get("rules") or []
    backends = []
    for ref in (rules[0].get("backendRefs") or []) if rules else []:
        group, kind, name = ref.get("group") or "", ref.get("kind") or "Service", ref["name"]
        resolved: tuple[Endpoint, ...] | str
        if ref.get("namespace", namespace) != namespace:
            resolved = f"{kind} {ref['namespace']}/{name} is in another namespace (no ReferenceGrant allows it)"
        elif (group, kind) == ("", "Service"):
            service = by_service.get(name)
            resolved = (f'Service "{name}" not found' if service is None
                        else _service_endpoints(service, ref.get("port"), ready))
        elif (group, kind) == (INFERENCE_GROUP, "InferencePool"):
            pool = by_pool.get(name)
            resolved = f'InferencePool "{name}" not found' if pool is None else _pool_endpoints(pool, ready)
        else:
            resolved = f"a backendRef of group {group!r} and kind {kind} is not routed to"
        weight = int(ref.get("weight", 1))
        backends.append(Backend(group, kind, name, weight, problem=resolved) if isinstance(resolved, str)
                        else Backend(group, kind, name, weight, endpoints=resolved))
    return backends


def choose(backends: Sequence[Backend], rng: random.Random,
           in_flight: Callable[[str], int] = lambda url: 0) -> Pick:
    """Where one request goes: a backend drawn by weight, then its endpoint with the fewest requests in flight
    (`in_flight`: base URL -> requests there now), ties drawn at random."""
    weighted = [b for b in backends if b.weight > 0]
    if not weighted:
        return Pick(None, None, 500)
    backend = rng.choices(weighted, weights=[b.weight for b in weighted])[0]
    if backend.problem is not None:
        return Pick(backend, None, 500)
    if not backend.endpoints:
        return Pick(backend, None, 503)
    load = {e: in_flight(e.url) for e in backend.endpoints}
    least = min(load.values())
    return Pick(backend, rng.choice([e for e in backend.endpoints if load[e] == least]))


class Router:
    """The gateway of one HTTPRoute of the sandbox API server: each pick reads the route, its backends and their
    pods as they stand, and draws with a random.Random seeded once."""

    def __init__(self, api: SandboxApiServer, namespace: str, route: str, *, seed: int = 0) -> None:
        self.api = api
        self.namespace = namespace
        self.route = route
        self.rng = random.Random(seed)

    def backends(self) -> list[Backend] | None:
        """The route's backends as they stand (None: no such route)."""
        route = self.api.get("httproutes", self.namespace, self.route)
        if route is None:
            return None
        return resolve_route(route, services=self.api.objects("services", self.namespace),
                             pools=self.api.objects("inferencepools", self.namespace),
                             pods=self.api.objects("pods", self.namespace))

    def pick(self, in_flight: Callable[[str], int] = lambda url: 0) -> Pick:
        """Where the next request goes (`in_flight`: base URL -> requests the caller has there now)."""
        backends = self.backends()
        return Pick(None, None, 404) if backends is None else choose(backends, self.rng, in_flight)
