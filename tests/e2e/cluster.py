"""A real cluster, as the e2e scenarios see it: settings from the environment, reads, and the Job's part.

The same moves as `tests/operator/scenario.py` plays against the emulator, made with the official
`kubernetes` client against whatever cluster KUBECONFIG names, where the specpilot operator (installed
with Helm) watches SPECPILOT_E2E_NAMESPACE.

Environment:
- KUBECONFIG (required): the cluster; without it every e2e test is skipped.
- SPECPILOT_E2E_NAMESPACE (default `specpilot-e2e`): a namespace the operator watches.
- SPECPILOT_E2E_NODE_SELECTOR (default `nvidia.com/gpu.present=true`): `key=value[,key=value]` selecting
  the nodes of the test's GPU pool; they should carry `nvidia.com/gpu.product` (GPU feature discovery
  sets it), or set SPECPILOT_E2E_SKU.
- SPECPILOT_E2E_SKU (optional): the pool's SKU, for nodes without a product label.
- SPECPILOT_E2E_BENCH_IMAGE (default: an image that cannot be pulled): the benchmark image of the test's
  Jobs. The test plays the Job's part itself (it writes the result into the profile's status), so by
  default the benchmark pods never start and cannot race with it.
- SPECPILOT_E2E_TIMEOUT (default 180): seconds to wait for each step; decisions are taken on the
  operator's reconcile timer (reconcileIntervalSeconds, 15 by default), so keep it well above that.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from kubernetes import client
from kubernetes.client.rest import ApiException

from specpilot.perf.catalog import DEFAULT_CATALOG, UnknownGpuError

GROUP, VERSION = "specpilot.io", "v1alpha1"
SDEPS, PROFILES = "speculativedeployments", "speculationprofiles"
CRD_NAMES = (f"{SDEPS}.{GROUP}", f"{PROFILES}.{GROUP}")
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
MANAGED_BY = "app.kubernetes.io/managed-by=specpilot"
UNPULLABLE_IMAGE = "registry.invalid/specpilot-e2e/never-pulled:0"
"""`.invalid` is reserved (RFC 2606): no registry answers, so the benchmark pods never run."""
SYNTHETIC_SKU = "H100-SXM"
"""The twin the synthetic results come from when the pool's SKU is not in specpilot's GPU catalog."""

T = TypeVar("T")


def parse_selector(text: str) -> dict[str, str]:
    """`a=b,c=d` -> {"a": "b", "c": "d"}; a malformed entry names the variable and the fix."""
    selector = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = part.partition("=")
        if not sep or not key:
            raise ValueError(f"SPECPILOT_E2E_NODE_SELECTOR must be key=value[,key=value] (got {text!r})")
        selector[key] = value
    return selector


@dataclass(frozen=True)
class Settings:
    namespace: str
    node_selector: dict[str, str]
    sku: str | None
    bench_image: str
    timeout_s: float

    @classmethod
    def from_env(cls) -> Settings:
        return cls(
            namespace=os.environ.get("SPECPILOT_E2E_NAMESPACE", "specpilot-e2e"),
            node_selector=parse_selector(os.environ.get("SPECPILOT_E2E_NODE_SELECTOR", "nvidia.com/gpu.present=true")),
            sku=os.environ.get("SPECPILOT_E2E_SKU") or None,
            bench_image=os.environ.get("SPECPILOT_E2E_BENCH_IMAGE", UNPULLABLE_IMAGE),
            timeout_s=float(os.environ.get("SPECPILOT_E2E_TIMEOUT", "180")),
        )


def expected_sku(settings: Settings, nodes: list[dict]) -> str | None:
    """The SKU the operator should find for the pool: the setting, else the most common product label
    of the selected nodes resolved through the GPU catalog (an unknown product is its own SKU)."""
    if settings.sku:
        return DEFAULT_CATALOG.resolve(settings.sku).sku if settings.sku in DEFAULT_CATALOG else settings.sku
    products = Counter((n["metadata"].get("labels") or {}).get(GPU_PRODUCT_LABEL) for n in nodes)
    products.pop(None, None)
    if not products:
        return None
    product = products.most_common(1)[0][0]
    try:
        return DEFAULT_CATALOG.resolve(product).sku
    except UnknownGpuError:
        return product


@dataclass
class Cluster:
    """Typed access to the resources the scenarios read and write, plus what each test must clean up."""

    api: client.ApiClient
    settings: Settings
    sku: str
    created: list[str] = field(default_factory=list)
    """SpeculativeDeployments this session created (deleted at the end)."""
    revisions: set[str] = field(default_factory=set)
    """Model revisions this session used: its profiles carry them, so cleanup deletes only its own."""

    def __post_init__(self) -> None:
        self.custom = client.CustomObjectsApi(self.api)
        self.core = client.CoreV1Api(self.api)
        self.apps = client.AppsV1Api(self.api)
        self.batch = client.BatchV1Api(self.api)
        self.rbac = client.RbacAuthorizationV1Api(self.api)

    @property
    def namespace(self) -> str:
        return self.settings.namespace

    # --- objects the test writes ---------------------------------------------------------------------------

    def sdep(self, methods: list[dict] | None = None, **spec_overrides: Any) -> dict:
        """A SpeculativeDeployment like the emulator scenarios' one, with a fresh name and model revision.

        The revision makes the profiles' identity (hence their names) unique to this test, so nothing is
        reused from an earlier run and cleanup deletes only what this test caused. Serving runs no pods
        (minReplicas 0, autoscaling none): the Deployment's spec is what the test checks.
        """
        suffix = uuid.uuid4().hex[:6]
        revision = f"e2e-{suffix}"
        self.revisions.add(revision)
        pool: dict[str, Any] = {"name": "gpu", "nodeSelector": dict(self.settings.node_selector)}
        if self.settings.sku:
            pool["sku"] = self.settings.sku
        spec = {
            "model": {"id": "meta-llama/Llama-3.1-8B-Instruct", "servedName": "llama", "revision": revision},
            "methods": methods or [
                {"method": "ngram", "numSpeculativeTokens": 4, "promptLookupMax": 4},
                {"method": "eagle3", "model": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B", "numSpeculativeTokens": 4},
            ],
            "gpuPools": [pool],
            "profiling": {"concurrencyLevels": [1, 2, 4, 8, 16, 32, 64, 128], "requestsPerLevel": 32,
                          "maxParallelJobsPerPool": 2, "image": self.settings.bench_image},
            "policy": {"tpotSloMs": 60, "minGainPercent": 5},
            "serving": {"minReplicas": 0, "maxReplicas": 1, "autoscaling": "none"},
            "metrics": {"source": "pods", "intervalSeconds": 5, "windowSeconds": 30},
        }
        spec.update(spec_overrides)
        return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "SpeculativeDeployment",
                "metadata": {"name": f"e2e-{suffix}", "namespace": self.namespace}, "spec": spec}

    def create(self, body: dict) -> dict:
        """`kubectl create -f`: the API server's schema and CEL validation apply (ApiException on 422)."""
        created = self.custom.create_namespaced_custom_object(GROUP, VERSION, self.namespace, SDEPS, body)
        self.created.append(body["metadata"]["name"])
        return created

    def delete(self, name: str) -> None:
        try:
            self.custom.delete_namespaced_custom_object(GROUP, VERSION, self.namespace, SDEPS, name,
                                                        propagation_policy="Background")
        except ApiException as exc:
            if exc.status != 404:
                raise

    def publish_result(self, profile: dict) -> None:
        """Play the benchmark Job: write a Succeeded result into the profile's status subresource."""
        from tests.operator.scenario import measured_status

        method = profile["spec"].get("method") or {}
        sku = profile["spec"]["sku"] if profile["spec"]["sku"] in DEFAULT_CATALOG else SYNTHETIC_SKU
        status = measured_status(sku, method.get("method"), method.get("numSpeculativeTokens", 4),
                                 levels=profile["spec"]["concurrencyLevels"],
                                 requests_per_level=profile["spec"].get("requestsPerLevel", 64))
        self.custom.patch_namespaced_custom_object_status(
            GROUP, VERSION, self.namespace, PROFILES, profile["metadata"]["name"], {"status": status})

    # --- reads ---------------------------------------------------------------------------------------------

    def get(self, name: str) -> dict | None:
        try:
            return self.custom.get_namespaced_custom_object(GROUP, VERSION, self.namespace, SDEPS, name)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def status(self, name: str) -> dict:
        return (self.get(name) or {}).get("status") or {}

    def condition(self, name: str, type_: str) -> dict | None:
        return next((c for c in self.status(name).get("conditions") or [] if c["type"] == type_), None)

    def profiles(self, body: dict) -> list[dict]:
        """The SpeculationProfiles of this deployment: its model revision is in their identity."""
        revision = body["spec"]["model"]["revision"]
        items = self.custom.list_namespaced_custom_object(GROUP, VERSION, self.namespace, PROFILES)["items"]
        return [p for p in items if (p["spec"].get("model") or {}).get("revision") == revision]

    def jobs(self, profiles: list[dict]) -> list[dict]:
        """specpilot's benchmark Jobs owned by these profiles."""
        names = {p["metadata"]["name"] for p in profiles}
        jobs = self.batch.list_namespaced_job(self.namespace, label_selector=MANAGED_BY)
        out = []
        for job in self.api.sanitize_for_serialization(jobs.items):
            owners = job["metadata"].get("ownerReferences") or []
            if any(o["kind"] == "SpeculationProfile" and o["name"] in names for o in owners):
                out.append(job)
        return out

    def deployment(self, name: str, pool: str = "gpu") -> dict | None:
        return self._read(self.apps.read_namespaced_deployment, f"{name}-{pool}")

    def service(self, name: str) -> dict | None:
        return self._read(self.core.read_namespaced_service, name)

    def role(self, name: str) -> dict | None:
        return self._read(self.rbac.read_namespaced_role, name)

    def events(self, name: str, reason: str) -> list[dict]:
        events = self.core.list_namespaced_event(
            self.namespace, field_selector=f"involvedObject.name={name},reason={reason}")
        # Filter here as well: the selector is an optimisation some API servers (the emulator) ignore.
        return [e for e in self.api.sanitize_for_serialization(events.items)
                if e["involvedObject"].get("name") == name and e.get("reason") == reason]

    def _read(self, read: Callable[..., Any], name: str) -> dict | None:
        try:
            return self.api.sanitize_for_serialization(read(name, self.namespace))
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    # --- waiting and cleaning up ---------------------------------------------------------------------------

    def wait_for(self, predicate: Callable[[], T], what: str, name: str | None = None,
                 interval_s: float = 1.0) -> T:
        """Poll until predicate() is truthy; on timeout, fail with what was awaited and the resource's status."""
        deadline = time.monotonic() + self.settings.timeout_s
        while True:
            value = predicate()
            if value:
                return value
            if time.monotonic() > deadline:
                seen = json.dumps(self.status(name), indent=1)[:3000] if name else ""
                raise AssertionError(
                    f"timed out after {self.settings.timeout_s:.0f} s waiting for {what}; is the specpilot "
                    f"operator running and watching namespace {self.namespace}?"
                    + (f"\nstatus of {name}: {seen}" if name else ""))
            time.sleep(interval_s)

    def cleanup(self) -> None:
        """Delete what the tests created: their SpeculativeDeployments (the operator and the garbage
        collector remove the Deployments and Services they own), then their profiles (and so the Jobs)."""
        for name in self.created:
            self.delete(name)
        deadline = time.monotonic() + self.settings.timeout_s
        while any(self.get(n) is not None for n in self.created) and time.monotonic() < deadline:
            time.sleep(1)
        for name in self.created:
            if self.get(name) is not None:
                # The operator never released it (not running?): drop its finalizer so nothing is left behind.
                self.custom.patch_namespaced_custom_object(GROUP, VERSION, self.namespace, SDEPS, name,
                                                           {"metadata": {"finalizers": None}})
        items = self.custom.list_namespaced_custom_object(GROUP, VERSION, self.namespace, PROFILES)["items"]
        for profile in items:
            if (profile["spec"].get("model") or {}).get("revision") in self.revisions:
                try:
                    self.custom.delete_namespaced_custom_object(
                        GROUP, VERSION, self.namespace, PROFILES, profile["metadata"]["name"],
                        propagation_policy="Background")
                except ApiException as exc:
                    if exc.status != 404:
                        raise
