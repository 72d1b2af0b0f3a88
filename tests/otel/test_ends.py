"""End-of-conversation signals from spans: configured markers and the root invoke_agent span become
``conversation_end`` events the sidecar's own state machine accepts, with deterministic ids; what
happens when the door does not know the conversation or reads the end before the last model call."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.proto.trace.v1.trace_pb2 import Span
from prometheus_client import CollectorRegistry

from sidecar.errors import ConfigError
from sidecar.events import Event
from sidecar.otel.config import OtelConfig
from sidecar.otel.ingest import OtelIngest
from sidecar.otel.metrics import OtelMetrics
from sidecar.state.config import StateConfig
from sidecar.state.store import PartitionState, Rejected
from tests.otel.spans import chat_attrs, conversation, decoded, make_span, model_calls, native_events, new_id, traces

MARKER = {"markers": [{"attribute": "app.conversation.ended"}]}


def ingest_with(registry: CollectorRegistry | None = None, **conversation_end: Any) -> OtelIngest:
    cfg = OtelConfig.model_validate({"conversation_end": conversation_end or MARKER})
    return OtelIngest(cfg, OtelMetrics(registry or CollectorRegistry()), max_event_bytes=1 << 20)


def ends(registry: CollectorRegistry, outcome: str) -> float:
    return registry.get_sample_value("sidecar_otel_conversation_ends_total", {"door": "test", "outcome": outcome}) or 0


def turn_traces(cid: str, history: Sequence[dict[str, Any]], *, end_in_last: bool = True) -> list[list[Span]]:
    """One trace per model call (an invoke_agent parent with the conversation id, the chat span a
    child); the last trace also holds the agent's end marker when ``end_in_last``."""
    out = []
    calls = model_calls(history)
    for i, call in enumerate(calls):
        trace = new_id(16)
        root = make_span(
            {"gen_ai.operation.name": "invoke_agent", "gen_ai.conversation.id": cid, "gen_ai.agent.name": "desk"},
            trace_id=trace,
            start=100 * i,
            name="invoke_agent desk",
        )
        spans = [root, make_span(chat_attrs("genai", call, None), trace_id=trace, parent=root.span_id, start=100 * i)]
        if end_in_last and i == len(calls) - 1:
            spans.append(
                make_span({"app.conversation.ended": True}, trace_id=trace, parent=root.span_id, start=100 * i + 50)
            )
        out.append(spans)
    return out


class Sidecar:
    """The sidecar's own state machine applied to the derived events, dead letters by reason."""

    def __init__(self) -> None:
        self.state = PartitionState(StateConfig())
        self.applied: dict[str, list[Event]] = {}
        self.ended: Counter[tuple[str, str | None]] = Counter()
        self.dead: Counter[str] = Counter()

    def apply(self, events: Iterable[Event]) -> None:
        for i, e in enumerate(events):
            try:
                triggers = self.state.apply(e, offset=i, now=0.0, journal_pos=0)
            except Rejected as exc:
                self.dead[exc.reason] += 1
                continue
            if e.message is not None:
                self.applied.setdefault(e.conversation_id, []).append(e)
            for t in triggers:
                if t.kind == "conversation_ended":
                    self.ended[(t.conversation.conversation_id, t.end_reason)] += 1


def test_an_end_marker_becomes_the_conversation_end_the_state_accepts() -> None:
    registry = CollectorRegistry()
    ingest = ingest_with(registry)
    history = conversation(2)
    spans = turn_traces("e-1", history)
    records = [r for t in spans for r in ingest.derive(traces(t), "test").records]
    events = decoded(records)
    *messages, end = events
    assert [e.message for e in messages] == [e.message for e in native_events("e-1", history)]
    assert (end.type, end.seq, end.message) == ("conversation_end", len(history), None)
    marker = spans[-1][-1]
    assert end.span is not None
    assert (end.span.trace_id, end.span.span_id) == (marker.trace_id.hex(), marker.span_id.hex())
    sidecar = Sidecar()
    sidecar.apply(events)
    assert sidecar.ended == {("e-1", "end_event"): 1}
    assert not sidecar.dead
    assert ends(registry, "emitted") == 1
    assert registry.get_sample_value("sidecar_otel_spans_total", {"door": "test", "outcome": "end_signal"}) == 1


