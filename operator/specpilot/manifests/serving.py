"""The serving objects of a SpeculativeDeployment: one vLLM Deployment per GPU pool, one Service over
all pools, with weighted routing one Service (`gateway`) or one Gateway API Inference Extension InferencePool
(`inferencePool`) per pool and a Gateway API HTTPRoute weighting them, and an optional Prometheus-operator
PodMonitor.

The engine's speculative configuration is in its args; their hash is a pod-template annotation, so a
new decision rolls the pods (by default maxSurge 1, maxUnavailable 0: capacity never drops during a
rollout; `spec.serving.rollout` trades that for no spare GPU) and the operator can tell what a running
Deployment was built from.
"""

from __future__ import annotations

from typing import Any

from ..api.base import API_VERSION
from ..api.deployment_spec import (
    EndpointPickerFailureMode,
    EndpointPickerRef,
    GpuPool,
    ParentRef,
    Routing,
    SpeculativeDeploymentSpec,
)
from ..api.methods import CandidateMethod
from ..api.schedule import ScheduleRange
from ..api.tenancy import TenancyPolicy, refuse, serving_problems
from . import names
from .engine import (
    ENGINE_COMMAND,
    ENGINE_CONTAINER,
    SPECULATIVE_CONFIG_FLAG,
    engine_args,
    engine_config_hash,
    engine_env,
)
from .merge import deep_merge
from .pod import (
    dshm_mount,
    dshm_volume,
    gpu_resources,
    harden,
    health_probe,
    home_mount,
    home_volume,
    http_port,
    owner_reference,
    pool_placement,
    restore_container,
    restore_placement,
    startup_probe,
    with_identity_env,
)

SDEP_KIND = "SpeculativeDeployment"
SERVING_SERVICE_ACCOUNT = "specpilot-serving"
"""The serving pods' own ServiceAccount (one per namespace, no Role, no token mounted): they need no API
access, and the namespace's `default` account may have been granted some."""


def serving_service_account(namespace: str) -> dict[str, Any]:
    """The serving pods' ServiceAccount in `namespace`: no token is mounted from it."""
    return {"apiVersion": "v1", "kind": "ServiceAccount", "automountServiceAccountToken": False,
            "metadata": {"name": SERVING_SERVICE_ACCOUNT, "namespace": namespace,
                         "labels": {names.LABEL_NAME: "vllm", names.LABEL_MANAGED_BY: names.MANAGED_BY,
                                    names.LABEL_COMPONENT: names.COMPONENT_SERVING}}}


def sdep_owner(sdep_name: str, uid: str) -> dict[str, Any]:
    return owner_reference(api_version=API_VERSION, kind=SDEP_KIND, name=sdep_name, uid=uid)


