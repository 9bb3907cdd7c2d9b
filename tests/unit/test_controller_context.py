"""What the operator keeps per object between reconciliations (controller.context.Context)."""

from __future__ import annotations

import copy
from types import SimpleNamespace

from specpilot.controller.context import Bounded, Context

BODY = {"metadata": {"uid": "u1", "name": "llama"}, "spec": {"model": {"id": "m"}},
        "status": {"phase": "Profiling", "pools": [{"name": "h100", "decision": None}]}}


def _ctx(**written) -> Context:
    ctx = Context(kube=SimpleNamespace(), config=SimpleNamespace(), metrics=SimpleNamespace(),
                  connection=SimpleNamespace())
    ctx.written.update(written)
    return ctx


def test_the_next_reconciliation_starts_from_the_status_computed_last_not_from_an_older_body():
    # kopf writes a handler's status only after it returns; a timer waiting on the lock still holds the
    # body from before that write.
    decided = {"phase": "Serving", "pools": [{"name": "h100", "decision": {"method": "eagle3"}}]}
    view = _ctx(u1=decided).latest(BODY)
    assert view["status"] == decided
    assert view["spec"] == BODY["spec"] and view["metadata"] == BODY["metadata"]
    assert BODY["status"]["phase"] == "Profiling", "the body itself is left as it is"


def test_with_nothing_computed_yet_the_body_is_the_truth():
    assert _ctx().latest(BODY) is BODY  # e.g. right after the operator (re)started
    assert _ctx(other={"phase": "Serving"}).latest(BODY) is BODY


def test_a_deleted_object_is_forgotten_entirely():
    ctx = _ctx(u1={"phase": "Serving"}, u2={"phase": "Profiling"})
    for uid in ("u1", "u2"):
        cache = ctx.cache(uid)
        cache.profiles_seen = (1,)
        cache.last_observed_at["h100"] = 1.0
        cache.last_cut["h100"] = ("x",)
        cache.pod_sources["h100"] = object()
    ctx.forget("u1")
    assert set(ctx.written) == set(ctx.objects) == {"u2"}
    assert ctx.cache("u2").profiles_seen == (1,)
    ctx.forget("never-seen")  # no error


def test_each_object_has_its_own_lock_and_fingerprint():
    ctx = _ctx()
    assert ctx.lock("a") is ctx.lock("a") and ctx.lock("a") is not ctx.lock("b")
    ctx.cache("a").profiles_seen = (3,)
    assert ctx.cache("b").profiles_seen is None


def test_process_wide_memories_are_bounded():
    remembered = Bounded(limit=3)
    for i in range(10):
        remembered[f"k{i}"] = i
    assert list(remembered) == ["k7", "k8", "k9"]
    remembered["k7"] = 0  # a refreshed key is kept longest
    remembered["k10"] = 10
    assert list(remembered) == ["k9", "k7", "k10"]


def test_profile_users_are_per_namespace_and_forgotten_with_the_deployment():
    ctx = _ctx()
    ctx.use_profiles("team-a", "u1", frozenset({"p", "q"}))
    ctx.use_profiles("team-a", "u2", frozenset({"p"}))
    ctx.use_profiles("team-b", "u3", frozenset({"p"}))  # same name, another namespace: another profile
    assert ctx.users_of_profiles("team-a") == {"p": {"u1", "u2"}, "q": {"u1"}}
    ctx.forget("u2")
    assert ctx.users_of_profiles("team-a") == {"p": {"u1"}, "q": {"u1"}}
    assert ctx.users_of_profiles("team-b") == {"p": {"u3"}} and ctx.users_of_profiles("none") == {}


def test_profile_users_follow_a_deployment_that_changes_its_profiles():
    ctx = _ctx()
    ctx.use_profiles("team-a", "u1", frozenset({"p", "q"}))
    ctx.use_profiles("team-a", "u1", frozenset({"q", "r"}))  # its status now lists q and r
    users = ctx.users_of_profiles("team-a")
    assert users == {"q": {"u1"}, "r": {"u1"}}
    assert users.get("p", set()) == set()
    copy = users["q"]
    copy.add("intruder")  # a lookup hands out a copy: the index is not changed through it
    assert ctx.users_of_profiles("team-a")["q"] == {"u1"}
    ctx.forget("u1")
    assert ctx.users_of_profiles("team-a") == {} and ctx.profile_users == {}


def test_profile_users_size_and_truth_do_not_copy_the_namespace(monkeypatch):
    # `users or {}` on the reconciliation's path called __len__, which copied every profile's user set of the
    # namespace: each reconciliation then cost more the more deployments the namespace held (issue 27)
    ctx = _ctx()
    for i in range(50):
        ctx.use_profiles("team-a", f"u{i}", frozenset({f"p{i}", "shared"}))
    users = ctx.users_of_profiles("team-a")

    def copy_all(self):
        raise AssertionError("the namespace's users were copied")

    monkeypatch.setattr(type(users), "_snapshot", copy_all)
    assert len(users) == 51 and bool(users)
    assert not ctx.users_of_profiles("none")
    assert users["shared"] == {f"u{i}" for i in range(50)}


def test_a_status_the_body_already_shows_is_held_once_as_the_body_holds_it():
    # kopf keeps each deployment's latest body; once it shows the status computed here, the context keeps
    # that object rather than a second copy of the same JSON (issue 27).
    computed = {"phase": "Serving", "pools": [{"name": "h100", "replicas": 2, "decision": {"k": 4, "x": 0.5}}]}
    seen = {"phase": "Serving", "pools": [{"name": "h100", "replicas": 2, "decision": {"k": 4, "x": 0.5}}]}
    ctx = _ctx()
    ctx.remember_written("u1", computed, seen)
    assert ctx.written["u1"] is seen
    assert ctx.latest({**BODY, "status": {"phase": "Profiling"}})["status"] == computed


def test_a_status_the_body_does_not_show_yet_is_kept_as_computed():
    computed = {"phase": "Serving", "pools": [{"name": "h100", "replicas": 2}]}
    for seen in (None, {"phase": "Profiling", "pools": [{"name": "h100", "replicas": 2}]},
                 {"phase": "Serving", "pools": [{"name": "h100", "replicas": 2.0}]},  # == says equal: 2 == 2.0
                 {"phase": "Serving", "pools": ({"name": "h100", "replicas": 2},)},
                 {"phase": "Serving", "pools": [{"name": "h100", "replicas": 2}], "extra": 1}):
        ctx = _ctx()
        ctx.remember_written("u1", computed, seen)
        assert ctx.written["u1"] is computed, seen


def test_kopf_copies_of_the_memo_are_the_context_itself():
    # kopf gives every watched object copy.copy(memo) for its life; nothing per object lives in it.
    ctx = _ctx()
    assert copy.copy(ctx) is ctx
