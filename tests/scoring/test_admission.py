"""``LaneGate`` with fake requests: exclusion, sharing, alternation, no starvation, cancellation."""

from __future__ import annotations

import asyncio
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.scoring.admission import LaneGate


class Recorder:
    """Requests that hold their lane until released by the test, recording who ran with whom."""

    def __init__(self, gate: LaneGate) -> None:
        self.gate = gate
        self.running: dict[str, int] = {}
        self.order: list[str] = []  # the lane of each request, in admission order
        self.overlaps: list[tuple[str, str]] = []

    async def request(self, lane: str, hold: asyncio.Event | float = 0.0) -> str:
        async with self.gate.lane(lane):
            others = [name for name, n in self.running.items() if n and name != lane]
            self.overlaps += [(lane, other) for other in others]
            self.running[lane] = self.running.get(lane, 0) + 1
            self.order.append(lane)
            try:
                if isinstance(hold, asyncio.Event):
                    await hold.wait()
                else:
                    await asyncio.sleep(hold)
            finally:
                self.running[lane] -= 1
        return lane


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_one_lane_alone_keeps_all_its_concurrency() -> None:
    gate = LaneGate()
    rec = Recorder(gate)
    release = asyncio.Event()
    tasks = [asyncio.create_task(rec.request("base", release)) for _ in range(10)]
    await _settle()
    assert rec.running["base"] == 10 and gate.in_flight == 10
    release.set()
    await asyncio.gather(*tasks)
    assert gate.holder is None and gate.in_flight == 0


async def test_lanes_never_overlap_and_alternate_when_both_wait() -> None:
    gate = LaneGate()
    rec = Recorder(gate)
    first = asyncio.Event()
    holders = [asyncio.create_task(rec.request("base", first)) for _ in range(3)]
    await _settle()
    # An adapter request waits; from now on base newcomers wait too (they would starve it).
    adapter = [asyncio.create_task(rec.request("adapter", 0.01)) for _ in range(2)]
    await _settle()
    late_base = [asyncio.create_task(rec.request("base", 0.01)) for _ in range(2)]
    await _settle()
    assert gate.waiting("adapter") == 2 and gate.waiting("base") == 2
    assert rec.running["base"] == 3  # the late ones did not join the running base batch
    first.set()
    await asyncio.gather(*holders, *adapter, *late_base)
    assert rec.overlaps == []
    assert rec.order == ["base"] * 3 + ["adapter"] * 2 + ["base"] * 2
    assert gate.switches == 2


async def test_no_starvation_under_a_steady_stream_of_one_lane() -> None:
    """Base requests keep arriving, each while others still run: the adapter request gets in anyway."""
    gate = LaneGate()
    rec = Recorder(gate)
    stop = False

    async def stream() -> None:
        tasks = []
        while not stop:
            tasks.append(asyncio.create_task(rec.request("base", 0.05)))
            await asyncio.sleep(0.001)
        await asyncio.gather(*tasks)

    feeder = asyncio.create_task(stream())
    # Until several base requests run at once (polled: a loaded machine may be slow to get there).
    for _ in range(400):
        if rec.running.get("base", 0) > 1:
            break
        await asyncio.sleep(0.005)
    assert rec.running.get("base", 0) > 1
    await asyncio.wait_for(rec.request("adapter", 0.0), timeout=2.0)
    stop = True
    await feeder
    assert rec.overlaps == []
    assert "adapter" in rec.order and rec.order[-1] == "base"  # the stream went on after it


async def test_cancelled_waiter_leaves_the_queue_and_unblocks_the_holding_lane() -> None:
    gate = LaneGate()
    rec = Recorder(gate)
    release = asyncio.Event()
    base = asyncio.create_task(rec.request("base", release))
    await _settle()
    adapter = asyncio.create_task(rec.request("adapter"))
    await _settle()
    blocked_base = asyncio.create_task(rec.request("base", release))
    await _settle()
    assert gate.waiting("base") == 1  # held back for the adapter's turn
    adapter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await adapter
    await _settle()
    # With nobody of another lane waiting, the base newcomer joins the running base batch.
    assert gate.waiting("adapter") == 0 and gate.waiting("base") == 0
    assert rec.running["base"] == 2
    release.set()
    await asyncio.gather(base, blocked_base)
    assert gate.in_flight == 0 and gate.holder is None