def serving_deployment(*, sdep_name: str, namespace: str, uid: str, spec: SpeculativeDeploymentSpec, pool: GpuPool,
                       method: CandidateMethod | None, num_speculative_tokens: int | None = None,
                       schedule: list[ScheduleRange] | None = None, replicas: int | None,
                       tenancy: TenancyPolicy | None = None, engine_image: str | None = None) -> dict[str, Any]:
    """apps/v1 Deployment serving `spec.model` on `pool`, speculating with `method` at K / `schedule`
    (no speculation when method is None or K is 0). `replicas=None` leaves spec.replicas out, for an
    external autoscaler (HPA, KEDA) that owns it. The pods run as `tenancy` (the operator config's policy;
    its defaults when None) allows: a spec it refuses raises TenancyViolation. `engine_image` is the vLLM image
    the profiles measured (policy.needs.engine_image: model.image when the deployment sets it, else the
    operator config's defaultEngineImage); None: spec.model.image."""
    policy = tenancy or TenancyPolicy()
    refuse(serving_problems(spec, policy))
    security = policy.pod_security
    port = spec.serving.port
    args = engine_args(spec, method=method, num_speculative_tokens=num_speculative_tokens,
                       schedule=schedule, port=port)
    speculating = SPECULATIVE_CONFIG_FLAG in args
    rollout = pool.rollout or spec.serving.rollout
    gpu_count = spec.model.tensor_parallel_size * spec.model.data_parallel_size
    owned_engine = {"name": ENGINE_CONTAINER, "image": engine_image or spec.model.image,
                    "command": list(ENGINE_COMMAND), "args": args}
    engine = {
        **owned_engine,
        "env": with_identity_env(engine_env(spec), security),
        "ports": [http_port(port)],
        "resources": gpu_resources(spec.model.resources, pool.gpu_resource_name, gpu_count),
        "startupProbe": startup_probe(),
        "readinessProbe": health_probe(period_seconds=5, failure_threshold=3),
        "livenessProbe": health_probe(period_seconds=15, failure_threshold=4, timeout_seconds=10),
        "volumeMounts": [dshm_mount(), home_mount(security)],
    }
    base_pod_spec = {
        # A Service named like an env prefix (e.g. `vllm`) would inject VLLM_PORT=tcp://..., which vLLM
        # reads as its own setting and fails on.
        "enableServiceLinks": False,
        "serviceAccountName": SERVING_SERVICE_ACCOUNT,
        "automountServiceAccountToken": False,
        "terminationGracePeriodSeconds": 60,
        **pool_placement(pool),
        "containers": [engine],
        "volumes": [dshm_volume(), home_volume()],
    }
    pod_spec = deep_merge(base_pod_spec, spec.serving.pod_overrides)
    restore_container(pod_spec, owned_engine, gpu_resource_name=pool.gpu_resource_name, gpu_count=gpu_count)
    restore_placement(pod_spec, pool)
    if not policy.allows("serviceAccountName"):
        pod_spec["serviceAccountName"] = SERVING_SERVICE_ACCOUNT
    if not policy.allows("automountServiceAccountToken"):
        pod_spec["automountServiceAccountToken"] = False
    pod_spec["enableServiceLinks"] = False
    harden(pod_spec, policy)

    pod_labels = names.serving_labels(sdep_name, pool.name)
    pod_labels[names.LABEL_SPECULATION] = "on" if speculating else "off"
    if speculating and method is not None:
        pod_labels[names.LABEL_METHOD] = method.key
    deployment_spec: dict[str, Any] = {
        "selector": {"matchLabels": names.serving_selector(sdep_name, pool.name)},
        "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": rollout.max_unavailable,
                                                                "maxSurge": rollout.max_surge}},
        "revisionHistoryLimit": 5,
        "progressDeadlineSeconds": rollout.progress_deadline_seconds,
        "template": {
            "metadata": {
                "labels": pod_labels,
                "annotations": {
                    "prometheus.io/scrape": "true",
                    "prometheus.io/port": str(port),
                    "prometheus.io/path": "/metrics",
                    names.ANNOTATION_ENGINE_CONFIG: engine_config_hash(args),
                },
            },
            "spec": pod_spec,
        },
    }
    if replicas is not None:
        deployment_spec = {"replicas": replicas, **deployment_spec}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": names.serving_deployment_name(sdep_name, pool.name),
            "namespace": namespace,
            "labels": names.serving_labels(sdep_name, pool.name),
            "ownerReferences": [sdep_owner(sdep_name, uid)],
        },
        "spec": deployment_spec,
    }


def service(*, sdep_name: str, namespace: str, uid: str, spec: SpeculativeDeploymentSpec) -> dict[str, Any]:
    """ClusterIP Service over the serving pods of every pool: clients see one OpenAI endpoint."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": names.service_name(sdep_name),
            "namespace": namespace,
            "labels": names.deployment_labels(sdep_name),
            "ownerReferences": [sdep_owner(sdep_name, uid)],
        },
        "spec": {
            "type": "ClusterIP",
            "selector": names.service_selector(sdep_name),
            "ports": [{"name": "http", "port": spec.serving.port, "targetPort": "http", "protocol": "TCP"}],
        },
    }


def pool_service(*, sdep_name: str, namespace: str, uid: str, spec: SpeculativeDeploymentSpec,
                 pool_name: str) -> dict[str, Any]:
    """ClusterIP Service over one pool's serving pods: the backend of that pool in the HTTPRoute (routing:
    gateway). The deployment's one Service over every pool stays beside it."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": names.pool_service_name(sdep_name, pool_name),
            "namespace": namespace,
            "labels": {**names.deployment_labels(sdep_name), names.LABEL_POOL: names.label_value(pool_name)},
            "ownerReferences": [sdep_owner(sdep_name, uid)],
        },
        "spec": {
            "type": "ClusterIP",
            "selector": names.serving_selector(sdep_name, pool_name),
            "ports": [{"name": "http", "port": spec.serving.port, "targetPort": "http", "protocol": "TCP"}],
        },
    }


INFERENCE_GROUP = "inference.networking.k8s.io"
"""API group of the Gateway API Inference Extension's InferencePool (v1)."""


