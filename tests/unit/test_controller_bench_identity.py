"""The benchmark identity (ServiceAccount, RoleBinding, serving ServiceAccount) of a namespace is ensured by
every reconciliation that needs it the first time, and re-checked by one of them when the re-check falls due
(controller.profiles.ensure_bench_identity)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from specpilot.controller import profiles as profiles_module
from specpilot.controller.profiles import ensure_bench_identity


class Kube:
    def __init__(self, fail: bool = False) -> None:
        self.ensured: list[str] = []
        self.fail = fail

    async def ensure(self, obj: dict) -> tuple[dict, bool]:
        await asyncio.sleep(0.01)  # a request in flight: the other reconciliations run meanwhile
        if self.fail:
            raise ConnectionError("API server unavailable")
        self.ensured.append(f"{obj['kind']}/{obj['metadata']['name']}")
        return obj, False


def _ctx(kube: Kube) -> SimpleNamespace:
    return SimpleNamespace(kube=kube, bench_identity_checked={},
                           config=SimpleNamespace(bench_cluster_role="specpilot-bench"))


def test_a_recheck_is_made_once_by_concurrent_reconciliations_and_a_first_check_by_each(monkeypatch) -> None:
    clock = [1000.0]
    # the module's clock only (asyncio's own sleeps keep the real one)
    monkeypatch.setattr(profiles_module, "time", SimpleNamespace(monotonic=lambda: clock[0]))

    async def scenario() -> None:
        kube = Kube()
        ctx = _ctx(kube)
        await asyncio.gather(*(ensure_bench_identity(ctx, "team-a") for _ in range(4)))
        first = len(kube.ensured)
        assert first == 4 * 3  # none may create a Job before the identity exists: each confirms it
        await asyncio.gather(*(ensure_bench_identity(ctx, "team-a") for _ in range(4)))
        assert len(kube.ensured) == first  # checked recently: nothing sent
        clock[0] += profiles_module.BENCH_IDENTITY_RECHECK_S + 1
        await asyncio.gather(*(ensure_bench_identity(ctx, "team-a") for _ in range(4)))
        assert len(kube.ensured) == first + 3  # the re-check: one reconciliation sends it

    asyncio.run(scenario())


def test_a_failed_recheck_is_made_again_by_the_next_reconciliation(monkeypatch) -> None:
    clock = [1000.0]
    # the module's clock only (asyncio's own sleeps keep the real one)
    monkeypatch.setattr(profiles_module, "time", SimpleNamespace(monotonic=lambda: clock[0]))

    async def scenario() -> None:
        kube = Kube()
        ctx = _ctx(kube)
        await ensure_bench_identity(ctx, "team-a")
        clock[0] += profiles_module.BENCH_IDENTITY_RECHECK_S + 1
        kube.fail = True
        with pytest.raises(ConnectionError):
            await ensure_bench_identity(ctx, "team-a")
        kube.fail = False
        await ensure_bench_identity(ctx, "team-a")  # not claimed for the interval by the failed one
        assert len(kube.ensured) == 6

    asyncio.run(scenario())
