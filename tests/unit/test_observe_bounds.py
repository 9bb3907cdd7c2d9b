"""Unit tests of the bounded reads (specpilot.observe.bounded), the per-page caps (vllm_metrics.parse_page)
and the Prometheus URL allow-list (specpilot.observe.allowlist). Loopback servers only."""

from __future__ import annotations

import asyncio
import math

import pytest
import yaml
from aiohttp import web

from specpilot.observe import vllm_metrics as vm
from specpilot.observe.allowlist import refusal, url_allowed
from specpilot.observe.bounded import ReadLimits, ReadRefused, bounded_get, new_session, safe_excerpt
from specpilot_sandbox.exporter import VllmMetricsState, render_metrics
from tests.conftest import REPO

SECRET = "INTERNAL-SECRET-TOKEN=x"


def page(**extra: str) -> str:
    state = VllmMetricsState(model_name="m")
    state.set_load(running=2)
    state.set_rates(request_steps_per_second=10, drafts_per_step=1.0, acceptance_per_position=[0.5, 0.25],
                    finished_requests_per_second=1)
    return render_metrics(state).decode() + "".join(extra.values())


async def serve(handler) -> tuple[web.AppRunner, str]:
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handler)
    runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    return runner, f"http://127.0.0.1:{runner.addresses[0][1]}"


async def read(handler, limits: ReadLimits) -> bytes:
    runner, url = await serve(handler)
    try:
        async with new_session(limits) as session:
            return await bounded_get(session, url + "/metrics", limits)
    finally:
        await runner.cleanup()


LIMITS = ReadLimits(max_bytes=64 * 1024, timeout_s=1.0)


async def test_a_page_within_the_bound_is_read_whole():
    async def ok(_):
        return web.Response(text="a" * 1000)

    assert await read(ok, LIMITS) == b"a" * 1000


async def test_a_declared_oversized_answer_is_refused_unread():
    async def big(_):
        return web.Response(body=b"x" * (LIMITS.max_bytes + 1))

    with pytest.raises(ReadRefused, match=r"answer of 65537 bytes is over the 64 KiB limit") as refused:
        await read(big, LIMITS)
    assert refused.value.cut


async def test_an_undeclared_oversized_stream_is_cut_at_the_bound():
    async def stream(request):
        response = web.StreamResponse()
        await response.prepare(request)
        for _ in range(1000):
            await response.write(b"y" * 4096)
        return response

    with pytest.raises(ReadRefused, match=r"answer over the 64 KiB limit .* not read further") as refused:
        await read(stream, LIMITS)
    assert refused.value.cut


async def test_a_trickling_answer_is_cut_at_the_time_bound():
    async def slowloris(request):
        response = web.StreamResponse()
        await response.prepare(request)
        for _ in range(100):
            await response.write(b"z")
            await asyncio.sleep(0.2)
        return response

    with pytest.raises(ReadRefused, match=r"no complete answer within 1 s \(metricsReadLimits.scrapeTimeoutSeconds\)"):
        await read(slowloris, LIMITS)


async def test_an_error_answer_is_reported_by_status_and_size_only():
    async def error(_):
        return web.Response(status=500, text=SECRET * 10, reason=SECRET)

    with pytest.raises(ReadRefused) as refused:
        await read(error, LIMITS)
    assert refused.value.why == f"HTTP 500, {len(SECRET) * 10} bytes, not shown"
    assert not refused.value.cut


async def test_redirects_and_compressed_answers_are_refused():
    async def redirect(_):
        raise web.HTTPFound("http://169.254.169.254/latest/meta-data/")

    async def gzipped(_):
        return web.Response(body=b"\x1f\x8b", headers={"Content-Encoding": "gzip"})

    with pytest.raises(ReadRefused, match=r"^HTTP 302"):
        await read(redirect, LIMITS)
    with pytest.raises(ReadRefused, match="compressed answer"):
        await read(gzipped, LIMITS)


def test_safe_excerpt_drops_control_characters_and_bounds_length():
    assert safe_excerpt("a\x1b[31mb\nc") == "a?[31mb?c"
    assert len(safe_excerpt("x" * 500)) == 120


def test_positions_beyond_k_and_bad_values_are_ignored_and_reported():
    text = page(far='vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="3000000"} 1\n',
                neg='vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="-1"} 1\n',
                inf='vllm:num_requests_waiting{engine="1",model_name="m"} +Inf\n')
    snapshot, cut = vm.parse_page(text, max_positions=2)
    assert len(snapshot.spec_decode.accepted_per_position) == 2
    assert math.isfinite(snapshot.waiting)
    assert "2 position label(s) outside 0..1 (the method's K) ignored" in cut
    assert any("non-finite" in c for c in cut)


def test_a_page_with_too_many_samples_is_refused_and_a_bad_page_is_not_quoted():
    with pytest.raises(vm.TooManySamples, match="more than 10 samples"):
        vm.parse_page(page(), max_samples=10)
    with pytest.raises(ValueError) as error:
        vm.parse_page(f"{SECRET} garbage {{\n")
    assert SECRET not in str(error.value)


def test_a_histogram_with_too_many_buckets_is_dropped():
    buckets = "".join(f'vllm:request_time_per_output_token_seconds_bucket{{le="{i}"}} {i}\n' for i in range(100))
    snapshot, cut = vm.parse_page(page(b=buckets))
    assert snapshot.tpot_buckets == ()
    assert any("buckets" in c for c in cut)


