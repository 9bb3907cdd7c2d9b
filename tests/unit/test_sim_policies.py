"""Policies of `specpilot simulate`: the operator's own pool planner on the simulated fleet, and how they compare."""

from __future__ import annotations

import pytest

from specpilot.api.deployment_spec import Hysteresis
from specpilot.api.deployment_status import PoolStatus, SpeculativeDeploymentStatus
from specpilot.api.schedule import k_at
from specpilot.sim.fleet import FleetConfig, FleetSetup, simulate
from specpilot.sim.policies import (
    AutoscalePolicy,
    Candidate,
    FixedPolicy,
    OperatorPolicy,
    PlanningInputs,
    build_policies,
    profile_and_decide_pool,
    replay_agreement,
)
from specpilot.sim.policies import serve_key as _serve_key
from specpilot.sim.report import verdict
from specpilot.sim.traces import ConstantTrace, CsvTrace, DiurnalTrace

SETUP = FleetSetup("meta-llama/Llama-3.1-8B-Instruct", "H100-SXM")
CONFIG = FleetConfig(startup_s=60)


def _run_all(inputs: PlanningInputs, trace, record: bool = False):
    planning = profile_and_decide_pool(inputs, trace)
    policies = build_policies(inputs, planning, record=record)
    results = {p.name: simulate(p, trace, SETUP, CONFIG, slo_tpot_ms=inputs.slo_tpot_ms,
                                max_replicas=inputs.max_replicas, seed=3) for p in policies}
    return planning, policies, results


@pytest.fixture(scope="module")
def diurnal():
    # The planner's capacity already meets the TPOT SLO; 90% keeps a 10% margin for bursts.
    inputs = PlanningInputs(SETUP, (Candidate("eagle3", 4), Candidate("ngram", 4)), replicas=2, max_replicas=4,
                            slo_tpot_ms=15, target_utilization_percent=90)
    return inputs, *_run_all(inputs, DiurnalTrace(duration_s=3600, peak_rps=50, trough_rps=10, period_s=3600),
                             record=True)


def test_policies_run_the_schedule_decide_pool_picked(diurnal):
    inputs, planning, policies, _ = diurnal
    names = [p.name for p in policies]
    assert names == ["no-sd", "always-on", "static<32", "restart-toggle", "specpilot", "specpilot+autoscale",
                     "no-sd+autoscale"]
    chosen = planning.chosen
    assert planning.dynamic.decision.method == chosen.key == "eagle3"
    static = next(p for p in policies if p.name == "static<32")
    assert isinstance(static, FixedPolicy) and static.mode.k_at(31) > 0 and static.mode.k_at(32) == 0
    # The operator policies start from the decision the report shows (the spec's expected load), served
    # as vLLM runs the schedule the Deployment carries.
    for name in ("specpilot", "specpilot+autoscale"):
        policy = next(p for p in policies if p.name == name)
        assert isinstance(policy, OperatorPolicy) and policy.spec.policy.strategy == "dynamic"
        first = policy.steps[0].serve
        assert first.method.key == "eagle3" and first.schedule
        mode = policy.modes["schedule"]
        assert mode.method == "eagle3"
        assert all(mode.k_at(b) == chosen.schedule.k_at(b) == k_at(first.schedule, b, first.num_speculative_tokens)
                   for b in range(1, inputs.max_num_seqs + 1))
    autoscale = next(p for p in policies if p.name == "specpilot+autoscale")
    assert autoscale.spec.serving.autoscaling == "internal"
    reference = next(p for p in policies if p.name == "no-sd+autoscale")
    assert isinstance(reference, AutoscalePolicy)
    assert reference.capacity_per_replica == planning.row(planning.dynamic, None).capacity_concurrency
    assert autoscale.status.capacity_concurrency_per_replica == planning.dynamic.capacity_concurrency_per_replica
    assert {s.serve.replicas for s in autoscale.steps} != {inputs.replicas}, "the operator's replica steps ran"
    restart = next(p for p in policies if p.name == "restart-toggle")
    assert isinstance(restart, OperatorPolicy) and restart.spec.policy.strategy == "restart"
    assert [m.key for m in restart.spec.methods] == ["eagle3"]
    row = next(r for r in planning.restart.candidates if r.key == "eagle3")
    assert restart.steps[0].serve.num_speculative_tokens == row.num_speculative_tokens
    assert restart.steps[0].serve.schedule is None


