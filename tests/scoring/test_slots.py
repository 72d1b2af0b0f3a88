"""Slots: bounded holders, newest waiter first for trees, cancellation never leaks a slot."""

from __future__ import annotations

import asyncio

import pytest

from sidecar.scoring.schedule import Slots


async def _order(lifo: bool) -> list[int]:
    slots = Slots(1, lifo=lifo)
    order: list[int] = []
    await slots.acquire()

    async def worker(i: int) -> None:
        async with slots:
            order.append(i)

    tasks = []
    for i in range(4):
        tasks.append(asyncio.create_task(worker(i)))
        await asyncio.sleep(0)  # queue them in order 0..3
    slots.release()
    await asyncio.gather(*tasks)
    return order


async def test_lifo_serves_the_newest_waiter_first_and_fifo_the_oldest() -> None:
    assert await _order(lifo=True) == [3, 2, 1, 0]
    assert await _order(lifo=False) == [0, 1, 2, 3]


async def test_a_cancelled_waiter_never_leaks_the_slot() -> None:
    slots = Slots(1, lifo=True)
    await slots.acquire()
    waiter = asyncio.create_task(slots.acquire())
    await asyncio.sleep(0)
    slots.release()  # handed to the waiter...
    waiter.cancel()  # ...which is cancelled before it runs
    with pytest.raises(asyncio.CancelledError):
        await waiter
    await asyncio.wait_for(slots.acquire(), 1)  # the slot came back


async def test_never_more_than_n_holders() -> None:
    slots = Slots(3, lifo=True)
    holding = 0
    peak = 0

    async def work() -> None:
        nonlocal holding, peak
        async with slots:
            holding += 1
            peak = max(peak, holding)
            await asyncio.sleep(0.001)
            holding -= 1

    await asyncio.gather(*(work() for _ in range(50)))
    assert peak == 3
    with pytest.raises(ValueError, match="at least 1"):
        Slots(0)
