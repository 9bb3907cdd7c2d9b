"""The operator's API client: no-op applies are not sent, requests are counted by verb, timers are spread."""

from __future__ import annotations

import copy

import pytest
from hypothesis import given
from hypothesis import strategies as st

from specpilot.controller import kube as kube_module
from specpilot.controller.handlers import phase_offset
from specpilot.controller.kube import Connection, Kube, contains, digest, request_verb

SERVICE = {"apiVersion": "v1", "kind": "Service",
           "metadata": {"name": "llama", "namespace": "team-a", "labels": {"app": "llama"}},
           "spec": {"selector": {"app": "llama"}, "ports": [{"name": "http", "port": 8000}]}}
DEPLOYMENT = {"apiVersion": "apps/v1", "kind": "Deployment",
              "metadata": {"name": "llama-h100", "namespace": "team-a"},
              "spec": {"replicas": 2, "template": {"spec": {"containers": [
                  {"name": "vllm", "args": ["--model", "m"], "env": [{"name": "A", "value": "1"}]}]}}}}


def _live(obj: dict) -> dict:
    """What an API server returns for `obj`: its fields plus defaults, status and bookkeeping."""
    live = copy.deepcopy(obj)
    live["metadata"].update(uid="u1", resourceVersion="7", managedFields=[{"manager": "specpilot"}])
    if obj["kind"] == "Deployment":
        live["spec"]["strategy"] = {"type": "RollingUpdate"}
        container = live["spec"]["template"]["spec"]["containers"][0]
        container.update(imagePullPolicy="IfNotPresent", terminationMessagePath="/dev/termination-log")
        live["status"] = {"replicas": 2, "readyReplicas": 1}
    return live


class Recording(Kube):
    """A Kube whose transport records requests instead of sending them."""

    def __init__(self) -> None:
        self.counted: list[tuple[str, str]] = []
        super().__init__(Connection(server="http://127.0.0.1:1"),
                         on_request=lambda verb, resource: self.counted.append((verb, resource)))
        self.sent: list[tuple[str, str, str]] = []

        self.stored: dict[str, dict] = {}
        """path -> the live object, as an API server holds it (applies, gets and deletes of named objects)."""

    async def _call(self, method, path, body=None, content_type="application/json", query=None, resource="",
                    name_given=False):
        self._on_request(request_verb(method, content_type, name_given), resource)
        self.sent.append((method, path, content_type))
        if method == "GET" and name_given:
            if path not in self.stored:
                raise kube_module.NotFound(path)
            return copy.deepcopy(self.stored[path])
        if method == "DELETE":
            self.stored.pop(path, None)
        if body and "metadata" in body:
            self.stored[path] = _live(body)
            return _live(body)
        return {}


def test_live_object_with_server_defaults_contains_what_was_applied() -> None:
    assert contains(_live(DEPLOYMENT), DEPLOYMENT)
    assert contains(_live(SERVICE), SERVICE)


@pytest.mark.parametrize("edit", [
    lambda o: o["spec"].__setitem__("replicas", 5),  # scaled by hand
    lambda o: o["spec"]["template"]["spec"]["containers"][0]["args"].append("--x"),  # an extra arg
    lambda o: o["spec"]["template"]["spec"]["containers"][0]["env"].pop(),  # an env var removed
    lambda o: o["metadata"].pop("namespace"),
])
def test_a_hand_edit_of_a_field_we_set_is_not_contained(edit) -> None:
    live = _live(DEPLOYMENT)
    edit(live)
    assert not contains(live, DEPLOYMENT)


def test_booleans_and_numbers_are_not_confused() -> None:
    assert not contains({"a": 1}, {"a": True})
    assert not contains({"a": False}, {"a": 0})
    assert contains({"a": 1.0}, {"a": 1})


@given(st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=5),
                    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=3), children,
                                                                                      max_size=3), max_leaves=12))
def test_every_object_contains_itself_and_digest_ignores_key_order(obj) -> None:
    assert contains(obj, obj)
    if isinstance(obj, dict):
        assert digest(dict(reversed(list(obj.items())))) == digest(obj)


async def test_an_unchanged_deployment_is_applied_once_then_only_read() -> None:
    kube = Recording()
    first = await kube.apply(DEPLOYMENT, current=None)
    assert [m for m, _, _ in kube.sent] == ["PATCH"]
    live = first
    for _ in range(3):
        assert await kube.apply(copy.deepcopy(DEPLOYMENT), current=live) is live
    assert len(kube.sent) == 1
    assert kube.counted == [("apply", "deployments")]


async def test_a_changed_or_hand_edited_deployment_is_applied_again() -> None:
    kube = Recording()
    live = await kube.apply(DEPLOYMENT, current=None)
    changed = copy.deepcopy(DEPLOYMENT)
    changed["spec"]["replicas"] = 3
    live = await kube.apply(changed, current=live)
    assert len(kube.sent) == 2
    edited = copy.deepcopy(live)
    edited["spec"]["replicas"] = 9  # someone scaled it by hand: the operator puts its value back
    await kube.apply(changed, current=edited)
    assert len(kube.sent) == 3
    await kube.apply(changed, current=None)  # deleted by hand: created again
    assert len(kube.sent) == 4


