"""The sandbox's gateway (specpilot_sandbox.router) over plain objects: an HTTPRoute's weights split requests
across InferencePools and Services as the Gateway API says, each backend's endpoints are the ready pods its
selector matches, and what the gateway cannot forward is answered by it (503, 500) for the caller to count."""

from __future__ import annotations

import math
import random
from collections import Counter

import pytest

from specpilot_sandbox.router import INFERENCE_GROUP, Endpoint, choose, is_ready, resolve_route

NAMESPACE = "team"


def pod(name: str, ip: str, labels: dict[str, str], *, ready: bool = True, ports: list[dict] | None = None,
        deleting: bool = False, namespace: str = NAMESPACE) -> dict:
    metadata: dict = {"name": name, "namespace": namespace, "labels": labels}
    if deleting:
        metadata["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata,
            "spec": {"containers": [{"name": "engine", "image": "vllm", "ports": ports or []}]},
            "status": {"phase": "Running", "podIP": ip,
                       "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}


def pool(name: str, match: dict[str, str], *numbers: int) -> dict:
    return {"apiVersion": f"{INFERENCE_GROUP}/v1", "kind": "InferencePool",
            "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {"selector": {"matchLabels": match}, "targetPorts": [{"number": n} for n in numbers or (8000,)],
                     "endpointPickerRef": {"name": f"{name}-epp", "port": {"number": 9002}}}}


def service(name: str, selector: dict[str, str], port: int, target_port: int | str) -> dict:
    return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {"selector": selector, "ports": [{"name": "http", "port": port, "targetPort": target_port}]}}


def pool_ref(name: str, weight: int | None = None) -> dict:
    ref = {"group": INFERENCE_GROUP, "kind": "InferencePool", "name": name}
    return ref if weight is None else {**ref, "weight": weight}


def route(*refs: dict) -> dict:
    return {"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
            "metadata": {"name": "llama", "namespace": NAMESPACE},
            "spec": {"parentRefs": [{"name": "inference"}], "rules": [
                {"matches": [{"path": {"type": "PathPrefix", "value": "/"}}], "backendRefs": list(refs)}]}}


A100_PODS = [pod("llama-a100-1", "10.0.1.1", {"app": "llama", "pool": "a100"}),
             pod("llama-a100-2", "10.0.1.2", {"app": "llama", "pool": "a100"})]
H100_PODS = [pod("llama-h100-1", "10.0.2.1", {"app": "llama", "pool": "h100"})]
POOLS = [pool("llama-a100", {"app": "llama", "pool": "a100"}), pool("llama-h100", {"app": "llama", "pool": "h100"})]


def shares(picks: list, n: int) -> dict[str | None, float]:
    counts = Counter(p.backend.name if p.backend else None for p in picks)
    return {name: count / n for name, count in counts.items()}


def test_weights_700_300_split_requests_70_30():
    backends = resolve_route(route(pool_ref("llama-a100", 700), pool_ref("llama-h100", 300)),
                             services=[], pools=POOLS, pods=A100_PODS + H100_PODS)
    rng, n = random.Random(7), 4000
    picks = [choose(backends, rng) for _ in range(n)]
    assert all(p.status is None for p in picks)
    share = shares(picks, n)["llama-a100"]
    standard_error = math.sqrt(0.7 * 0.3 / n)
    assert abs(share - 0.7) < 4 * standard_error, share
    # each request lands on a pod of the pool it was sent to
    pods_of = {"llama-a100": {"llama-a100-1", "llama-a100-2"}, "llama-h100": {"llama-h100-1"}}
    assert all(p.endpoint.pod in pods_of[p.backend.name] for p in picks)


def test_a_backend_of_weight_0_gets_nothing_and_an_absent_weight_is_1():
    backends = resolve_route(route(pool_ref("llama-a100"), pool_ref("llama-h100", 0)),
                             services=[], pools=POOLS, pods=A100_PODS + H100_PODS)
    assert [b.weight for b in backends] == [1, 0]
    rng = random.Random(1)
    assert {choose(backends, rng).backend.name for _ in range(500)} == {"llama-a100"}
    only_zero = resolve_route(route(pool_ref("llama-h100", 0)), services=[], pools=POOLS, pods=H100_PODS)
    assert choose(only_zero, rng).status == 500


def test_a_pool_whose_pods_are_not_ready_has_no_endpoints_and_its_share_is_answered_503():
    unready = [pod("llama-h100-1", "10.0.2.1", {"app": "llama", "pool": "h100"}, ready=False),
               pod("llama-h100-2", "10.0.2.2", {"app": "llama", "pool": "h100"}, deleting=True),
               pod("llama-h100-3", "", {"app": "llama", "pool": "h100"})]
    assert not any(is_ready(p) for p in unready)
    backends = resolve_route(route(pool_ref("llama-a100", 1), pool_ref("llama-h100", 1)),
                             services=[], pools=POOLS, pods=A100_PODS + unready)
    assert {b.name: len(b.endpoints) for b in backends} == {"llama-a100": 2, "llama-h100": 0}
    rng, n = random.Random(3), 2000
    picks = [choose(backends, rng) for _ in range(n)]
    failed = [p for p in picks if p.status is not None]
    # the empty pool's share fails, counted; it does not spill onto the other pool
    assert {(p.backend.name, p.status, p.endpoint) for p in failed} == {("llama-h100", 503, None)}
    assert abs(len(failed) / n - 0.5) < 4 * math.sqrt(0.25 / n)