def test_the_simulator_agrees_with_the_operators_planner_on_every_control_step(diurnal):
    """Simulator vs operator agreement on one trace: every control step of the operator policies, replayed
    through `policy.planner.plan_pool` from the pool's status as read back from the API server (what a
    restarted operator would do with the same observation), serves the same method, K, schedule and
    replicas."""
    _, _, policies, _ = diurnal
    operators = [p for p in policies if isinstance(p, OperatorPolicy)]
    assert [p.name for p in operators] == ["restart-toggle", "specpilot", "specpilot+autoscale"]
    for policy in operators:
        same, steps = replay_agreement(policy)
        assert steps == 3600 // 15 and same == steps, f"{policy.name}: {same}/{steps}"
        # everything the planner remembers is in the status, and it survives the round trip
        for step in policy.steps[1:]:
            assert PoolStatus.model_validate(step.previous).dump() == step.previous


def test_specpilot_beats_every_fixed_policy_at_the_same_replicas(diurnal):
    _, _, _, results = diurnal
    # with the same replicas, the schedule alone already meets the SLO more often than no SD or a fixed k
    assert results["specpilot"].slo_attainment > results["no-sd"].slo_attainment
    assert results["specpilot"].slo_attainment > results["always-on"].slo_attainment
    assert results["specpilot"].tpot_p50_ms < 0.7 * results["no-sd"].tpot_p50_ms


def test_specpilot_autoscale_beats_every_fixed_policy_on_cost_at_equal_or_better_slo_attainment(diurnal):
    _, _, _, results = diurnal
    v = verdict(list(results.values()))
    assert v.beats_all, v.words()
    ours = results["specpilot+autoscale"]
    assert ours.gpu_hours < results["no-sd"].gpu_hours
    assert ours.slo_attainment > 0.99


def test_specpilot_keeps_goodput_at_saturation_where_fixed_k_loses_it():
    inputs = PlanningInputs(SETUP, (Candidate("eagle3", 4),), replicas=2, max_replicas=2)
    trace = ConstantTrace(duration_s=300, rps=120)  # well above what 2 replicas serve
    _, _, results = _run_all(inputs, trace)
    assert results["no-sd"].ttft_p50_ms > 10_000  # saturated: requests queue
    specpilot = results["specpilot"].output_tok_s
    assert specpilot > 1.1 * results["always-on"].output_tok_s
    # At the top of the schedule K is 0 or 1, but the drafter stays loaded (its prefill and KV share are paid
    # under a dynamic schedule): within 2% of the plain engine.
    assert specpilot >= 0.98 * results["no-sd"].output_tok_s
    assert specpilot >= results["static<32"].output_tok_s


def test_restart_toggle_rolls_speculation_off_above_the_crossover():
    inputs = PlanningInputs(SETUP, (Candidate("ngram", 4),), replicas=1, max_replicas=1,
                            hysteresis=Hysteresis(band_percent=10, min_dwell_seconds=60, cooldown_seconds=120))
    # light load for five minutes, then far past what one replica serves
    trace = CsvTrace(duration_s=900, times_s=(0, 299, 300, 900), rates_rps=(5, 5, 40, 40))
    planning = profile_and_decide_pool(inputs, trace)
    policy = next(p for p in build_policies(inputs, planning, record=True) if p.name == "restart-toggle")
    assert isinstance(policy, OperatorPolicy)
    result = simulate(policy, trace, SETUP, CONFIG, max_replicas=1)
    # On the expected load (mostly high) ngram pays where it speculates and, rolled off above the crossover,
    # costs nothing where it does not (issue 29's deploy test): served from the start.
    assert policy.steps[0].serve.method.key == "ngram"
    assert policy.steps[1].serve.method.key == "ngram"
    assert any("roll out sd-on -> sd-off" in what for _, what in result.events)
    # The restart toggle switched it off (the decision still names ngram), with its clocks in the status.
    assert policy.status.decision.method == "ngram" and not policy.status.speculation_enabled
    assert policy.status.last_toggle_at is not None
    assert result.timeseries["mean_k"][-5:].max() == 0
    assert result.timeseries["serving_replicas_min"].min() >= 1


# --- the same steps through the operator's executor ---------------------------------------------------------

class _Cluster:
    """The pool's Deployment as the simulated fleet has it, and what the controller applies."""

    def __init__(self) -> None:
        self.deployment: dict | None = None
        self.applied: list[dict] = []

    async def get(self, plural: str, namespace: str, name: str) -> dict:
        from specpilot.controller.kube import NotFound

        if plural != "deployments" or self.deployment is None or self.deployment["metadata"]["name"] != name:
            raise NotFound(f"{plural}/{name}")
        return self.deployment

    async def apply(self, obj: dict, current: dict | None = None) -> dict:
        self.applied.append(obj)
        return obj

    def applied_deployments(self) -> list[dict]:
        return [obj for obj in self.applied if obj.get("kind") == "Deployment"]


