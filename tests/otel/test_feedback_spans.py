"""People's feedback through the OTLP doors: a ``sidecar.feedback`` span event becomes the v1
feedback event, with its conversation found as for chat spans, a stable id, and hostile values
refused at the door; the sidecar then applies it like feedback from Kafka."""

from __future__ import annotations

import json
from typing import Any

from opentelemetry.proto.common.v1.common_pb2 import KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span
from prometheus_client import CollectorRegistry

from sidecar.alerting.alert import alert_id
from sidecar.alerting.feedback import AlertFeedback, FeedbackMetrics
from sidecar.events import Feedback
from sidecar.otel.config import OtelConfig
from sidecar.otel.ingest import OtelIngest
from sidecar.otel.metrics import OtelMetrics
from sidecar.source.processor import PartitionProcessor
from sidecar.stage.pipeline import PostScoreStage
from sidecar.state.config import StateConfig
from sidecar.state.hooks import RecordingHooks
from sidecar.telemetry.labels import AgentLabels
from sidecar.telemetry.stream_metrics import StreamMetrics
from tests.otel.spans import any_value, chat_attrs, conversation, decoded, make_span, new_id, traces
from tests.stream.fakes import FakeJournal, Rec


def ingest(registry: CollectorRegistry | None = None) -> OtelIngest:
    return OtelIngest(OtelConfig(), OtelMetrics(registry or CollectorRegistry()), max_event_bytes=1 << 20)


def with_feedback(span: Span, attrs: dict[str, Any], *, time_ns: int = 1_700_000_005_000_000_000) -> Span:
    ev = span.events.add()
    ev.name = "sidecar.feedback"
    ev.time_unix_nano = time_ns
    ev.attributes.extend(KeyValue(key=k, value=any_value(v)) for k, v in attrs.items())
    return span


def agent_trace(cid: str, feedback: dict[str, Any] | None = None) -> list[Span]:
    """An invoke_agent span with the conversation id, a model call below it, and (optionally) a
    feedback event on a child span that carries nothing else."""
    trace = new_id(16)
    root = make_span(
        {"gen_ai.operation.name": "invoke_agent", "gen_ai.conversation.id": cid, "gen_ai.agent.name": "desk"},
        trace_id=trace,
        name="invoke_agent desk",
    )
    chat = make_span(chat_attrs("genai", conversation(2), None), trace_id=trace, parent=root.span_id)
    spans = [root, chat]
    if feedback is not None:
        spans.append(with_feedback(make_span({}, trace_id=trace, parent=root.span_id, name="review"), feedback))
    return spans


def sample(registry: CollectorRegistry, name: str, **labels: str) -> float:
    return registry.get_sample_value(name, labels) or 0.0


def test_a_feedback_span_event_becomes_the_v1_feedback_event() -> None:
    registry = CollectorRegistry()
    door = ingest(registry)
    body = {"sidecar.feedback.target": "turn", "sidecar.feedback.rating": "down", "sidecar.feedback.turn": 1}
    spans = agent_trace("conv-7", {**body, "sidecar.feedback.reason": "wrong date"})
    out = door.derive(traces(spans), "test")
    events = decoded(out.records)
    fb = [e for e in events if e.type == "feedback"]
    assert len(fb) == 1 and events[-1] is fb[0]  # the model call's messages, then the feedback
    assert all(x.type == "message" for x in events[:-1]) and len(events) > 1
    [e] = fb
    assert e.conversation_id == "conv-7" and e.agent == "desk"
    assert e.feedback == Feedback("turn", "down", 1, None, "wrong date")
    assert e.span is not None and e.span.span_id == spans[2].span_id.hex()  # the span it was read from
    assert e.event_id.startswith("otel-fb-")
    assert out.feedback_events == 1
    assert sample(registry, "sidecar_otel_spans_total", door="test", outcome="feedback") == 1
    assert sample(registry, "sidecar_otel_spans_total", door="test", outcome="ignored") == 1  # the root only
    # Re-sent (a retry, the bridge re-reading): the same id, a duplicate to the sidecar.
    again = decoded(door.derive(traces(spans), "test").records)
    assert [x.event_id for x in again if x.type == "feedback"] == [e.event_id]


