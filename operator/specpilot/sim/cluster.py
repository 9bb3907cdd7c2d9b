"""The simulator's connector for whole deployments: a virtual cluster that the operator's decision reads and
changes, as Dynamo's planner has a virtual connector beside its Kubernetes one.

`VirtualCluster.reconcile(now)` builds the snapshot the controller would read (`policy.plan.DeploymentSnapshot`:
the pools' nodes, the profiles and their benchmark Jobs, each pool's Deployment and observation), runs
`policy.plan.plan_deployment` on it, and makes the plan's actions real in the simulated cluster: profiles created
and restarted, Jobs started, results accepted or failed, Deployments applied (every replica ready at once, as a
Deployment controller with room would leave them). What it does not simulate it takes from the caller: the nodes
(`add_node`), a Job's result (`publish`) or a profile measured before (`accept`), the pools' load (`observe`), and,
for a caller that simulates the pods, how many of a Deployment's replicas are ready (`set_ready`).
"""

from __future__ import annotations

import copy
import dataclasses
from datetime import datetime

from ..api.deployment_spec import SpeculativeDeploymentSpec
from ..api.deployment_status import SpeculativeDeploymentStatus
from ..config import OperatorConfig
from ..observe.model import PoolObservation
from ..manifests.serving import serving_deployment
from ..policy import profiling
from ..policy.needs import engine_image, needed_profiles
from ..policy.plan import (
    ApplyDeployment,
    DeploymentPlan,
    DeploymentSnapshot,
    PoolReadings,
    PoolSnapshot,
    RestartProfile,
    RoutingApis,
    plan_deployment,
    settle,
)
from ..policy.planner import Serve
from ..policy.pools import NodeInfo, allocatable_gpus, pool_views, price_per_gpu_hour
from ..policy.profiling import Need

__all__ = ["CREATED", "VirtualCluster"]

CREATED = "Created"
"""A benchmark Job the operator created whose pod does not run yet."""
SERVED_ROUTING = RoutingApis(http_routes=True, inference_pools=True)
"""The virtual cluster serves the Gateway API and the Inference Extension: a spec's routing runs as it asks (auto
with a Gateway named routes by weights)."""