def _engine_runs(deployment: dict, max_num_seqs: int) -> tuple:
    """(method, K per batch size, replicas) that vLLM runs from a Deployment the controller applied."""
    import json

    from specpilot.api.schedule import from_vllm
    from specpilot.manifests.engine import SPECULATIVE_CONFIG_FLAG

    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    replicas = deployment["spec"].get("replicas")
    if SPECULATIVE_CONFIG_FLAG not in args:
        return None, (0,) * max_num_seqs, replicas
    config = json.loads(args[args.index(SPECULATIVE_CONFIG_FLAG) + 1])
    top, ranges = config["num_speculative_tokens"], from_vllm(config.get("num_speculative_tokens_per_batch_size", []))
    k = tuple(k_at(ranges, b, top) if ranges else top for b in range(1, max_num_seqs + 1))
    return config["method"], k, replicas


async def _controller_agreement(policy: OperatorPolicy, monkeypatch) -> tuple[int, int]:
    """(control steps where the operator's executor applies the engine and replicas the simulator ran, steps).

    Each recorded step goes through the controller's own path: `controller.reconcile.read_snapshot` reads the
    Deployment (replicas, rollout) from the cluster and observes (here: the step's observation),
    `policy.plan.plan_deployment` plans from the status as read back, and `controller.reconcile.execute` applies
    the pool's Deployment; what vLLM would run from that Deployment is compared with the simulator's mode."""
    from types import SimpleNamespace

    from specpilot.config import OperatorConfig
    from specpilot.policy.needs import needed_profiles
    from specpilot.policy.pools import pool_views
    from specpilot.controller import reconcile as controller
    from specpilot.controller.context import Context
    from specpilot.controller.metrics import OperatorMetrics
    from specpilot.manifests import names
    from specpilot.policy.plan import plan_deployment
    from specpilot.policy.profiling import all_accepted

    spec = policy.spec
    cluster = _Cluster()
    ctx = Context(kube=cluster, config=OperatorConfig(), metrics=OperatorMetrics(), connection=SimpleNamespace())
    body = {"metadata": {"namespace": "sim", "name": "llama", "uid": "u1", "generation": 1}, "spec": spec.dump()}
    views = pool_views(spec, [], ctx.catalog)
    needed = needed_profiles(spec, views, ctx.config)
    # The profile objects the pool needs, by the names the controller looks for (their own metadata, and so
    # the decision's basis, as the simulator's).
    profiles = {n.name: (policy.profiles.baseline if n.candidate is None else policy.profiles.methods[n.key]).dump()
                for n in needed}
    observation: list = [None]

    async def observe_pool(*_args):
        return observation[0], None

    monkeypatch.setattr(controller, "observe_pool", observe_pool)
    size = policy.connector.max_num_seqs
    same = 0
    for step in policy.steps:
        name = names.serving_deployment_name(body["metadata"]["name"], views[0].pool.name)
        cluster.deployment = {
            "metadata": {"name": name, "generation": 2}, "spec": {"replicas": step.current_replicas},
            "status": {"observedGeneration": 2, "updatedReplicas": 0 if step.rolling_out else step.current_replicas}}
        observation[0] = step.observation
        old = SpeculativeDeploymentStatus(pools=[PoolStatus.model_validate(step.previous)])
        snapshot = await controller.read_snapshot(ctx, body, spec, views, all_accepted(needed, step.now), profiles,
                                                  {}, [], step.observation is not None, {}, None, old, step.now)
        await controller.execute(ctx, body, spec, snapshot, plan_deployment(snapshot), {})
        mode = policy.connector.mode(step.serve)
        sim = (mode.method, mode.k_by_batch_size, step.serve.replicas)
        same += _engine_runs(cluster.applied_deployments()[-1], size) == sim
    assert len(cluster.applied_deployments()) == len(policy.steps)
    return same, len(policy.steps)


async def test_the_operators_executor_agrees_with_the_simulator_on_every_control_step(diurnal, monkeypatch):
    """Simulator vs operator agreement through the controller's own input building and actuation."""
    _, _, policies, _ = diurnal
    for policy in (p for p in policies if isinstance(p, OperatorPolicy)):
        same, steps = await _controller_agreement(policy, monkeypatch)
        assert steps == 240 and same == steps, f"{policy.name}: {same}/{steps}"
    # not a constant answer: the operator policies changed engine or replicas along the trace
    served = {p.name: {_serve_key(s.serve) for s in p.steps} for p in policies if isinstance(p, OperatorPolicy)}
    assert len(served["specpilot+autoscale"]) > 1 and len(served["restart-toggle"]) > 1