@pytest.mark.parametrize(("url", "allowed", "ok"), [
    ("http://prom.team-a.svc:9090", ["http://prom.team-a.svc:9090"], True),
    ("http://prom.team-a.svc:9090/", ["http://PROM.team-a.svc:9090"], True),
    ("http://prom.team-a.svc", ["http://prom.team-a.svc:80"], True),
    ("https://thanos.example.com/tenants/a", ["https://thanos.example.com/tenants/*"], True),
    ("https://thanos.example.com/tenants", ["https://thanos.example.com/tenants/*"], True),
    ("https://thanos.example.com/tenantsX", ["https://thanos.example.com/tenants/*"], False),
    ("https://thanos.example.com/tenants/../admin", ["https://thanos.example.com/tenants/*"], False),
    ("https://thanos.example.com/tenants/%2e%2e/admin", ["https://thanos.example.com/tenants/*"], False),
    ("http://thanos.example.com/tenants/a", ["https://thanos.example.com/tenants/*"], False),
    ("http://prom.team-a.svc:9090.evil.example", ["http://prom.team-a.svc:9090"], False),
    ("http://user@prom.team-a.svc:9090", ["http://prom.team-a.svc:9090"], False),
    ("http://prom.team-a.svc:9090?x=1", ["http://prom.team-a.svc:9090"], False),
    ("http://169.254.169.254/latest", [], False),
    ("http://prom.team-a.svc:9090/sub", ["http://prom.team-a.svc:9090"], False),
])
def test_allow_list_matching(url: str, allowed: list[str], ok: bool):
    assert url_allowed(url, allowed) is ok


def test_refusal_names_the_field_and_the_fix():
    message = refusal("http://10.0.0.1/", [])
    assert "spec.metrics.prometheusUrl" in message and "allowedPrometheusUrls is empty" in message
    assert "Remove spec.metrics.prometheusUrl" in message
    assert refusal("http://p:9090", ["http://p:9090"]) is None


OWN = "http://prometheus-operated.monitoring.svc:9090"


@pytest.mark.parametrize(("url", "allowed", "ok"), [
    (OWN, [], True),  # the operator's own prometheusUrl: what it reads when the spec names none
    ("http://Prometheus-Operated.monitoring.svc:9090/", [], True),  # the same base, written otherwise
    ("http://prometheus-operated.monitoring.svc:9091", [], False),
    ("https://prometheus-operated.monitoring.svc:9090", [], False),
    ("http://prometheus-operated.monitoring.svc:9090/api/v1/admin", [], False),  # exact, never a prefix
    ("http://prometheus-operated.monitoring.svc:9090?x=1", [], False),
    ("http://user@prometheus-operated.monitoring.svc:9090", [], False),
    ("http://169.254.169.254/latest", [], False),
    ("http://prom.team-a.svc:9090", ["http://prom.team-a.svc:9090"], True),
])
def test_the_operators_own_url_is_allowed_exactly_and_operator_and_validate_agree(url, allowed, ok):
    from types import SimpleNamespace

    from specpilot.api.deployment_spec import SpeculativeDeploymentSpec
    from specpilot.cli import _operator_refusals
    from specpilot.config import OperatorConfig
    from specpilot.controller.observation import prometheus_url_refusal as operator_refusal
    from specpilot.observe.allowlist import prometheus_url_refusal

    config = OperatorConfig(prometheus_url=OWN, allowed_prometheus_urls=allowed)
    doc = yaml.safe_load((REPO / "examples" / "minimal.yaml").read_text())
    doc["spec"]["metrics"] = {"source": "prometheus", "prometheusUrl": url}
    spec = SpeculativeDeploymentSpec.model_validate(doc["spec"])
    decided = prometheus_url_refusal(spec, config)
    assert (decided is None) is ok
    assert operator_refusal(SimpleNamespace(config=config), spec) == decided  # what the operator reports
    _, warnings = _operator_refusals(doc, config)  # what `specpilot validate --operator-config` says
    assert warnings == ([] if ok else [f"warning: the operator would run it without reading its Prometheus "
                                       f"(MetricsAvailable=False, PrometheusUrlNotAllowed): {decided}"])
    # without a prometheusUrl of its own, the operator allows only the allow-list
    assert (prometheus_url_refusal(spec, OperatorConfig(allowed_prometheus_urls=allowed)) is None) is (
        url in allowed)


def test_an_observation_holds_only_physical_numbers_whatever_its_source_sent():
    from datetime import UTC, datetime

    from specpilot.observe.model import PoolObservation

    obs = PoolObservation(replicas_reporting=-2, running_per_replica=-5.0, waiting_per_replica=float("nan"),
                          total_running=float("inf"), total_waiting=3.0, generation_tokens_per_second=-1.0,
                          tpot_p95_ms=float("inf"), acceptance_per_position=[0.8, 1.7, float("nan"), 0.2],
                          drafts_per_step=float("-inf"), mean_acceptance_length=0.5, kv_cache_usage=4.0,
                          observed_at=datetime.now(tz=UTC), window_s=30,
                          concurrency_histogram=[(-3.0, 0.5), (4.0, 0.25), (float("nan"), 0.25)])
    assert obs.replicas_reporting == 0
    assert (obs.running_per_replica, obs.waiting_per_replica, obs.total_running, obs.total_waiting) == (0, 0, 0, 3)
    assert obs.generation_tokens_per_second is None and obs.tpot_p95_ms is None and obs.drafts_per_step is None
    assert obs.mean_acceptance_length is None and obs.kv_cache_usage == 1.0
    assert obs.acceptance_per_position == [0.8, 1.0]
    assert obs.concurrency_histogram == [(4.0, 1.0)]
