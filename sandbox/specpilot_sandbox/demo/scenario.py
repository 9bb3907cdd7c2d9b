"""What the demo plays: the cluster's GPU nodes, the SpeculativeDeployment, and the load trace."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..kubelet import SimSettings

NAMESPACE = "demo"
NAME = "llama-8b"

METHODS = {
    "ngram": {"method": "ngram", "numSpeculativeTokens": 4, "promptLookupMax": 4},
    "draft_model": {"method": "draft_model", "model": "meta-llama/Llama-3.2-1B-Instruct", "numSpeculativeTokens": 4},
    "eagle3": {"method": "eagle3", "model": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B", "numSpeculativeTokens": 4},
    # One speculative token: its profile is a single engine start (k=1 is its largest K).
    "eagle3_k1": {"method": "eagle3", "model": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B", "numSpeculativeTokens": 1},
}


@dataclass(frozen=True)
class Phase:
    """Hold `concurrency` requests in flight (over the whole Service) for `duration_s` wall seconds."""

    name: str
    concurrency: int
    duration_s: float


@dataclass
class DemoScenario:
    nodes: list[tuple[str, str, str]]
    """(node name, nvidia.com/gpu.product, pool label) present from the start."""
    joining_node: tuple[str, str, str]
    """The node of a new GPU type: it joins as the last phase begins (after the ramp up and down), and the
    operator profiles it while the cluster serves that phase."""
    levels: list[int]
    """Profiled concurrency levels."""
    requests_per_level: int
    output_len: int
    phases: list[Phase]
    after_join_timeout_s: float
    """How long after joining the new GPU type may take to be profiled and decided."""
    job_deadline_s: int = 600
    """profiling.jobDeadlineSeconds: a benchmark Job still running after this is stopped and fails for good
    (DeadlineExceeded), so a hung one stops the demo with its reason instead of holding its pool undecided."""
    timeout_s: float = 900.0
    """Wall seconds the whole run may take before the demo gives up with a diagnosis (what each profile, Job
    and pool was doing, the operator log's last lines): a stall says where it stalled, not only that it did."""
    sim: SimSettings = field(default_factory=SimSettings)
    methods: list[str] = field(default_factory=lambda: ["ngram", "draft_model"])
    """Candidate methods (from METHODS)."""
    reconcile_interval_s: float = 1.0
    declare_expected_load: bool = True
    """Declare the trace's load as policy.expectedConcurrency (else the operator weighs the profiled levels
    equally until it has observed load)."""

    def expected_concurrency(self) -> list[dict]:
        """The trace's per-replica concurrency (spread over the initial pools), weighted by phase duration."""
        pools = len({pool for _, _, pool in self.nodes})
        weights: dict[int, float] = {}
        for phase in self.phases:
            c = max(1, round(phase.concurrency / pools))
            weights[c] = weights.get(c, 0.0) + phase.duration_s
        return [{"concurrency": c, "weight": round(w, 3)} for c, w in sorted(weights.items())]

    def deployment(self) -> dict:
        pools = sorted({pool for _, _, pool in [*self.nodes, self.joining_node]})
        return {
            "apiVersion": "specpilot.io/v1alpha1",
            "kind": "SpeculativeDeployment",
            "metadata": {"name": NAME, "namespace": NAMESPACE},
            "spec": {
                "model": {"id": "meta-llama/Llama-3.1-8B-Instruct", "servedName": "llama-8b"},
                "methods": [METHODS[m] for m in self.methods],
                "gpuPools": [{"name": pool, "nodeSelector": {"specpilot.io/demo-pool": pool}} for pool in pools],
                "profiling": {
                    "workload": {"name": "sharegpt", "outputLen": self.output_len},
                    "concurrencyLevels": self.levels,
                    "requestsPerLevel": self.requests_per_level,
                    "maxParallelJobsPerPool": 3,
                    "backoffLimit": 1,
                    "jobDeadlineSeconds": self.job_deadline_s,
                    # The simulated GPUs measure the twin without noise (virtual clock, equidistributed
                    # acceptance): measuring a level again gives the same figure, so refinement would add
                    # profiling time and buy nothing. On real GPUs it stays on (the default).
                    "refineBudgetPercent": 0,
                },
                # What the trace will bring per replica, until the operator has observed history of its own.
                "policy": {"objective": "cost",
                           **({"expectedConcurrency": self.expected_concurrency()} if self.declare_expected_load
                              else {})},
                "serving": {"minReplicas": 1, "maxReplicas": 3, "autoscaling": "external"},
                "metrics": {"source": "pods", "intervalSeconds": 5, "windowSeconds": 30},
            },
        }


def default_scenario() -> DemoScenario:
    return DemoScenario(
        nodes=[("a100-node-1", "NVIDIA-A100-SXM4-80GB", "a100"), ("h100-node-1", "NVIDIA-H100-80GB-HBM3", "h100")],
        joining_node=("h200-node-1", "NVIDIA-H200", "h200"),
        levels=[1, 4, 16, 64, 128],
        requests_per_level=4,
        output_len=48,
        methods=["ngram", "eagle3"],
        phases=[Phase("quiet", 8, 10), Phase("busy", 60, 10), Phase("peak", 200, 15), Phase("busy", 60, 8),
                Phase("quiet", 8, 12)],
        after_join_timeout_s=120,
        timeout_s=900,
        sim=SimSettings(time_scale=1, startup_delay_s=1),
    )


def fast_scenario() -> DemoScenario:
    return DemoScenario(
        nodes=[("a100-node-1", "NVIDIA-A100-SXM4-80GB", "a100"), ("h100-node-1", "NVIDIA-H100-80GB-HBM3", "h100")],
        joining_node=("h200-node-1", "NVIDIA-H200", "h200"),
        methods=["eagle3_k1"],
        levels=[1, 16, 64, 128],
        requests_per_level=2,
        output_len=32,
        # The first quiet phase outlasts the pods' metrics interval (5 s), so the load first observed, which the
        # decision weighs until its cooldown, is the quiet one and not a window taken mostly at the peak.
        # The peak outlasts two rounds of its requests (each replica's first burst, which is not measured, and
        # the next), so its ms/token is measured too; the last phase leaves the GPU type that joins as it begins
        # time to start a serving pod and serve.
        phases=[Phase("quiet", 8, 6), Phase("peak", 300, 8), Phase("quiet", 8, 5)],
        after_join_timeout_s=150,
        # About 90 s on two cores with one kept busy; the bound leaves a host five times slower room, and ends
        # (with its diagnosis) before a test runner's own timeout of 600 s would kill it without one.
        timeout_s=480,
        # A Job takes 10-40 s here (three demos at once on two cores: under 60 s); a slower host has room.
        job_deadline_s=240,
        sim=SimSettings(time_scale=1, startup_delay_s=0.25),
        reconcile_interval_s=0.5,
        # K=1 gains little per token over a trace whose tokens come mostly from the peak; weighing the
        # profiled levels equally keeps the demo's quiet phases in view.
        declare_expected_load=False,
    )
