"""The serving Deployments index (controller.handlers.deployment_entry) and how a reconciliation reads a pool's
Deployment from it (controller.reconcile._current_deployment): only what a SpeculativeDeployment owns is kept,
without annotations, and never more than MAX_ENTRY_BYTES of it; the API server is asked where the index
keeps no copy, or where there is no index."""

from __future__ import annotations

import asyncio
import os
from types import SimpleNamespace

from specpilot.controller.handlers import deployment_entry
from specpilot.controller.kube import NotFound
from specpilot.controller.profile_index import MAX_ENTRY_BYTES, NOT_INDEXED, Packed
from specpilot.controller.reconcile import _current_deployment

OWNER = {"apiVersion": "specpilot.io/v1alpha1", "kind": "SpeculativeDeployment", "name": "llama", "uid": "u1",
         "controller": True}


def deployment(**metadata) -> dict:
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "llama-h100", "namespace": "team-a", "labels": {"app": "llama"},
                         "ownerReferences": [OWNER], "managedFields": [{"manager": "specpilot"}], **metadata},
            "spec": {"replicas": 2}, "status": {"readyReplicas": 2}}


def test_an_owned_deployment_is_kept_packed_without_annotations_or_managed_fields() -> None:
    body = deployment(annotations={"note": "x" * 1000})
    entry = deployment_entry(body, "team-a", "llama-h100")
    (value,) = entry.values()
    assert list(entry) == ["team-a/llama-h100"] and isinstance(value, Packed)
    kept = value.unpack()
    assert kept["spec"] == {"replicas": 2} and kept["status"] == {"readyReplicas": 2}
    assert kept["metadata"]["ownerReferences"] == [OWNER] and kept["apiVersion"] == "apps/v1"
    assert "annotations" not in kept["metadata"] and "managedFields" not in kept["metadata"]


def test_a_deployment_no_speculative_deployment_owns_is_not_kept() -> None:
    # anyone who may create Deployments can put specpilot's label on one: the owner is what the operator made
    assert deployment_entry(deployment(ownerReferences=[]), "team-a", "x") == {}
    assert deployment_entry(deployment(ownerReferences=[{**OWNER, "apiVersion": "evil.io/v1"}]), "team-a", "x") == {}
    assert deployment_entry(deployment(ownerReferences=["not a reference"]), "team-a", "x") == {}


def test_an_entry_too_large_is_a_marker_and_is_read_from_the_api_server() -> None:
    body = deployment()
    body["spec"]["template"] = {"metadata": {"labels": {"junk": os.urandom(MAX_ENTRY_BYTES).hex()}}}
    entry = deployment_entry(body, "team-a", "llama-h100")
    assert entry == {"team-a/llama-h100": {NOT_INDEXED: True}}

    asked: list[str] = []

    async def get(plural: str, namespace: str, name: str) -> dict:
        asked.append(f"{plural} {namespace}/{name}")
        if name == "gone":
            raise NotFound(name)
        return {"from": "api"}

    ctx = SimpleNamespace(kube=SimpleNamespace(get=get))
    index = {"team-a/llama-h100": {NOT_INDEXED: True}, "team-a/small": {"from": "index"}}

    async def scenario() -> None:
        assert await _current_deployment(ctx, index, "team-a", "llama-h100") == {"from": "api"}
        assert await _current_deployment(ctx, index, "team-a", "small") == {"from": "index"}
        assert await _current_deployment(ctx, index, "team-a", "absent") is None  # the watch shows none: none
        assert await _current_deployment(ctx, None, "team-a", "small") == {"from": "api"}  # no index: asked
        assert await _current_deployment(ctx, None, "team-a", "gone") is None

    asyncio.run(scenario())
    assert asked == ["deployments team-a/llama-h100", "deployments team-a/small", "deployments team-a/gone"]
