"""Leadership from group membership, on Tansu (several members in one group): one leader per
generation, handed over when the leader leaves, fenced by generation."""

from __future__ import annotations

import asyncio

from prometheus_client import CollectorRegistry

from sidecar.fleet.leadership import Leadership, Term
from sidecar.source.config import KafkaConfig
from sidecar.source.kafka import KafkaEventSource
from sidecar.state.config import StateConfig
from sidecar.state.hooks import RecordingHooks
from sidecar.telemetry.stream_metrics import StreamMetrics
from tests.support.tansu import TansuBroker


class Member:
    def __init__(self, bootstrap: str, topic: str, name: str) -> None:
        cfg = KafkaConfig(
            bootstrap_servers=bootstrap,
            topic=topic,
            group_id=f"g-{topic}",
            client_id=name,
            results_topic=f"{topic}.results",
            dead_letter_topic=f"{topic}.dlq",
            processing_guarantee="at_least_once",
            session_timeout_ms=6000,
            heartbeat_interval_ms=1000,
            revoke_grace_seconds=0.5,
        )
        registry = CollectorRegistry()
        self.leadership = Leadership(registry)
        self.terms: list[Term | None] = []
        self.leadership.subscribe(self.terms.append)
        self.source = KafkaEventSource(
            cfg, StateConfig(), RecordingHooks(), StreamMetrics(registry), leadership=self.leadership
        )
        self.task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self.source.start()
        self.task = asyncio.create_task(self.source.run())

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)
        await self.source.stop()


async def _one_leader(members: list[Member], seconds: float = 60) -> Member:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while True:
        leaders = [m for m in members if m.leadership.term is not None]
        owners = [m for m in members if any(tp.partition == 0 for tp in m.source._workers)]
        if len(leaders) == 1 and owners == leaders:
            return leaders[0]
        assert loop.time() < deadline, f"leaders={len(leaders)} owners of partition 0={len(owners)}"
        await asyncio.sleep(0.2)


async def test_the_owner_of_partition_0_leads_and_hands_over_on_leave(tansu: TansuBroker) -> None:
    topic = "lead"
    await tansu.create_topics([topic, f"{topic}.results", f"{topic}.dlq"], 4)
    members = [Member(tansu.bootstrap_servers, topic, f"m{i}") for i in range(3)]
    for m in members:
        await m.start()
    try:
        first = await _one_leader(members)
        assert first.leadership.term is not None
        generation = first.leadership.term.generation
        await first.stop()
        rest = [m for m in members if m is not first]
        second = await _one_leader(rest)
        assert second.leadership.term is not None
        assert second.leadership.term.generation > generation
        assert first.terms[-1] is None  # the old leader stopped leading when it gave its partitions up
    finally:
        for m in members:
            await m.stop()


def test_a_row_of_a_newer_generation_ends_a_term() -> None:
    lead = Leadership(CollectorRegistry())
    seen: list[Term | None] = []
    lead.subscribe(seen.append)
    lead.assigned({0, 3}, 4, "m-1")
    assert lead.term == Term(4, "m-1")
    lead.superseded(4)  # its own generation: still leading
    lead.superseded(3)
    assert lead.term == Term(4, "m-1")
    lead.superseded(5)  # a successor wrote while this replica was paused
    assert lead.term is None
    lead.assigned({1}, 6, "m-1")  # no partition 0: a follower
    assert lead.term is None
    assert seen == [Term(4, "m-1"), None]
