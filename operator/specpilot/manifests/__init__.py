"""Pure builders of every Kubernetes object the operator creates: typed models in, JSON-ready dicts out.

No I/O here: the controller applies what these functions return.
"""

from .benchmark import bench_args, benchmark_job
from .engine import engine_args, engine_config_hash, engine_env, speculative_config_json
from .rbac import bench_rbac
from .serving import pod_monitor, service, serving_deployment

__all__ = [
    "bench_args", "bench_rbac", "benchmark_job", "engine_args", "engine_config_hash", "engine_env", "pod_monitor",
    "service", "serving_deployment", "speculative_config_json",
]