def test_services_and_inference_pools_mix_in_one_route():
    http = [{"name": "http", "containerPort": 8000}]
    pods = [pod("llama-a100-1", "10.0.1.1", {"app": "llama", "pool": "a100"}, ports=http),
            pod("llama-h100-1", "10.0.2.1", {"app": "llama", "pool": "h100"}, ports=http),
            pod("llama-h200-1", "10.0.3.1", {"app": "llama", "pool": "h200"})]
    services = [service("llama-a100", {"app": "llama", "pool": "a100"}, 80, "http"),
                service("llama-h200", {"app": "llama", "pool": "h200"}, 80, 8001)]
    backends = resolve_route(
        route({"name": "llama-a100", "port": 80, "weight": 2}, pool_ref("llama-h100", 1),
              {"group": "", "kind": "Service", "name": "llama-h200", "port": 80, "weight": 1}),
        services=services, pools=POOLS, pods=pods)
    assert [(b.kind, b.name, b.endpoints) for b in backends] == [
        ("Service", "llama-a100", (Endpoint("llama-a100-1", "10.0.1.1", 8000),)),  # the named targetPort
        ("InferencePool", "llama-h100", (Endpoint("llama-h100-1", "10.0.2.1", 8000),)),
        ("Service", "llama-h200", (Endpoint("llama-h200-1", "10.0.3.1", 8001),)),
    ]
    rng, n = random.Random(5), 4000
    share = shares([choose(backends, rng) for _ in range(n)], n)
    for name, expected in {"llama-a100": 0.5, "llama-h100": 0.25, "llama-h200": 0.25}.items():
        assert abs(share[name] - expected) < 4 * math.sqrt(expected * (1 - expected) / n), (name, share)


def test_pods_of_another_deployment_are_never_chosen():
    others = [pod("llama-a100-canary-1", "10.0.9.1", {"app": "llama", "pool": "a100-canary"}),
              pod("mistral-a100-1", "10.0.9.2", {"app": "mistral", "pool": "a100"}),
              pod("llama-a100-9", "10.0.9.3", {"app": "llama", "pool": "a100"}, namespace="elsewhere")]
    backends = resolve_route(route(pool_ref("llama-a100", 1)), services=[], pools=POOLS, pods=A100_PODS + others)
    rng = random.Random(11)
    assert {choose(backends, rng).endpoint.pod for _ in range(500)} == {"llama-a100-1", "llama-a100-2"}


def test_within_a_backend_the_endpoint_with_the_fewest_requests_in_flight_is_chosen():
    backends = resolve_route(route(pool_ref("llama-a100")), services=[], pools=POOLS, pods=A100_PODS)
    busy = {"http://10.0.1.1:8000": 3, "http://10.0.1.2:8000": 1}
    rng = random.Random(2)
    assert {choose(backends, rng, lambda url: busy[url]).endpoint.pod for _ in range(100)} == {"llama-a100-2"}
    # ties are drawn at random: both pods serve when equally loaded
    assert {choose(backends, rng).endpoint.pod for _ in range(100)} == {"llama-a100-1", "llama-a100-2"}


def test_every_target_port_of_a_pool_is_an_endpoint():
    two_ports = [pool("llama-a100", {"app": "llama", "pool": "a100"}, 8000, 8001)]
    [backend] = resolve_route(route(pool_ref("llama-a100")), services=[], pools=two_ports, pods=A100_PODS[:1])
    assert [e.url for e in backend.endpoints] == ["http://10.0.1.1:8000", "http://10.0.1.1:8001"]


@pytest.mark.parametrize("ref, problem", [
    (pool_ref("llama-l40s"), 'InferencePool "llama-l40s" not found'),
    ({"name": "llama-missing", "port": 80}, 'Service "llama-missing" not found'),
    ({"name": "llama-a100", "port": 81}, 'Service "llama-a100" has no port 81'),
    ({"name": "llama-a100"}, "names no port"),
    ({"group": "example.com", "kind": "Backend", "name": "x"}, "is not routed to"),
    ({**pool_ref("llama-a100"), "namespace": "elsewhere"}, "another namespace"),
])
def test_a_backend_ref_that_does_not_resolve_is_answered_500(ref, problem):
    services = [service("llama-a100", {"app": "llama", "pool": "a100"}, 80, 8000)]
    [backend] = resolve_route(route(ref), services=services, pools=POOLS, pods=A100_PODS)
    assert problem in backend.problem and backend.endpoints == ()
    pick = choose([backend], random.Random(0))
    assert (pick.backend, pick.endpoint, pick.status) == (backend, None, 500)


def test_the_same_seed_picks_the_same_endpoints():
    backends = resolve_route(route(pool_ref("llama-a100", 3), pool_ref("llama-h100", 1)),
                             services=[], pools=POOLS, pods=A100_PODS + H100_PODS)
    first, second = random.Random(42), random.Random(42)
    assert [choose(backends, first).endpoint for _ in range(200)] == [choose(backends, second).endpoint
                                                                       for _ in range(200)]