@dataclasses.dataclass
class VirtualCluster:
    """One SpeculativeDeployment on a simulated cluster."""

    spec: SpeculativeDeploymentSpec
    name: str = "llama"
    namespace: str = "default"
    config: OperatorConfig = dataclasses.field(default_factory=OperatorConfig)
    nodes: list[NodeInfo] = dataclasses.field(default_factory=list)
    allocatable: dict[str, int] = dataclasses.field(default_factory=dict)
    """Node name -> GPUs it can allocate."""
    profiles: dict[str, dict] = dataclasses.field(default_factory=dict)
    """The namespace's profiles by name, as stored (spec, status)."""
    verdicts: dict[str, str] = dataclasses.field(default_factory=dict)
    """Profile name -> the operator's verdict (Succeeded, Failed)."""
    jobs: dict[str, str] = dataclasses.field(default_factory=dict)
    """Profile name -> its benchmark Job's state: Active, Complete, or Created (its pod not running yet)."""
    deployments: dict[str, dict] = dataclasses.field(default_factory=dict)
    """Pool -> its serving Deployment (the operator's manifest, with the status a Deployment controller gives it)."""
    serving: dict[str, Serve] = dataclasses.field(default_factory=dict)
    """Pool -> how its Deployment's engines run."""
    observations: dict[str, PoolObservation] = dataclasses.field(default_factory=dict)
    status: SpeculativeDeploymentStatus = dataclasses.field(default_factory=SpeculativeDeploymentStatus)
    needs: dict[str, Need] = dataclasses.field(default_factory=dict)
    """The profiles the last snapshot needed, by name (what a CreateProfile creates)."""
    demand_history: tuple[tuple[datetime, float], ...] = ()
    """The demand (time, output tokens/s) the deployment's metrics hold from before (what the operator reads from
    Prometheus while its status keeps no history)."""
    forecast_tokens_per_second: float | None = None
    """A demand forecast the fleet planner is told instead of its own (the simulator's clairvoyant reference)."""

    # --- what the caller simulates ----------------------------------------------------------------------------

    def add_node(self, name: str, labels: dict[str, str], gpus: int = 8) -> None:
        self.nodes.append(NodeInfo(name=name, labels=dict(labels)))
        self.allocatable[name] = gpus

    def publish(self, name: str, result: dict, completed_at: datetime) -> None:
        """The profile's benchmark Job wrote its result (`result`: the status fields it writes) and completed."""
        self.profiles[name] = {**self.profiles[name], "status": {
            **self.profiles[name].get("status", {}), **copy.deepcopy(result),
            "completedAt": completed_at.isoformat()}}
        self.jobs[name] = profiling.COMPLETE

    def accept(self, pool: str, bodies: dict[str, dict]) -> None:
        """The pool's profiles on its GPU type as measured before and accepted (`bodies`: the profile's body by the
        needed profile's key, baseline or a candidate's), as a deployment finds them after an earlier profiling."""
        views = pool_views(self.spec, self.nodes)
        for need in needed_profiles(self.spec, views, self.config):
            if need.pool == pool and need.key in bodies:
                self.profiles[need.name] = {**copy.deepcopy(bodies[need.key]), "metadata": {"name": need.name}}
                self.verdicts[need.name] = profiling.SUCCEEDED
                self.jobs.pop(need.name, None)

    def set_ready(self, pool: str, ready: int, rolling_out: bool = False) -> None:
        """The pool's Deployment has `ready` replicas serving (its pods as the caller simulates them), and a rollout
        of its template in progress or not."""
        deployment = self.deployments.get(pool)
        if deployment is None:
            return
        replicas = int(deployment["spec"]["replicas"])
        deployment["status"] = {**deployment["status"], "readyReplicas": ready, "availableReplicas": ready,
                                "updatedReplicas": 0 if rolling_out else replicas}

    def start_pods(self) -> None:
        """The created Jobs' pods are scheduled and running."""
        self.jobs = {n: profiling.ACTIVE if state == CREATED else state for n, state in self.jobs.items()}

    def observe(self, pool: str, observation: PoolObservation | None) -> None:
        """The pool's load as its pods' metrics would show it from now on (None: no metrics)."""
        if observation is None:
            self.observations.pop(pool, None)
        else:
            self.observations[pool] = observation

    # --- the operator's decision on it ------------------------------------------------------------------------

    def reconcile(self, now: datetime) -> DeploymentPlan:
        """One reconciliation: snapshot, `plan_deployment`, the plan's actions."""
        plan = plan_deployment(self.snapshot(now))
        self.apply(plan, now)
        return plan

    def snapshot(self, now: datetime) -> DeploymentSnapshot:
        views = pool_views(self.spec, self.nodes)
        needed = needed_profiles(self.spec, views, self.config)
        self.needs = {n.name: n for n in needed}
        pools = []
        for view in views:
            current = self.deployments.get(view.pool.name) if view.primary_sku is not None else None
            ready = int(((current or {}).get("status") or {}).get("readyReplicas") or 0)
            pools.append(PoolSnapshot(
                view=view, current=current, observation=self.observations.get(view.pool.name) if ready else None,
                price_per_gpu_hour=price_per_gpu_hour(view, self.config.gpu_prices_per_hour),
                gpus_available=allocatable_gpus(view, self.allocatable)))
        fresh = [p.view.pool.name for p in pools if p.observation is not None]
        inputs = profiling.ProfilingInputs(
            needed=needed, profiles={n: self._profile_view(n) for n in self.profiles},
            jobs={n: profiling.JobView(f"bench-{n}", profiling.ACTIVE if state == CREATED else state,
                                       active=int(state == profiling.ACTIVE)) for n, state in self.jobs.items()},
            now=now, max_parallel_jobs=self._max_parallel_jobs(), max_age_hours=0)
        return DeploymentSnapshot(
            spec=self.spec, name=self.name, uid=self.name, generation=1, old=self.status, now=now, pools=pools,
            profiling=inputs, profiles=self.profiles, readings=PoolReadings([], fresh),
            routing_apis=SERVED_ROUTING,
            demand_history=self.demand_history, forecast_tokens_per_second=self.forecast_tokens_per_second)

    def apply(self, plan: DeploymentPlan, now: datetime) -> None:
        for action in plan.profiling.actions if plan.profiling else ():
            self._profiling_action(action)
        applied = {}
        for action in plan.actions:
            if isinstance(action, RestartProfile):
                self._restart(action.name)
            elif isinstance(action, ApplyDeployment):
                applied[action.pool] = self._apply_deployment(action)
        settle(plan, applied, self.name, 1, now)
        self.status = plan.status

    # --- the simulated API server and controllers -------------------------------------------------------------

    def _profile_view(self, name: str) -> profiling.ProfileView:
        """As the operator reads a profile: its verdict, else Succeeded once a result is in, else as stored."""
        status = self.profiles[name].get("status") or {}
        verdict = self.verdicts.get(name)
        phase = verdict or (profiling.SUCCEEDED if status.get("runs") else status.get("phase", profiling.PENDING))
        return profiling.ProfileView(phase=phase, verdict=verdict is not None)

    def _max_parallel_jobs(self) -> int:
        set_ = self.spec.profiling.model_fields_set
        return self.spec.profiling.max_parallel_jobs_per_pool if "max_parallel_jobs_per_pool" in set_ \
            else self.config.profiling_defaults.max_parallel_jobs_per_pool

    def _profiling_action(self, action: profiling.Action) -> None:
        if isinstance(action, profiling.CreateProfile):
            spec = self.needs[action.name].spec.dump()
            self.profiles[action.name] = {"metadata": {"name": action.name}, "spec": spec,
                                          "status": {"phase": profiling.PENDING}}
        elif isinstance(action, profiling.Restart):
            self._restart(action.name)
        elif isinstance(action, profiling.StartJob):
            self.jobs[action.name] = CREATED
        elif isinstance(action, profiling.MarkRunning):
            self.profiles[action.name]["status"]["phase"] = profiling.RUNNING
        elif isinstance(action, profiling.Accept):
            self.verdicts[action.name] = profiling.SUCCEEDED
        elif isinstance(action, profiling.MarkFailed):
            self.verdicts[action.name] = profiling.FAILED

    def _restart(self, name: str) -> None:
        self.jobs.pop(name, None)
        self.verdicts.pop(name, None)
        self.profiles[name] = {**self.profiles[name], "status": {"phase": profiling.PENDING}}

    def _apply_deployment(self, action: ApplyDeployment) -> dict:
        """The pool's Deployment as the operator's manifest builder makes it, rolled out at once with every
        replica ready. An external autoscaler's replicas (None) stay as they were."""
        before = self.deployments.get(action.pool)
        serve = action.serve
        pool = next(p for p in self.spec.gpu_pools if p.name == action.pool)
        manifest = serving_deployment(
            sdep_name=self.name, namespace=self.namespace, uid=self.name, spec=self.spec, pool=pool,
            method=serve.method, num_speculative_tokens=serve.num_speculative_tokens, schedule=serve.schedule,
            replicas=serve.replicas, tenancy=self.config.tenancy, engine_image=engine_image(self.spec, self.config))
        replicas = serve.replicas if serve.replicas is not None else \
            int(((before or {}).get("spec") or {}).get("replicas") or 1)
        manifest["metadata"]["generation"] = 1
        manifest["spec"]["replicas"] = replicas
        manifest["status"] = {"observedGeneration": 1, "replicas": replicas, "updatedReplicas": replicas,
                              "readyReplicas": replicas, "availableReplicas": replicas}
        self.serving[action.pool] = serve
        self.deployments[action.pool] = manifest
        return manifest