def test_a_reread_marker_yields_the_same_event() -> None:
    history = conversation(1)
    spans = turn_traces("e-2", history)
    registry = CollectorRegistry()
    first = ingest_with(registry)
    once = [r for t in spans for r in first.derive(traces(t), "test").records]
    assert first.derive(traces(spans[-1]), "test").records == []  # the same door: nothing new
    assert ends(registry, "repeated") == 1
    restarted = ingest_with()
    again = restarted.derive(traces(spans[-1]), "test").records  # a restarted door: whole history + end
    assert again[-1] == once[-1]  # byte for byte: same id, seq, time and span
    sidecar = Sidecar()
    sidecar.apply(decoded(once + again))
    assert sidecar.ended == {("e-2", "end_event"): 1}
    assert set(sidecar.dead) == {"conversation_finished"}  # the copies arrive after the end: dropped


def test_an_end_read_before_the_model_calls_of_its_payload_is_placed_after_them() -> None:
    history = conversation(2)
    spans = [s for t in turn_traces("e-3", history) for s in t]
    events = decoded(ingest_with().derive(traces(reversed(spans)), "test").records)
    assert [e.seq for e in events] == list(range(len(history) + 1))
    assert events[-1].type == "conversation_end"


def test_an_end_for_a_conversation_the_door_does_not_know_is_counted_not_guessed() -> None:
    """After a restart or once forgotten, the door cannot know the log's length, and a wrong seq
    would be dead-lettered or, worse, cut the conversation short: no event; the idle TTL ends it."""
    registry = CollectorRegistry()
    ingest = ingest_with(registry)
    root, _chat, marker = turn_traces("e-4", conversation(1))[-1]
    assert ingest.derive(traces([root, marker]), "test").records == []
    assert ends(registry, "unknown_conversation") == 1


def test_an_end_read_before_the_last_model_call_is_counted_and_its_messages_are_dead_lettered() -> None:
    """The defined behaviour when the marker travels apart from the last model call and is read
    first: the end is placed after what the door knows, the late messages follow it (the sidecar
    dead-letters them, nothing is silently dropped) and the door counts them."""
    registry = CollectorRegistry()
    ingest = ingest_with(registry)
    history = conversation(2)
    spans = turn_traces("e-5", history, end_in_last=False)
    marker = make_span({"app.conversation.ended": "true", "gen_ai.conversation.id": "e-5"}, start=10_000)
    records = ingest.derive(traces(spans[0]), "test").records
    records += ingest.derive(traces([marker]), "test").records
    records += [r for t in spans[1:] for r in ingest.derive(traces(t), "test").records]
    sidecar = Sidecar()
    sidecar.apply(decoded(records))
    assert sidecar.ended == {("e-5", "end_event"): 1}
    assert sidecar.dead["conversation_finished"] == len(history) - len(model_calls(history)[0])
    assert ends(registry, "late_messages") == len(spans) - 1


@pytest.mark.parametrize(
    ("root_agent_span", "parent", "ends_it"),
    [(True, b"", True), (True, b"\x00" * 8, True), (True, b"\x01" * 8, False), (False, b"", False)],
)
def test_the_root_invoke_agent_span_ends_it_only_when_configured(
    root_agent_span: bool, parent: bytes, ends_it: bool
) -> None:
    ingest = ingest_with(root_agent_span=root_agent_span)
    trace = new_id(16)
    history = conversation(1)
    chat = make_span(chat_attrs("genai", history, "e-6"), trace_id=trace, start=1)
    agent = make_span(
        {"gen_ai.operation.name": "invoke_agent", "gen_ai.conversation.id": "e-6"}, trace_id=trace, parent=parent
    )
    events = decoded(ingest.derive(traces([chat, agent]), "test").records)
    assert [e.type for e in events][-1] == ("conversation_end" if ends_it else "message")


