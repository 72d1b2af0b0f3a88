"""History diffing: properties over any order of spans, re-reads, forgetting and rewrites."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from sidecar.otel.config import OtelConfig
from sidecar.otel.history import HistoryTracker
from sidecar.otel.ingest import OtelIngest
from sidecar.otel.messages import OtelMessage
from sidecar.otel.metrics import OtelMetrics
from tests.otel.spans import chat_attrs, conversation, decoded, dedup, make_span, model_calls, native_events, traces


def d(i: int) -> bytes:
    return i.to_bytes(16, "big")


def fresh() -> OtelIngest:
    return OtelIngest(OtelConfig(), OtelMetrics(CollectorRegistry()), max_event_bytes=1 << 20)


@settings(max_examples=150, deadline=None)
@given(
    turns=st.integers(1, 5),
    data=st.data(),
)
def test_any_order_with_resends_and_restarts_yields_the_conversation_once(turns: int, data: st.DataObject) -> None:
    """Spans of two conversations, delivered in any order, some twice, with the door restarted (its
    memory lost) or forgetting a conversation at random points: after the sidecar's dedup the
    events are exactly the longest history delivered, nothing twice, no conflict."""
    histories = {"a": conversation(turns, "a"), "b": conversation(turns, "b")}
    calls = [(cid, call) for cid, h in histories.items() for call in model_calls(h)]
    order = data.draw(st.lists(st.sampled_from(range(len(calls))), min_size=1, max_size=3 * len(calls)))
    ingest = fresh()
    produced = []
    for n, k in enumerate(order):
        if data.draw(st.integers(0, 9), label=f"restart before {n}") == 0:
            ingest = fresh()
        cid, call = calls[k]
        produced += ingest.derive(traces([make_span(chat_attrs("genai", call, cid))]), "test").records
        if data.draw(st.integers(0, 9), label=f"forget after {n}") == 0:
            ingest.forget([cid])
    logs = dedup(decoded(produced))  # asserts: no seq taken by another event, no gap
    for cid, history in histories.items():
        longest = max((len(calls[k][1]) for k in order if calls[k][0] == cid), default=0)
        got = [e.message for e in logs.get(cid, [])]
        assert got == [e.message for e in native_events(cid, history[:longest])]


@settings(max_examples=200, deadline=None)
@given(n=st.integers(1, 30), cut=st.integers(0, 30), extra=st.integers(0, 5), data=st.data())
def test_a_rewritten_history_emits_no_message_twice(n: int, cut: int, extra: int, data: st.DataObject) -> None:
    """A summarising agent replaces a prefix of its history: only the messages after the last one
    already seen are new; what was emitted is never emitted again, and seqs stay contiguous."""
    tracker = HistoryTracker(10, 1 << 20, 3600.0)
    first = [d(i) for i in range(n)]
    seen = tracker.diff("c", first, [0])
    assert seen.kind == "new"
    assert [s for s, _ in seen.new] == list(range(n))
    keep = first[min(cut, n) :]  # the summary replaces the first messages
    rewritten = [d(1000)] + keep + [d(2000 + i) for i in range(extra)]
    diff = tracker.diff("c", rewritten, [0])
    emitted = [rewritten[i] for _, i in diff.new]
    assert not set(emitted) & set(first)
    if keep:
        assert emitted == rewritten[len(rewritten) - extra :]
    assert [s for s, _ in diff.new] == list(range(n, n + len(diff.new)))
    # the next span extends the rewritten history: plain suffix again, no second rewrite
    after = tracker.diff("c", [*rewritten, d(3000)], [0])
    assert after.kind == "extends"
    assert after.new == ((n + len(diff.new), len(rewritten)),)


def test_a_history_with_nothing_in_common_keeps_the_new_turn() -> None:
    tracker = HistoryTracker(10, 1 << 20, 3600.0)
    tracker.diff("c", [d(1), d(2), d(3)], [1])
    diff = tracker.diff("c", [d(7), d(8), d(9), d(10)], [0, 2])
    assert diff.kind == "rewritten"
    assert diff.new == ((3, 2), (4, 3))


def test_a_shorter_consistent_history_is_stale() -> None:
    tracker = HistoryTracker(10, 1 << 20, 3600.0)
    tracker.diff("c", [d(1), d(2), d(3)], [0])
    assert tracker.diff("c", [d(1), d(2)], [0]).kind == "stale"
    assert tracker.diff("c", [d(1), d(2), d(3), d(4)], [0]).new == ((3, 3),)


@settings(max_examples=100, deadline=None)
@given(ops=st.lists(st.tuples(st.integers(0, 50), st.integers(1, 40)), max_size=200))
def test_state_stays_within_its_caps(ops: list[tuple[int, int]]) -> None:
    tracker = HistoryTracker(max_conversations=8, max_bytes=4096, idle_ttl_seconds=3600.0)
    for conv, length in ops:
        tracker.diff(f"c{conv}", [d(i) for i in range(length)], [0])
        assert len(tracker) <= 8
        # one conversation may exceed the byte cap alone (the one just seen is kept)
        assert tracker.state_bytes <= max(4096, 40 * 16 + 200)


def test_idle_conversations_are_forgotten() -> None:
    now = [0.0]
    tracker = HistoryTracker(10, 1 << 20, idle_ttl_seconds=60.0, clock=lambda: now[0])
    tracker.diff("old", [d(1)], [0])
    now[0] = 30.0
    tracker.diff("young", [d(1)], [0])
    now[0] = 61.0
    tracker.diff("young", [d(1), d(2)], [0])
    assert len(tracker) == 1
    assert tracker.diff("old", [d(1)], [0]).kind == "new"


def test_the_same_message_has_the_same_digest_whoever_wrote_it() -> None:
    a = OtelMessage("assistant", "", None, ())
    assert a.digest() == OtelMessage("assistant", "", None, ()).digest()
    assert a.digest() != OtelMessage("user", "", None, ()).digest()
