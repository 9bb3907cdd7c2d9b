"""Fixtures of the opt-in e2e suite: a real cluster named by KUBECONFIG, with specpilot installed.

Skipped, with the reason, when KUBECONFIG is unset or specpilot's CRDs are not installed there. A
cluster that is set up but unusable (namespace missing, no node matching the pool's selector) fails
with what to change. Each test gets a `Cluster` that deletes what the test created afterwards.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from kubernetes import client, config
from kubernetes.client.rest import ApiException

from tests.e2e.cluster import CRD_NAMES, GPU_PRODUCT_LABEL, Cluster, Settings, expected_sku


@pytest.fixture(scope="session")
def cluster_session() -> Iterator[tuple[client.ApiClient, Settings, str]]:
    if not os.environ.get("KUBECONFIG"):
        pytest.skip("e2e needs a real cluster: set KUBECONFIG (and install specpilot with Helm, see docs/testing.md)")
    settings = Settings.from_env()
    config.load_kube_config()
    api = client.ApiClient()
    extensions = client.ApiextensionsV1Api(api)
    for crd in CRD_NAMES:
        try:
            extensions.read_custom_resource_definition(crd)
        except ApiException as exc:
            if exc.status == 404:
                pytest.skip(f"CRD {crd} is not installed on the KUBECONFIG cluster: helm install specpilot first")
            raise
    try:
        client.CoreV1Api(api).read_namespace(settings.namespace)
    except ApiException as exc:
        if exc.status == 404:
            pytest.fail(f"namespace {settings.namespace} does not exist: create it and let the operator watch it, "
                        "or set SPECPILOT_E2E_NAMESPACE to a namespace it watches")
        raise
    selector = ",".join(f"{k}={v}" for k, v in settings.node_selector.items())
    nodes = api.sanitize_for_serialization(client.CoreV1Api(api).list_node(label_selector=selector).items)
    if not nodes:
        pytest.fail(f"no node matches SPECPILOT_E2E_NODE_SELECTOR={selector}: set it to a label of your GPU nodes, "
                    f"or label a node (kubectl label node NAME {selector} {GPU_PRODUCT_LABEL}=NVIDIA-H100-80GB-HBM3)")
    sku = expected_sku(settings, nodes)
    if sku is None:
        pytest.fail(f"the nodes matching {selector} have no {GPU_PRODUCT_LABEL} label: label them, or set "
                    "SPECPILOT_E2E_SKU (e.g. H100-SXM)")
    yield api, settings, sku
    api.close()


@pytest.fixture
def cluster(cluster_session: tuple[client.ApiClient, Settings, str]) -> Iterator[Cluster]:
    api, settings, sku = cluster_session
    cluster = Cluster(api, settings, sku)
    yield cluster
    cluster.cleanup()
