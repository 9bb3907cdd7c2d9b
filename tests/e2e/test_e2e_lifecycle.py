"""The SpeculativeDeployment lifecycle against a real cluster: the emulator scenarios' main assertions,
with the operator installed by Helm and the real API server validating, defaulting and collecting garbage.

Opt-in: skipped without KUBECONFIG (see tests/e2e/cluster.py for the settings and docs/testing.md).
"""

from __future__ import annotations

import pytest
from kubernetes.client.rest import ApiException

from tests.e2e.cluster import Cluster
from tests.operator.scenario import speculative_config

pytestmark = pytest.mark.e2e


def test_create_makes_profiles_and_jobs(cluster: Cluster):
    body = cluster.sdep()
    cluster.create(body)
    name = body["metadata"]["name"]

    # Baseline + two methods on the pool's one SKU, at most two Jobs at once.
    profiles = cluster.wait_for(lambda: len(cluster.profiles(body)) == 3 and cluster.profiles(body),
                                "3 profiles", name)
    assert {p["spec"]["sku"] for p in profiles} == {cluster.sku}
    assert {(p["spec"].get("method") or {}).get("method") for p in profiles} == {None, "ngram", "eagle3"}
    for profile in profiles:
        assert profile["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "specpilot"
    jobs = cluster.wait_for(lambda: len(cluster.jobs(profiles)) == 2 and cluster.jobs(profiles), "2 Jobs", name)
    for job in jobs:
        pod = job["spec"]["template"]["spec"]
        assert pod["nodeSelector"] == cluster.settings.node_selector
        assert pod["serviceAccountName"] == "specpilot-bench"
        assert job["spec"]["backoffLimit"] == 2
        assert job["spec"]["activeDeadlineSeconds"] > 0
        owner = job["metadata"]["ownerReferences"][0]
        assert owner["kind"] == "SpeculationProfile" and owner["name"] in {p["metadata"]["name"] for p in profiles}
        assert any(c["image"] == cluster.settings.bench_image for c in pod["containers"])
    role = cluster.role("specpilot-bench")
    assert {r for rule in role["rules"] for r in rule["resources"]} == {"speculationprofiles",
                                                                      "speculationprofiles/status"}

    # Until profiles exist the pool serves without speculation.
    serving = cluster.wait_for(lambda: cluster.deployment(name), "the serving Deployment", name)
    assert speculative_config(serving) is None
    assert serving["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    assert cluster.wait_for(lambda: cluster.service(name), "the Service", name)
    status = cluster.wait_for(lambda: cluster.status(name).get("phase") and cluster.status(name), "a phase", name)
    assert status["phase"] == "Profiling"
    assert status["pools"][0]["sku"] == cluster.sku


def test_invalid_resource_is_rejected_or_reported(cluster: Cluster):
    body = cluster.sdep()
    body["spec"]["gpuPools"][0]["pricePerGpuHour"] = -3
    del body["spec"]["methods"][1]["model"]
    name = body["metadata"]["name"]
    try:
        cluster.create(body)
    except ApiException as exc:
        # The CRD's schema and CEL rules: the API server refuses it, naming both fields.
        assert exc.status == 422, exc.body
        assert "pricePerGpuHour" in exc.body
        assert "needs `model`" in exc.body
        assert cluster.get(name) is None
        return
    # Admitted (validation off, or an older CRD): the operator reports it instead, once, and waits for a fix.
    valid = cluster.wait_for(lambda: cluster.condition(name, "Valid"), "the Valid condition", name)
    assert valid["status"] == "False" and valid["reason"] == "InvalidSpec"
    assert "spec.gpuPools[0].pricePerGpuHour" in valid["message"]
    assert "spec.methods[1]: method eagle3 needs `model`" in valid["message"]
    warning = cluster.wait_for(lambda: cluster.events(name, "InvalidSpec"), "an InvalidSpec Event", name)
    assert warning[0]["type"] == "Warning"
    assert cluster.status(name)["phase"] == "Failed"
    assert cluster.profiles(body) == []


def test_published_results_decide_and_serve(cluster: Cluster):
    body = cluster.sdep()
    cluster.create(body)
    name = body["metadata"]["name"]
    profiles = cluster.wait_for(lambda: len(cluster.profiles(body)) == 3 and cluster.profiles(body),
                                "3 profiles", name)

    # The Jobs' part: every profile gets its result, as specpilot-bench publishes it.
    for profile in profiles:
        cluster.publish_result(profile)
    cluster.wait_for(lambda: cluster.status(name).get("phase") == "Serving", "phase Serving", name)
    decision = cluster.status(name)["pools"][0]["decision"]
    assert decision["method"] in ("ngram", "eagle3")
    assert decision["reason"]
    ks = [r["numSpeculativeTokens"] for r in decision["schedule"]]
    assert ks[0] > 0 and ks == sorted(ks, reverse=True), "K must shrink as concurrency grows"

    config = cluster.wait_for(lambda: (serving := cluster.deployment(name)) and speculative_config(serving),
                              "speculative config in the Deployment", name)
    assert config["method"] == decision["method"]
    assert config["num_speculative_tokens_per_batch_size"][0][0] == 1
    assert [r[2] for r in config["num_speculative_tokens_per_batch_size"]] == ks
    status = cluster.status(name)
    assert status["history"][-1]["pool"] == "gpu"
    assert next(c for c in status["conditions"] if c["type"] == "Profiled")["status"] == "True"
    cluster.wait_for(lambda: cluster.events(name, "DecisionChanged"), "a DecisionChanged Event", name)


def test_deletion_cleans_up_owned_objects(cluster: Cluster):
    body = cluster.sdep()
    cluster.create(body)
    name = body["metadata"]["name"]
    cluster.wait_for(lambda: cluster.deployment(name), "the serving Deployment", name)
    cluster.wait_for(lambda: cluster.service(name), "the Service", name)
    profiles = cluster.wait_for(lambda: cluster.profiles(body), "its profiles", name)

    cluster.delete(name)
    cluster.wait_for(lambda: cluster.get(name) is None, f"{name} to be deleted (the operator's finalizer)")
    cluster.wait_for(lambda: cluster.deployment(name) is None and cluster.service(name) is None,
                     "the owned Deployment and Service to be collected")
    # Profiles are shared measurements and stay for reuse (the fixture deletes this test's).
    assert {p["metadata"]["name"] for p in cluster.profiles(body)} >= {p["metadata"]["name"] for p in profiles}