def test_ids_conversation_and_agent_from_the_event_itself() -> None:
    span = with_feedback(
        make_span({}, name="thumbs"),
        {
            "sidecar.feedback.target": "conversation",
            "sidecar.feedback.rating": "up",
            "sidecar.feedback.id": "review-42",
            "gen_ai.conversation.id": "conv-9",
            "gen_ai.agent.name": "help desk",
        },
    )
    [e] = decoded(ingest().derive(traces([span]), "test").records)
    assert (e.conversation_id, e.agent, e.event_id, e.seq) == ("conv-9", "help_desk", "review-42", -1)


HOSTILE: list[dict[str, Any]] = [
    {"sidecar.feedback.rating": "down"},  # no target
    {"sidecar.feedback.target": "conversation", "sidecar.feedback.rating": "false_alarm"},
    {"sidecar.feedback.target": "turn", "sidecar.feedback.rating": "up", "sidecar.feedback.turn": "2"},
    {"sidecar.feedback.target": "turn", "sidecar.feedback.rating": "up"},
    {"sidecar.feedback.target": "turn", "sidecar.feedback.rating": "up", "sidecar.feedback.turn": -3},
    {"sidecar.feedback.target": "alert", "sidecar.feedback.rating": "true_alarm", "sidecar.feedback.turn": 1,
     "sidecar.feedback.alert_id": "'; DROP TABLE alerts; --"},
    {"sidecar.feedback.target": "conversation", "sidecar.feedback.rating": "up", "sidecar.feedback.reason": "x" * 9000},
    {"sidecar.feedback.target": "conversation", "sidecar.feedback.rating": "up", "sidecar.feedback.id": "y" * 500},
]  # fmt: skip


def test_hostile_feedback_is_refused_at_the_door_and_counted() -> None:
    registry = CollectorRegistry()
    door = ingest(registry)
    spans = [with_feedback(make_span({"gen_ai.conversation.id": "c"}), attrs) for attrs in HOSTILE]
    spans.append(
        with_feedback(make_span({}), {"sidecar.feedback.target": "conversation", "sidecar.feedback.rating": "up"})
    )
    out = door.derive(traces(spans), "test")
    assert out.records == []
    assert out.refused == {"contract_violation": len(HOSTILE), "no_conversation_id": 1}
    assert sample(registry, "sidecar_otel_refused_total", door="test", reason="contract_violation") == len(HOSTILE)
    assert "DROP" not in json.dumps(sorted(out.refused))


async def test_the_sidecar_applies_otlp_feedback_like_kafka_feedback() -> None:
    """Door output fed to the processor: the conversation's messages, then an alert's true alarm."""
    group = "g"
    aid = alert_id(group, "conv-3", 1, "uncertain_turn")
    feedback = {
        "sidecar.feedback.target": "alert",
        "sidecar.feedback.rating": "true_alarm",
        "sidecar.feedback.turn": 1,
        "sidecar.feedback.alert_id": aid,
    }
    records = ingest().derive(traces(agent_trace("conv-3", feedback)), "test").records
    registry = CollectorRegistry()
    j = FakeJournal()
    p = PartitionProcessor(
        partition=0,
        state_config=StateConfig(),
        hooks=RecordingHooks(),
        results=j,
        dead_letters=j,
        metrics=StreamMetrics(CollectorRegistry()),
        recovery=j.recovery(None),
        max_record_bytes=1 << 20,
        max_pending=8,
        stage=PostScoreStage(feedback=AlertFeedback(group, FeedbackMetrics(registry), AgentLabels(["desk"]))),
    )
    for offset, (key, value) in enumerate(records * 2):  # everything twice: the doors deliver at least once
        await p.process(Rec("t", 0, offset, key, value), 0.0)
    assert await p.drain(5)
    [journaled] = [r for r in j.results if r["kind"] == "feedback"]
    assert journaled["outcome"]["alert_kind"] == "uncertain_turn"
    assert (
        sample(registry, "sidecar_alert_feedback_total", agent="desk", kind="uncertain_turn", verdict="true_alarm") == 1
    )
    assert ("duplicate_event" in {reason for _, reason in j.dead}) and len(j.dead) == len(records)
