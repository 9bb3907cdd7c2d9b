"""Deterministic names, labels and selectors of every object the operator creates.

Names are DNS-1123 labels of at most 63 characters (Job names end up in the `job-name` label, Service
names must be DNS-1035 labels). A name that fits is used as is; one that had to be shortened or
cleaned gets a short hash of the full name, so two long names never collide and the same inputs
always give the same name (a restarted operator finds its own objects).
"""

from __future__ import annotations

import hashlib
import re

MAX_NAME_LENGTH = 63
HASH_LENGTH = 8

BENCH_CONTAINER = "bench"
"""The benchmark pod's measuring container: it alone holds the ServiceAccount token and the result token, and
takes no tenant environment, volumes or mounts."""
ENGINE_CONTAINER = "engine"
"""The engine container of a serving pod, and of a benchmark pod (there it runs the tenant's engine image, with
the tenant's environment and mounts, and no token of any kind)."""
SUPERVISOR_INSTALL_CONTAINER = "supervisor-install"
"""The benchmark pod's init container that copies the engine supervisor into the engine container's reach."""
OWNED_CONTAINER_NAMES = frozenset({BENCH_CONTAINER, ENGINE_CONTAINER, SUPERVISOR_INSTALL_CONTAINER})
"""Container names specpilot's pods use for their own containers: a tenant's extra container may not reuse them."""

BENCH_SERVICE_ACCOUNT = "specpilot-bench"
"""ServiceAccount, Role and RoleBinding of the benchmark Jobs: one set per namespace."""

LABEL_NAME = "app.kubernetes.io/name"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
LABEL_INSTANCE = "app.kubernetes.io/instance"
LABEL_COMPONENT = "app.kubernetes.io/component"
LABEL_DEPLOYMENT = "specpilot.io/deployment"
LABEL_POOL = "specpilot.io/pool"
LABEL_PROFILE = "specpilot.io/profile"
LABEL_SPECULATION = "specpilot.io/speculation"
LABEL_METHOD = "specpilot.io/method"
LABEL_RUN_K = "specpilot.io/run-k"
LABEL_REFINE_ROUND = "specpilot.io/refine-round"
"""On a refinement Job (and its pod): the round it measures, from 1."""
ANNOTATION_ENGINE_CONFIG = "specpilot.io/engine-config"

MANAGED_BY = "specpilot"
COMPONENT_SERVING = "serving"
COMPONENT_BENCHMARK = "benchmark"

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS_1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


def short_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:HASH_LENGTH]


def _clean(text: str) -> str:
    return re.sub(r"-+", "-", re.sub(r"[^a-z0-9-]", "-", text.lower())).strip("-")


def dns_label(head: str, tail: str = "", *, letter_first: bool = False) -> str:
    """`head + tail` as a DNS-1123 label (DNS-1035 with `letter_first`) of at most 63 characters.

    `tail` (a pool name, `-k3`) is kept whole; `head` (a user's resource name) is what gets shortened,
    followed by a hash of the unaltered `head + tail`.
    """
    full = head + tail
    pattern = _DNS_1035_LABEL if letter_first else _DNS_LABEL
    if len(full) <= MAX_NAME_LENGTH and pattern.match(full):
        return full
    clean_tail = _clean(tail)
    clean_tail = f"-{clean_tail}" if clean_tail else ""
    room = MAX_NAME_LENGTH - len(clean_tail) - HASH_LENGTH - 1
    stem = _clean(head)[:room].rstrip("-")
    if letter_first and not stem[:1].isalpha():
        stem = ("x" + stem)[:room].rstrip("-")
    stem = f"{stem}-" if stem else ("x" if letter_first else "")
    return f"{stem}{short_hash(full)}{clean_tail}"


def label_value(text: str) -> str:
    """`text` as a label value (<= 63 characters of [A-Za-z0-9-_.]); hashed when it has to change."""
    if len(text) <= MAX_NAME_LENGTH and _LABEL_VALUE.match(text):
        return text
    stem = re.sub(r"[^A-Za-z0-9_.-]", "-", text)[: MAX_NAME_LENGTH - HASH_LENGTH - 1]
    stem = re.sub(r"^[^A-Za-z0-9]+|[^A-Za-z0-9]+$", "", stem)
    return f"{stem}-{short_hash(text)}" if stem else short_hash(text)


def serving_deployment_name(sdep_name: str, pool_name: str) -> str:
    """apps/v1 Deployment of one pool: `<sdep>-<pool>`."""
    return dns_label(sdep_name, f"-{pool_name}")


def service_name(sdep_name: str) -> str:
    """Service over all pools: `<sdep>` (a DNS-1035 label, so it starts with a letter)."""
    return dns_label(sdep_name, letter_first=True)


