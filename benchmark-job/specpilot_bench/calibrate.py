"""Hardware calibration with torch: copy bandwidth and BF16 matmul throughput of the device.

On a GPU (CUDA or ROCm) it measures device-to-device copies and dense BF16 matmuls, the two ceilings
the twin's roofline needs; without one it measures the CPU the same way and labels the result `cpu`,
so a CPU figure is never mistaken for a GPU's. Sizes are small enough to run beside a loaded engine.
Where torch is not installed (`specpilot demo` against the simulated engine) nothing is measured, and
the result says so: backend `not-measured`, no device counted, no figures.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import platform
import time

from specpilot.api.profile import Hardware

NOT_MEASURED = "not-measured"
"""`Hardware.backend` when torch is absent and nothing was measured."""


def _cpu_sync() -> None:
    """CPU ops are synchronous: nothing to wait for."""


def _cpu_name() -> str:
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def _timed(fn, sync, repeats: int) -> float:
    """Best-of-`repeats` seconds of fn() after one warm-up call."""
    fn()
    sync()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        sync()
        best = min(best, time.perf_counter() - start)
    return best


def calibrate_hardware(copy_mib: int | None = None, matmul_n: int | None = None, repeats: int = 5) -> Hardware:
    """Measure the first accelerator torch sees, or the CPU when there is none; without torch, nothing."""
    if importlib.util.find_spec("torch") is None:
        return Hardware(backend=NOT_MEASURED, device_count=0)
    import torch

    if torch.cuda.is_available():
        device = torch.device("cuda", 0)
        props = torch.cuda.get_device_properties(device)
        backend = "rocm" if getattr(torch.version, "hip", None) else "cuda"
        name, count, memory_gib = props.name, torch.cuda.device_count(), props.total_memory / 2**30
        sync = torch.cuda.synchronize
        copy_mib, matmul_n = copy_mib or 1024, matmul_n or 8192
    else:
        device = torch.device("cpu")
        backend, name, count = "cpu", _cpu_name(), 1
        memory_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
        sync = _cpu_sync
        copy_mib, matmul_n = copy_mib or 64, matmul_n or 512

    src = torch.empty(copy_mib * 2**20, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    copy_s = _timed(lambda: dst.copy_(src), sync, repeats)
    # A copy reads and writes every byte once.
    bandwidth_gb_s = 2 * src.numel() / copy_s / 1e9

    a = torch.randn(matmul_n, matmul_n, device=device, dtype=torch.bfloat16)
    b = torch.randn(matmul_n, matmul_n, device=device, dtype=torch.bfloat16)
    matmul_s = _timed(lambda: torch.matmul(a, b), sync, repeats)
    tflops = 2 * matmul_n**3 / matmul_s / 1e12
    del src, dst, a, b
    return Hardware(backend=backend, device_name=name, device_count=count, memory_gib=round(memory_gib, 2),
                    copy_bandwidth_gb_s=round(bandwidth_gb_s, 3), bf16_matmul_tflops=round(tflops, 4))