async def test_a_new_process_applies_once_even_when_the_live_object_matches() -> None:
    kube = Recording()
    await kube.apply(DEPLOYMENT, current=_live(DEPLOYMENT))
    assert len(kube.sent) == 1


async def test_an_unread_object_is_applied_again_only_when_changed_or_past_the_resync(monkeypatch) -> None:
    clock = [1000.0]
    monkeypatch.setattr(kube_module.time, "monotonic", lambda: clock[0])
    kube = Recording()
    await kube.apply(SERVICE)
    assert await kube.apply(copy.deepcopy(SERVICE)) is None
    assert len(kube.sent) == 1
    changed = copy.deepcopy(SERVICE)
    changed["spec"]["ports"][0]["port"] = 8001
    await kube.apply(changed)
    assert [m for m, _, _ in kube.sent] == ["PATCH", "PATCH"]


async def test_past_the_resync_an_unread_object_is_read_back_and_applied_only_when_it_drifted(monkeypatch) -> None:
    # issue 27: a blind re-apply every APPLY_RESYNC_S was a write per object every 5 minutes in a steady cluster
    clock = [1000.0]
    monkeypatch.setattr(kube_module.time, "monotonic", lambda: clock[0])
    kube = Recording()
    path = "/api/v1/namespaces/team-a/services/llama"
    await kube.apply(SERVICE)
    clock[0] += kube_module.APPLY_RESYNC_S + 1
    assert await kube.apply(copy.deepcopy(SERVICE)) is not None  # read back: it holds what was applied
    assert [m for m, _, _ in kube.sent] == ["PATCH", "GET"]
    assert await kube.apply(SERVICE) is None  # and the resync's clock starts again
    assert len(kube.sent) == 2
    kube.stored[path]["spec"]["ports"][0]["port"] = 9999  # a hand edit of a field specpilot sets
    clock[0] += kube_module.APPLY_RESYNC_S + 1
    await kube.apply(SERVICE)
    assert [m for m, _, _ in kube.sent] == ["PATCH", "GET", "GET", "PATCH"]
    assert kube.stored[path]["spec"]["ports"][0]["port"] == 8000  # put back
    del kube.stored[path]  # deleted by hand
    clock[0] += kube_module.APPLY_RESYNC_S + 1
    await kube.apply(SERVICE)
    assert [m for m, _, _ in kube.sent][-2:] == ["GET", "PATCH"] and path in kube.stored


async def test_a_deleted_object_is_applied_again() -> None:
    kube = Recording()
    await kube.apply(SERVICE)
    await kube.delete("services", "team-a", "llama")
    await kube.apply(SERVICE)
    assert [m for m, _, _ in kube.sent] == ["PATCH", "DELETE", "PATCH"]
    assert ("delete", "services") in kube.counted


async def test_requests_are_counted_by_verb_and_resource() -> None:
    kube = Recording()
    with pytest.raises(kube_module.NotFound):
        await kube.get("deployments", "team-a", "llama-h100")
    await kube.list("pods", "team-a")
    await kube.patch("speculativedeployments", "team-a", "llama", {"status": {"phase": "Serving"}},
                     subresource="status")
    await kube.create(SERVICE)
    assert kube.counted == [("get", "deployments"), ("list", "pods"), ("patch", "speculativedeployments/status"),
                            ("create", "services")]


def test_timer_phases_are_fixed_per_object_and_spread_over_the_interval() -> None:
    offsets = [phase_offset(f"uid-{i}", 15.0) for i in range(1000)]
    assert all(0.0 <= o < 15.0 for o in offsets)
    assert phase_offset("uid-1", 15.0) == offsets[1]
    # spread: each of the interval's five 3-second slices holds 15-25% of 1,000 objects (uniform: 20%)
    slices = [sum(1 for o in offsets if k * 3 <= o < (k + 1) * 3) for k in range(5)]
    assert all(150 <= n <= 250 for n in slices), slices
    assert phase_offset("uid-1", 0) == 0.0


async def test_a_read_back_that_is_refused_falls_back_to_the_apply(monkeypatch) -> None:
    # an operator upgraded under a ClusterRole without get on Services still repairs its Services
    clock = [1000.0]
    monkeypatch.setattr(kube_module.time, "monotonic", lambda: clock[0])
    kube = Recording()
    await kube.apply(SERVICE)

    async def forbidden(*_args, **_kwargs):
        raise kube_module.Refused(403, "GET", "/api/v1/namespaces/team-a/services/llama", "forbidden")

    monkeypatch.setattr(kube, "get", forbidden)
    clock[0] += kube_module.APPLY_RESYNC_S + 1
    await kube.apply(SERVICE)
    assert [m for m, _, _ in kube.sent] == ["PATCH", "PATCH"]