def inference_pool(*, sdep_name: str, namespace: str, uid: str, spec: SpeculativeDeploymentSpec, pool_name: str,
                   picker: EndpointPickerRef) -> dict[str, Any]:
    """inference.networking.k8s.io/v1 InferencePool over one pool's serving pods (routing: inferencePool): the
    pool's own selector (the deployment's, the pool's and the serving component's labels, so no other deployment's
    or pool's pods, nor benchmark pods, are members), the serving port, and the endpoint picker that chooses the
    pod inside it (`picker`: a Service in the same namespace; unnamed, `<InferencePool>-epp`)."""
    name = names.inference_pool_name(sdep_name, pool_name)
    return {
        "apiVersion": f"{INFERENCE_GROUP}/v1",
        "kind": "InferencePool",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {**names.deployment_labels(sdep_name), names.LABEL_POOL: names.label_value(pool_name)},
            "ownerReferences": [sdep_owner(sdep_name, uid)],
        },
        "spec": {
            "selector": {"matchLabels": names.serving_selector(sdep_name, pool_name)},
            "targetPorts": [{"number": spec.serving.port}],
            "appProtocol": "http",
            "endpointPickerRef": {
                "group": "", "kind": "Service", "name": picker.name or names.endpoint_picker_name(name),
                "port": {"number": picker.port}, "failureMode": EndpointPickerFailureMode(picker.failure_mode).value,
            },
        },
    }


def http_route(*, sdep_name: str, namespace: str, uid: str, spec: SpeculativeDeploymentSpec,
               weights: dict[str, int], parent_refs: list[ParentRef],
               backends: Routing = Routing.GATEWAY) -> dict[str, Any]:
    """gateway.networking.k8s.io/v1 HTTPRoute in the deployment's namespace, attached to `parent_refs` (the spec's
    gateway.parentRefs, else the operator's defaultGatewayParentRefs), sending every request to the pools by
    `weights` (pool -> backendRefs weight, e.g. `policy.fleet.route_weights` of the planned shares): to each pool's
    Service (`backends` gateway) or InferencePool (inferencePool). Pools in `weights` order; a weight of 0 keeps
    the pool listed and sends it nothing."""
    if not weights:
        raise ValueError("an HTTPRoute needs at least one pool to route to")
    if not parent_refs:
        raise ValueError("an HTTPRoute needs a Gateway to attach to")
    parents = []
    for ref in parent_refs:
        parent: dict[str, Any] = {"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": ref.name}
        if ref.namespace is not None:
            parent["namespace"] = ref.namespace
        if ref.section_name is not None:
            parent["sectionName"] = ref.section_name
        if ref.port is not None:
            parent["port"] = ref.port
        parents.append(parent)
    if backends is Routing.INFERENCE_POOL:
        refs = [{"group": INFERENCE_GROUP, "kind": "InferencePool", "name": names.inference_pool_name(sdep_name, pool),
                 "weight": int(weight)} for pool, weight in weights.items()]
    else:
        refs = [{"group": "", "kind": "Service", "name": names.pool_service_name(sdep_name, pool),
                 "port": spec.serving.port, "weight": int(weight)} for pool, weight in weights.items()]
    return {
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "HTTPRoute",
        "metadata": {
            "name": names.http_route_name(sdep_name),
            "namespace": namespace,
            "labels": names.deployment_labels(sdep_name),
            "ownerReferences": [sdep_owner(sdep_name, uid)],
        },
        "spec": {
            "parentRefs": parents,
            "rules": [{"matches": [{"path": {"type": "PathPrefix", "value": "/"}}], "backendRefs": refs}],
        },
    }


def pod_monitor(*, sdep_name: str, namespace: str, uid: str) -> dict[str, Any]:
    """monitoring.coreos.com/v1 PodMonitor scraping /metrics of every serving pod, labelled by pool."""
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PodMonitor",
        "metadata": {
            "name": names.pod_monitor_name(sdep_name),
            "namespace": namespace,
            "labels": names.deployment_labels(sdep_name),
            "ownerReferences": [sdep_owner(sdep_name, uid)],
        },
        "spec": {
            "selector": {"matchLabels": names.service_selector(sdep_name)},
            "namespaceSelector": {"matchNames": [namespace]},
            "podMetricsEndpoints": [{"port": "http", "path": "/metrics"}],
            "podTargetLabels": [names.LABEL_POOL, names.LABEL_DEPLOYMENT],
        },
    }
