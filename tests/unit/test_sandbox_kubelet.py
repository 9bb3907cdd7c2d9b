"""The sandbox kubelet's rolling update keeps the Deployment's maxSurge and maxUnavailable promises."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from specpilot_sandbox.kubelet import rollout_step


@dataclass
class Pod:
    template: str
    ready: bool = False


def roll(replicas: int, surge: int, unavailable: int, passes: int = 50) -> list[tuple[int, int]]:
    """Roll `replicas` ready pods of template a to template b; a started pod is ready one pass later.
    Returns (pods, ready pods) after every pass."""
    pods = [Pod("a", ready=True) for _ in range(replicas)]
    seen = []
    for _ in range(passes):
        current = [p for p in pods if p.template == "b"]
        old = [p for p in pods if p.template != "b"]
        to_start, doomed = rollout_step(replicas, surge, unavailable, old, current)
        for pod in doomed:
            pods.remove(pod)
        pods += [Pod("b") for _ in range(to_start)]
        seen.append((len(pods), sum(p.ready for p in pods)))
        if all(p.template == "b" and p.ready for p in pods) and len(pods) == replicas:
            return seen
        for pod in pods:
            pod.ready = True
    raise AssertionError(f"the rollout did not finish in {passes} passes: {seen}")


@pytest.mark.parametrize("replicas", [1, 2, 5])
def test_surge_one_never_drops_capacity(replicas):
    seen = roll(replicas, surge=1, unavailable=0)
    assert all(ready >= replicas for _, ready in seen[:-1])
    assert max(total for total, _ in seen) == replicas + 1


@pytest.mark.parametrize("replicas", [1, 2, 5])
def test_no_surge_never_needs_a_spare_gpu_and_loses_at_most_one_replica(replicas):
    seen = roll(replicas, surge=0, unavailable=1)
    assert max(total for total, _ in seen) <= replicas
    assert min(ready for _, ready in seen) >= replicas - 1


def test_a_wider_rollout_is_faster_within_its_bounds():
    narrow = roll(6, surge=1, unavailable=0)
    wide = roll(6, surge=2, unavailable=2)
    assert len(wide) < len(narrow)
    assert max(total for total, _ in wide) <= 8 and min(ready for _, ready in wide) >= 4


def test_old_pods_that_are_not_ready_stop_at_once():
    old = [Pod("a", ready=False), Pod("a", ready=True)]
    to_start, doomed = rollout_step(2, 1, 0, old, [])
    assert doomed == [old[0]] and to_start == 1


def test_a_container_that_does_not_stop_goes_with_every_process_it_started(tmp_path):
    """A supervisor that ignores SIGTERM, whose engine runs in a session of its own: ending the container kills
    the engine too (it used to outlive a bench that failed, orphaned, once its supervisor was killed alone)."""
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    from specpilot_sandbox.kubelet import _wait

    pid_file = tmp_path / "engine.pid"
    supervisor = subprocess.Popen([sys.executable, "-c", (
        "import signal, subprocess, sys, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "engine = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'], start_new_session=True)\n"
        f"open({str(pid_file)!r}, 'w').write(str(engine.pid))\n"
        "time.sleep(600)\n")], start_new_session=True)
    while not pid_file.exists() or not pid_file.read_text():
        assert supervisor.poll() is None, "the supervisor stub exited early"
    engine_pid = int(pid_file.read_text())
    _wait(supervisor, timeout_s=0.1, term_grace_s=0.2)
    assert supervisor.returncode == -signal.SIGKILL
    def gone() -> bool:  # killed: no such process, or a zombie waiting for init to reap it
        try:
            return Path(f"/proc/{engine_pid}/stat").read_text().split()[2] == "Z"
        except (FileNotFoundError, ProcessLookupError):
            return True

    for _ in range(1000):  # the kernel delivers SIGKILL at once; wait up to 10 s for it to land
        if gone():
            break
        time.sleep(0.01)
    assert gone(), f"the engine {engine_pid} outlived its container"