@pytest.mark.parametrize(
    ("marker", "attrs", "name", "ends_it"),
    [
        ({"attribute": "done"}, {"done": True}, "x", True),
        ({"attribute": "done"}, {"done": False}, "x", False),
        ({"attribute": "done"}, {"done": "0"}, "x", False),
        ({"attribute": "done"}, {"done": 1}, "x", True),
        ({"attribute": "done"}, {"done": [1]}, "x", False),
        ({"attribute": "state", "value": "closed"}, {"state": "closed"}, "x", True),
        ({"attribute": "state", "value": "closed"}, {"state": "open"}, "x", False),
        ({"span_name": "conversation.end"}, {}, "conversation.end", True),
        ({"span_name": "conversation.end"}, {}, "conversation.ended", False),
        ({"span_name": "end", "attribute": "done"}, {"done": True}, "other", False),
        ({"span_name": "end", "attribute": "done"}, {"done": True}, "end", True),
    ],
)
def test_markers_match_by_name_attribute_and_value(
    marker: dict[str, Any], attrs: dict[str, Any], name: str, ends_it: bool
) -> None:
    ingest = ingest_with(markers=[marker])
    trace = new_id(16)
    chat = make_span(chat_attrs("genai", conversation(1), "e-7"), trace_id=trace, start=1)
    signal = make_span(attrs, trace_id=trace, parent=chat.span_id, name=name, start=2)
    events = decoded(ingest.derive(traces([chat, signal]), "test").records)
    assert (events[-1].type == "conversation_end") is ends_it


@pytest.mark.parametrize(
    "marker", [{}, {"value": "x"}, {"attribute": ""}, {"attribute": "a", "extra": 1}, {"span_name": "x" * 300}]
)
def test_invalid_markers_are_refused(marker: dict[str, Any]) -> None:
    from sidecar.config import load_config

    with pytest.raises(ConfigError):
        load_config(overrides={"otel": {"conversation_end": {"markers": [marker]}}})


def test_an_end_marker_without_a_usable_conversation_id_is_refused() -> None:
    registry = CollectorRegistry()
    ingest = ingest_with(registry)
    nameless = make_span({"app.conversation.ended": True})
    newline = make_span({"app.conversation.ended": True, "session.id": "a\nb"})
    derived = ingest.derive(traces([nameless, newline]), "test")
    assert derived.records == []
    assert derived.refused == {"no_conversation_id": 1, "invalid_conversation_id": 1}


@settings(max_examples=100, deadline=None)
@given(turns=st.integers(1, 4), data=st.data())
def test_ends_stay_exactly_once_through_regrouping_resends_and_restarts(turns: int, data: st.DataObject) -> None:
    """The traces of two conversations, each ending with a marker in its last trace, grouped into
    payloads in order, payloads re-sent at random later points and the door restarted at random:
    the sidecar's state holds every message once and ends each conversation exactly once, by its
    end event (a copy re-derived after the end is dead-lettered, never applied)."""
    spans = {cid: turn_traces(cid, conversation(turns, cid)) for cid in ("p", "q")}
    order = [t for pair in zip(spans["p"], spans["q"], strict=True) for t in pair]
    payloads: list[list[Span]] = []
    i = 0
    while i < len(order):
        n = data.draw(st.integers(1, 3), label="traces per payload")
        payloads.append([s for t in order[i : i + n] for s in t])
        i += n
    deliveries = list(payloads)
    for _ in range(data.draw(st.integers(0, 3), label="resends")):
        k = data.draw(st.integers(0, len(payloads) - 1))
        deliveries.insert(data.draw(st.integers(k + 1, len(deliveries))), payloads[k])
    registries = [CollectorRegistry()]
    ingest = ingest_with(registries[-1])
    records = []
    for n, payload in enumerate(deliveries):
        if data.draw(st.integers(0, 7), label=f"restart before {n}") == 0:
            registries.append(CollectorRegistry())
            ingest = ingest_with(registries[-1])
        records += ingest.derive(traces(payload), "test").records
    sidecar = Sidecar()
    sidecar.apply(decoded(records))
    for cid in spans:
        history = conversation(turns, cid)
        assert [e.message for e in sidecar.applied[cid]] == [e.message for e in native_events(cid, history)]
        assert sidecar.ended[(cid, "end_event")] == 1
    assert set(sidecar.dead) <= {"duplicate_event", "conversation_finished"}
    assert sum(ends(r, "late_messages") for r in registries) == 0
