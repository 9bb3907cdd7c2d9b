"""Object names are deterministic, DNS-safe, at most 63 characters and distinct for distinct inputs;
label values are valid; selectors pick exactly the pods they should."""

from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st

from specpilot.manifests import names

DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS_1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")

_label = st.from_regex(r"\A[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?\Z")
sdep_names = st.lists(_label, min_size=1, max_size=5).map(".".join).filter(lambda n: len(n) <= 253)
"""Kubernetes object names: DNS-1123 subdomains, up to 253 characters, dots allowed."""
pool_names = st.from_regex(r"\A[a-z0-9]([a-z0-9-]{0,22}[a-z0-9])?\Z")
profile_names = st.from_regex(r"\A[a-z0-9]([a-z0-9-]{0,49}[a-z0-9])?\Z").map(lambda s: f"{s}-0123456789")
run_ks = st.none() | st.integers(min_value=0, max_value=16)


def assert_dns_label(name: str) -> None:
    assert len(name) <= 63, name
    assert DNS_LABEL.match(name), name


def test_short_names_are_used_as_they_are():
    assert names.serving_deployment_name("llama-70b", "h100") == "llama-70b-h100"
    assert names.service_name("llama-70b") == "llama-70b"
    assert names.pod_monitor_name("llama-70b") == "llama-70b"
    assert names.bench_job_name("h100-sxm-eagle3-0526d0818e") == "bench-h100-sxm-eagle3-0526d0818e"
    assert names.bench_job_name("h100-sxm-eagle3-0526d0818e", 3) == "bench-h100-sxm-eagle3-0526d0818e-k3"


def test_long_names_keep_the_pool_and_k_and_gain_a_hash():
    sdep = "a-very-long-speculative-deployment-name-for-the-llama-3-3-70b-instruct-model"
    name = names.serving_deployment_name(sdep, "h200")
    assert_dns_label(name)
    assert name.startswith("a-very-long-speculative") and name.endswith("-h200")
    assert names.serving_deployment_name(sdep, "h100") != name
    job = names.bench_job_name("h100-sxm-draft-model-" + "x" * 29 + "-0123456789", 4)
    assert_dns_label(job)
    assert job.endswith("-k4") and job.startswith("bench-h100-sxm-draft-model-")


def test_service_name_starts_with_a_letter():
    name = names.service_name("70b-llama")
    assert DNS_1035_LABEL.match(name), name
    assert names.service_name("70b-llama") == name
    assert names.service_name("70b-llama") != names.service_name("71b-llama")


def test_dotted_names_are_cleaned_and_hashed_so_they_do_not_collide():
    a = names.serving_deployment_name("llama.prod", "h100")
    b = names.serving_deployment_name("llama-prod", "h100")
    assert_dns_label(a)
    assert b == "llama-prod-h100"
    assert a != b


@settings(max_examples=200, deadline=None)
@given(sdep=sdep_names, pool=pool_names, profile=profile_names, run_k=run_ks)
def test_every_name_is_a_dns_label_of_at_most_63_characters(sdep, pool, profile, run_k):
    for name in (names.serving_deployment_name(sdep, pool), names.pod_monitor_name(sdep),
                 names.bench_job_name(profile, run_k)):
        assert_dns_label(name)
    service = names.service_name(sdep)
    assert len(service) <= 63 and DNS_1035_LABEL.match(service), service
    assert names.serving_deployment_name(sdep, pool) == names.serving_deployment_name(sdep, pool)
    for value in names.serving_labels(sdep, pool).values():
        assert LABEL_VALUE.match(value) and len(value) <= 63, value
    for value in names.bench_labels(profile, pool, sdep, run_k).values():
        assert LABEL_VALUE.match(value) and len(value) <= 63, value


@settings(max_examples=200, deadline=None)
@given(a=sdep_names, b=sdep_names, pool=pool_names)
def test_distinct_deployments_get_distinct_names_and_label_values(a, b, pool):
    if a != b:
        assert names.serving_deployment_name(a, pool) != names.serving_deployment_name(b, pool)
        assert names.service_name(a) != names.service_name(b)
        assert names.label_value(a) != names.label_value(b)


@settings(max_examples=100, deadline=None)
@given(profile=profile_names, k1=run_ks, k2=run_ks)
def test_per_run_jobs_of_a_profile_have_distinct_names(profile, k1, k2):
    if k1 != k2:
        assert names.bench_job_name(profile, k1) != names.bench_job_name(profile, k2)


def test_standard_labels():
    labels = names.serving_labels("llama-70b", "h100")
    assert labels == {
        "app.kubernetes.io/name": "vllm",
        "app.kubernetes.io/managed-by": "specpilot",
        "app.kubernetes.io/instance": "llama-70b",
        "app.kubernetes.io/component": "serving",
        "specpilot.io/deployment": "llama-70b",
        "specpilot.io/pool": "h100",
    }
    bench = names.bench_labels("h100-sxm-ngram-0123456789", "h100", "llama-70b", 3)
    assert bench["specpilot.io/profile"] == "h100-sxm-ngram-0123456789"
    assert bench["specpilot.io/deployment"] == "llama-70b"
    assert bench["specpilot.io/run-k"] == "3"
    assert "specpilot.io/deployment" not in names.bench_labels("p-0123456789", "h100")


def test_service_selector_takes_every_pool_and_no_benchmark_pod():
    selector = names.service_selector("llama-70b").items()
    assert selector <= names.serving_labels("llama-70b", "h100").items()
    assert selector <= names.serving_labels("llama-70b", "h200").items()
    assert not selector <= names.serving_labels("other", "h100").items()
    assert not selector <= names.bench_labels("p-0123456789", "h100", "llama-70b").items()
    pool_selector = names.serving_selector("llama-70b", "h100").items()
    assert pool_selector <= names.serving_labels("llama-70b", "h100").items()
    assert not pool_selector <= names.serving_labels("llama-70b", "h200").items()
