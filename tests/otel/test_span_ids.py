"""Derived events carry the span they came from (``trace_id``/``span_id``), and the ids of a message's
event do not depend on which span it was derived from."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from sidecar.otel.config import OtelConfig
from sidecar.otel.ingest import OtelIngest
from sidecar.otel.metrics import OtelMetrics
from tests.otel.spans import chat_attrs, conversation, decoded, make_span, model_calls, new_id, traces


def fresh() -> OtelIngest:
    return OtelIngest(OtelConfig(), OtelMetrics(CollectorRegistry()), max_event_bytes=1 << 20)


def test_each_message_carries_the_span_it_was_first_derived_from() -> None:
    ingest = fresh()
    history = conversation(2)
    calls = model_calls(history)
    spans = [make_span(chat_attrs("genai", call, "s-1"), start=10 + i) for i, call in enumerate(calls)]
    events = []
    for span in spans:
        events += decoded(ingest.derive(traces([span]), "test").records)
    assert len(events) == len(history)
    for e in events:
        # the model call whose history first held the message: its output, or the call that read it
        first = next(i for i, call in enumerate(calls) if len(call) > e.seq)
        assert e.span is not None
        assert (e.span.trace_id, e.span.span_id) == (spans[first].trace_id.hex(), spans[first].span_id.hex())
    replies = [e for e in events if e.message is not None and e.message.role == "assistant"]
    # an agent's reply is the output of the span that produced it
    for k, reply in enumerate(replies):
        assert reply.span is not None
        assert reply.span.span_id == spans[k].span_id.hex()


def test_a_history_derived_again_from_a_later_span_keeps_its_event_ids() -> None:
    history = conversation(2)
    calls = model_calls(history)
    spans = [make_span(chat_attrs("openinference", call, "s-2"), start=10 + i) for i, call in enumerate(calls)]
    first = fresh()
    in_order = [e for s in spans for e in decoded(first.derive(traces([s]), "test").records)]
    # a restarted door sees only the last model call: the whole history, from that span
    again = decoded(fresh().derive(traces([spans[-1]]), "test").records)
    assert [e.event_id for e in again] == [e.event_id for e in in_order]
    assert {e.span.span_id for e in again if e.span is not None} == {spans[-1].span_id.hex()}
    assert len({e.span.span_id for e in in_order if e.span is not None}) == len(spans)


def test_invalid_span_ids_give_events_without_ids_not_refusals() -> None:
    ingest = fresh()
    zero = make_span(chat_attrs("genai", conversation(1), "s-3"), trace_id=b"\x00" * 16)
    short = make_span(chat_attrs("genai", conversation(1, "x"), "s-4"), trace_id=new_id(5))
    derived = ingest.derive(traces([zero, short]), "test")
    events = decoded(derived.records)
    assert {e.conversation_id for e in events} == {"s-3", "s-4"}
    assert all(e.span is None for e in events)
    assert derived.rejected_spans == 0
