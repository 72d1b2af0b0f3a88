"""The results topic's bytes for what this format gained: a verdict's ``provenance`` (after the
outcome, absent when nothing was judged) and a feedback record, through the real results writer."""

from __future__ import annotations

import json

from prometheus_client import CollectorRegistry

from sidecar.contract import CompletionScored, Provenance, Scored
from sidecar.source.config import KafkaConfig
from sidecar.source.journal import Recovery
from sidecar.source.journal_entry import JournalSigner, read_entry
from sidecar.source.processor import PartitionProcessor
from sidecar.source.results import KafkaResultsWriter
from sidecar.state.config import StateConfig
from sidecar.state.hooks import RecordingHooks
from sidecar.telemetry.stream_metrics import StreamMetrics
from tests.stream.fakes import FakeJournal, Rec, event, record
from tests.stream.test_results_wire import _PLAIN, _KeepingProducer, _run

JUDGE = Provenance("llm-agent-sidecar", "0.1.0", "base", "booking-lora", "route-2", "threshold", 0.4)


async def test_provenance_follows_the_outcome() -> None:
    verdict = CompletionScored(0.25, False, "adapter", "booking-lora", provenance=JUDGE)
    sent = await _run({**_PLAIN, "turn_closed": Scored({"p_end": 0.25}, [verdict])})
    closed = [v for _, _, v in sent if b'"kind":"turn_closed"' in v]
    assert closed[0] == (
        b'{"v":1,"partition":4,"position":2,"trigger":"record","kind":"turn_closed",'
        b'"conversation_id":"conv-1","turn":1,"close_reason":"next_user_message","end_reason":null,'
        b'"agent":"a","tenant":"acme","messages":2,"outcome":{"p_end":0.25},'
        b'"provenance":{"evaluator":"llm-agent-sidecar","evaluator_version":"0.1.0","base_model":"base",'
        b'"adapter":"booking-lora","adapter_version":"route-2","rule":"threshold","threshold":0.4},'
        b'"group":"sidecar-g","topic":"agent.events"}'
    )
    assert all(b"provenance" not in v for _, _, v in sent if b'"kind":"turn_closed"' not in v)


async def test_a_feedback_record_keeps_its_bytes() -> None:
    producer = _KeepingProducer()
    metrics = StreamMetrics(CollectorRegistry())
    cfg = KafkaConfig(
        bootstrap_servers="unused:9092",
        topic="agent.events",
        group_id="sidecar-g",
        results_topic="agent.events.results",
        dead_letter_topic="agent.events.dlq",
    )
    writer = KafkaResultsWriter(producer, cfg, metrics, JournalSigner([]))
    processor = PartitionProcessor(
        partition=4,
        state_config=StateConfig(),
        hooks=RecordingHooks(),
        results=writer,
        dead_letters=FakeJournal(),
        metrics=metrics,
        recovery=Recovery(0, 0, 0, 0),
        max_record_bytes=1 << 20,
        max_pending=64,
        clock=lambda: 0.0,
        wall_clock=lambda: 1_700_000_000.0,
    )
    fb = {"conversation_id": "conv-1", "event_id": "fb-1", "ts": 2, "type": "feedback",
          "feedback": {"target": "turn", "rating": "down", "turn": 1, "reason": "not what I asked"}}  # fmt: skip
    await processor.process(record(0, event("conv-1", 0, "user", "hello")), 0.0, 1_700_000_000.0)
    await processor.process(Rec("t", 0, 1, b"conv-1", json.dumps(fb).encode()), 0.0, 1_700_000_000.0)
    assert await processor.drain(5.0)
    assert await writer.flush(4, 5.0)
    value = next(v for _, _, v in producer.sent if b'"kind":"feedback"' in v)
    assert value == (
        b'{"v":1,"partition":4,"position":1,"trigger":"record","kind":"feedback",'
        b'"conversation_id":"conv-1","turn":1,"close_reason":null,"end_reason":null,"agent":"a",'
        b'"tenant":null,"messages":0,"outcome":{"event_id":"fb-1","target":"turn","rating":"down","turn":1,'
        b'"alert_id":null,"alert_kind":null,"with_reason":true,"conversation_open":true},'
        b'"group":"sidecar-g","topic":"agent.events"}'
    )
    entry, why = read_entry(value, JournalSigner([]))
    assert why is None and entry is not None and entry.kind == "feedback"