def pool_service_name(sdep_name: str, pool_name: str) -> str:
    """Service over one pool's serving pods (routing: gateway): `<sdep>-<pool>` (a DNS-1035 label)."""
    return dns_label(sdep_name, f"-{pool_name}", letter_first=True)


def inference_pool_name(sdep_name: str, pool_name: str) -> str:
    """InferencePool over one pool's serving pods (routing: inferencePool): `<sdep>-<pool>`, as its Service would be
    named (a DNS-1035 label, so `<name>-epp` is a valid Service name for its endpoint picker)."""
    return pool_service_name(sdep_name, pool_name)


def endpoint_picker_name(inference_pool: str) -> str:
    """The endpoint picker Service an InferencePool names when the spec names none: `<InferencePool>-epp`, as the
    Inference Extension's chart deploys it beside a pool (cut to a DNS-1035 label)."""
    return dns_label(inference_pool, "-epp", letter_first=True)


def http_route_name(sdep_name: str) -> str:
    """Gateway API HTTPRoute over the pools' Services or InferencePools (weighted routing): `<sdep>`."""
    return dns_label(sdep_name)


def pod_monitor_name(sdep_name: str) -> str:
    """Prometheus-operator PodMonitor over the serving pods: `<sdep>`."""
    return dns_label(sdep_name)


def bench_job_name(profile_name: str, run_k: int | None = None) -> str:
    """Benchmark Job: `bench-<profile>`, plus `-k<K>` for a per-run (sidecar) Job."""
    return dns_label(f"bench-{profile_name}", "" if run_k is None else f"-k{run_k}")


def refine_job_name(profile_name: str, round_index: int, part: int | None = None) -> str:
    """Refinement Job of a profile: `refine-<profile>-r<round>`, one name per round, distinct from
    the profile's benchmark Job (`bench-<profile>`), so a round never collides with the Job that measured
    the profile or with an earlier round (finished Jobs stay a day). `part` (from 1) tells apart several
    Jobs of one profile in one round: `refine-<profile>-r<round>-<part>`."""
    if round_index < 1:
        raise ValueError(f"a refinement round is numbered from 1 (got {round_index})")
    if part is not None and part < 1:
        raise ValueError(f"a refinement Job's part is numbered from 1 (got {part})")
    return dns_label(f"refine-{profile_name}", f"-r{round_index}" + ("" if part is None else f"-{part}"))


def deployment_labels(sdep_name: str) -> dict[str, str]:
    """Labels every object of a SpeculativeDeployment carries."""
    value = label_value(sdep_name)
    return {
        LABEL_NAME: "vllm",
        LABEL_MANAGED_BY: MANAGED_BY,
        LABEL_INSTANCE: value,
        LABEL_DEPLOYMENT: value,
    }


def serving_selector(sdep_name: str, pool_name: str) -> dict[str, str]:
    """matchLabels of one pool's Deployment (immutable once created: nothing here may change)."""
    return {
        LABEL_DEPLOYMENT: label_value(sdep_name),
        LABEL_POOL: label_value(pool_name),
        LABEL_COMPONENT: COMPONENT_SERVING,
    }


def service_selector(sdep_name: str) -> dict[str, str]:
    """Serving pods of every pool of the SpeculativeDeployment (benchmark pods carry another component)."""
    return {LABEL_DEPLOYMENT: label_value(sdep_name), LABEL_COMPONENT: COMPONENT_SERVING}


def serving_labels(sdep_name: str, pool_name: str) -> dict[str, str]:
    """Labels of one pool's Deployment and its pods."""
    return {**deployment_labels(sdep_name), **serving_selector(sdep_name, pool_name)}


def bench_labels(profile_name: str, pool_name: str, sdep_name: str | None = None,
                 run_k: int | None = None) -> dict[str, str]:
    """Labels of a benchmark Job and its pod. A profile can serve several SpeculativeDeployments; the one
    that asked for it (when given) is recorded so the operator can count its Jobs per pool."""
    labels = {
        LABEL_NAME: "specpilot-bench",
        LABEL_MANAGED_BY: MANAGED_BY,
        LABEL_COMPONENT: COMPONENT_BENCHMARK,
        LABEL_PROFILE: label_value(profile_name),
        LABEL_POOL: label_value(pool_name),
    }
    if sdep_name is not None:
        labels[LABEL_INSTANCE] = labels[LABEL_DEPLOYMENT] = label_value(sdep_name)
    if run_k is not None:
        labels[LABEL_RUN_K] = str(run_k)
    return labels


def bench_rbac_labels() -> dict[str, str]:
    """Labels of the per-namespace benchmark ServiceAccount, Role and RoleBinding."""
    return {LABEL_NAME: "specpilot-bench", LABEL_MANAGED_BY: MANAGED_BY, LABEL_COMPONENT: COMPONENT_BENCHMARK}
