"""The operator's reconciliation slots (controller.handlers.Slots): the reconciliations of a change go before
the periodic ones, each kind in the order it asked, and a waiter that is cancelled takes no slot with it."""

from __future__ import annotations

import asyncio

import pytest

from specpilot.controller.handlers import Slots, _counted
from specpilot.controller.metrics import OperatorMetrics


async def _holder(slots: Slots, urgent: bool, order: list[str], name: str, release: asyncio.Event) -> None:
    await slots.acquire(urgent)
    order.append(name)
    try:
        await release.wait()
    finally:
        slots.release()


def test_a_change_is_reconciled_before_the_periodic_ticks_that_asked_first() -> None:
    async def scenario() -> list[str]:
        slots, order, go = Slots(1), [], asyncio.Event()
        first = asyncio.create_task(_holder(slots, False, order, "tick-0", go))
        await asyncio.sleep(0)
        tasks = [asyncio.create_task(_holder(slots, False, order, f"tick-{i}", go)) for i in (1, 2)]
        await asyncio.sleep(0)
        tasks += [asyncio.create_task(_holder(slots, True, order, f"change-{i}", go)) for i in (1, 2)]
        await asyncio.sleep(0.01)
        go.set()
        await asyncio.gather(first, *tasks)
        return order

    assert asyncio.run(scenario()) == ["tick-0", "change-1", "change-2", "tick-1", "tick-2"]


def test_a_cancelled_waiter_leaves_its_turn_to_the_next() -> None:
    async def scenario() -> list[str]:
        slots, order, go = Slots(1), [], asyncio.Event()
        holder = asyncio.create_task(_holder(slots, True, order, "holder", go))
        await asyncio.sleep(0)
        gone = asyncio.create_task(_holder(slots, True, order, "gone", go))
        after = asyncio.create_task(_holder(slots, False, order, "after", go))
        await asyncio.sleep(0.01)
        gone.cancel()
        go.set()
        await asyncio.gather(holder, after)
        assert gone.cancelled()
        # a holder that is cancelled hands its slot on, in order
        handed = asyncio.create_task(_holder(slots, True, order, "handed", asyncio.Event()))
        await asyncio.sleep(0)
        next_ = asyncio.create_task(_holder(slots, True, order, "next", go))
        blocker = asyncio.create_task(slots.acquire(True))
        await asyncio.sleep(0.01)
        handed.cancel()  # its release hands the slot to `next`, whose release hands it to `blocker`
        await asyncio.gather(next_, return_exceptions=True)
        await asyncio.wait_for(blocker, 1)
        slots.release()
        return order

    assert asyncio.run(scenario()) == ["holder", "after", "handed", "next"]


@pytest.mark.parametrize("urgent", [False, True], ids=["tick", "change"])
@pytest.mark.parametrize("cancelled_first", [False, True], ids=["handed-then-cancelled", "cancelled-then-released"])
def test_a_cancelled_waiter_never_loses_the_slot(cancelled_first: bool, urgent: bool) -> None:
    # released first: the slot is handed to `waiter`, which is cancelled before it runs, and passes it on;
    # cancelled first: the release drops the cancelled turn (no ValueError) and hands the slot on
    async def scenario() -> None:
        slots = Slots(1)
        await slots.acquire(True)
        waiter = asyncio.create_task(slots.acquire(urgent))
        other = asyncio.create_task(slots.acquire(False))
        await asyncio.sleep(0)
        if cancelled_first:
            waiter.cancel()
            slots.release()
        else:
            slots.release()
            waiter.cancel()
        await asyncio.gather(waiter, return_exceptions=True)
        assert waiter.cancelled()
        await asyncio.wait_for(other, 1)  # the slot went on to `other` instead of being lost
        slots.release()
        await asyncio.wait_for(slots.acquire(True), 1)  # and one slot is free again after

    asyncio.run(scenario())


def test_a_tick_waiting_for_a_slot_does_not_hold_its_deployment_back() -> None:
    # the slot is taken before the deployment's lock: a periodic tick of deployment A waiting for a slot
    # holds no lock, so a change of A waits only for a slot, and gets the first free one
    async def scenario() -> list[str]:
        metrics, queue, slots, lock_a, go = OperatorMetrics(), {"waiting": 0, "running": 0}, Slots(1), \
            asyncio.Lock(), asyncio.Event()
        order: list[str] = []

        async def reconcile(name: str, lock: asyncio.Lock, urgent: bool) -> None:
            async with _counted(metrics, queue, lock, slots, urgent=urgent):
                order.append(name)
                await go.wait()

        busy = asyncio.create_task(reconcile("B changed", asyncio.Lock(), True))
        await asyncio.sleep(0)
        tick = asyncio.create_task(reconcile("A tick", lock_a, False))
        await asyncio.sleep(0)
        change = asyncio.create_task(reconcile("A changed", lock_a, True))
        await asyncio.sleep(0.01)
        assert not lock_a.locked()
        go.set()
        await asyncio.gather(busy, tick, change)
        return order

    assert asyncio.run(scenario()) == ["B changed", "A changed", "A tick"]