async def test_cancelled_running_request_releases_its_place() -> None:
    gate = LaneGate()
    rec = Recorder(gate)
    never = asyncio.Event()
    base = asyncio.create_task(rec.request("base", never))
    await _settle()
    adapter = asyncio.create_task(rec.request("adapter"))
    await _settle()
    assert gate.waiting("adapter") == 1
    base.cancel()
    with pytest.raises(asyncio.CancelledError):
        await base
    assert await asyncio.wait_for(adapter, 1.0) == "adapter"
    assert gate.in_flight == 0


async def test_cancelled_after_admission_but_before_running_gives_the_place_back() -> None:
    gate = LaneGate()
    rec = Recorder(gate)
    base = gate.lane("base")
    await base.__aenter__()
    adapter = asyncio.create_task(rec.request("adapter"))
    await _settle()
    await base.__aexit__(None, None, None)  # the gate passes to the adapter lane and grants its waiter...
    assert gate.holder == "adapter" and gate.in_flight == 1
    adapter.cancel()  # ...which is cancelled before it ever runs
    with pytest.raises(asyncio.CancelledError):
        await adapter
    assert "adapter" not in rec.order
    assert gate.in_flight == 0 and gate.holder is None
    assert await asyncio.wait_for(rec.request("base"), 1.0) == "base"


async def test_a_failing_request_releases_its_place() -> None:
    gate = LaneGate()
    with pytest.raises(RuntimeError):
        async with gate.lane("base"):
            raise RuntimeError("boom")
    assert gate.in_flight == 0 and gate.holder is None
    async with gate.lane("adapter"):
        assert gate.holder == "adapter"


async def test_disabled_gate_orders_nothing() -> None:
    gate = LaneGate(enabled=False)
    rec = Recorder(gate)
    release = asyncio.Event()
    tasks = [asyncio.create_task(rec.request(lane, release)) for lane in ("base", "adapter", "base")]
    await _settle()
    assert rec.running == {"base": 2, "adapter": 1}  # the gate could have ordered them: it did not
    release.set()
    await asyncio.gather(*tasks)
    assert rec.overlaps


@settings(max_examples=40, deadline=None)
@given(
    plan=st.lists(
        st.tuples(st.sampled_from(["base", "adapter", "third"]), st.floats(0, 0.002), st.booleans()),
        min_size=1,
        max_size=40,
    ),
    seed=st.integers(0, 2**16),
)
def test_random_schedules_never_overlap_and_always_finish(plan: list[tuple[str, float, bool]], seed: int) -> None:
    """Any mix of lanes, hold times and cancellations: no two lanes overlap, every request that was
    not cancelled gets in, and the gate ends empty."""

    async def run() -> None:
        gate = LaneGate()
        rec = Recorder(gate)
        rnd = random.Random(seed)
        tasks = []
        for lane, hold, cancel in plan:
            tasks.append((asyncio.create_task(rec.request(lane, hold)), cancel))
            await asyncio.sleep(rnd.choice([0, 0, 0.0005]))
        for task, cancel in tasks:
            if cancel:
                task.cancel()
        results = await asyncio.wait_for(asyncio.gather(*(t for t, _ in tasks), return_exceptions=True), 10)
        assert rec.overlaps == []
        for (_, cancel), result in zip(tasks, results, strict=True):
            if not cancel:
                assert not isinstance(result, BaseException)
        assert gate.in_flight == 0 and gate.holder is None
        assert all(gate.waiting(lane) == 0 for lane in ("base", "adapter", "third"))

    asyncio.run(run())
