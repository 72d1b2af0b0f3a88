"""Conversation state machine: ordering, idempotency, turn triggers, timers and caps."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.events import Event
from sidecar.state.config import StateConfig
from sidecar.state.store import PartitionState, Rejected, Trigger
from sidecar.transcript.model import Message

CFG = StateConfig(turn_debounce_seconds=5, idle_ttl_seconds=50, max_conversations_per_partition=4,
                  max_text_bytes_per_partition=2000, max_messages_per_conversation=12)


def mk(cid: str, seq: int, role: str | None = "user", content: str = "hello", eid: str | None = None,
       end: bool = False) -> Event:
    msg = None if end else Message(role=role, content=content)  # type: ignore[arg-type]
    return Event(cid, eid or f"{cid}/{seq}", seq, "conversation_end" if end else "message", msg, "a", None,
                 0 if end else len(content.encode()))


def kinds(ts: list[Trigger]) -> list[tuple[str, int, Any]]:
    return [(t.kind, t.turn, t.close_reason or t.end_reason) for t in ts]


def test_turns_open_and_close_on_next_user_message_and_end() -> None:
    s = PartitionState(CFG)
    out: list[Trigger] = []
    out += s.apply(mk("c", 0, "system"), 0, 0, 0)
    out += s.apply(mk("c", 1, "user"), 1, 0, 0)
    out += s.apply(mk("c", 2, "assistant"), 2, 0, 0)
    out += s.apply(mk("c", 3, "tool"), 3, 0, 0)
    out += s.apply(mk("c", 4, "user"), 4, 0, 0)
    out += s.apply(mk("c", 5, None, end=True), 5, 0, 0)
    assert kinds(out) == [
        ("user_message", 1, None),
        ("turn_closed", 1, "next_user_message"),
        ("user_message", 2, None),
        ("turn_closed", 2, "conversation_end"),
        ("conversation_ended", 2, "end_event"),
    ]
    assert out[1].message_count == 4  # the turn's messages, without the next user message
    assert len(s) == 0


def test_debounce_only_after_a_plain_agent_reply() -> None:
    s = PartitionState(CFG)
    s.apply(mk("c", 0, "user"), 0, 0, 0)
    assert s.due(100 - 51) == []  # nothing answered yet: no debounce (and not yet idle)
    s.apply(mk("c", 1, "assistant"), 1, 50, 0)
    assert kinds(s.due(54)) == []
    assert kinds(s.due(55)) == [("turn_closed", 1, "idle_debounce")]
    s.apply(mk("c", 2, "assistant"), 2, 56, 0)  # a late extra reply does not close the turn twice
    assert kinds(s.due(70)) == []
    assert kinds(s.due(200)) == [("conversation_ended", 1, "idle_ttl")]


def test_order_and_idempotency_reasons() -> None:
    s = PartitionState(CFG)
    s.apply(mk("c", 0), 0, 0, 0)
    with pytest.raises(Rejected, match="duplicate_event"):
        s.apply(mk("c", 0), 1, 0, 0)
    with pytest.raises(Rejected, match="duplicate_seq"):
        s.apply(mk("c", 0, eid="other"), 2, 0, 0)
    with pytest.raises(Rejected, match="duplicate_event"):
        s.apply(mk("c", 1, eid="c/0"), 3, 0, 0)
    with pytest.raises(Rejected, match="seq_gap"):
        s.apply(mk("c", 3), 4, 0, 0)
    with pytest.raises(Rejected, match="seq_gap"):
        s.apply(mk("new", 2), 5, 0, 0)
    with pytest.raises(Rejected, match="empty_conversation"):
        s.apply(mk("new", 0, end=True), 6, 0, 0)
    assert [m.content for m in s.conversations["c"].messages] == ["hello"]
    s.apply(mk("c", 1, end=True), 7, 0, 0)
    with pytest.raises(Rejected, match="conversation_finished"):
        s.apply(mk("c", 0), 8, 0, 0)  # a redelivered first event must not reopen it


def test_caps_evict_least_recently_active_first() -> None:
    s = PartitionState(CFG)
    for i in range(4):
        s.apply(mk(f"c{i}", 0), i, i, 0)
    s.apply(mk("c0", 1, "assistant"), 4, 4, 0)  # c0 becomes the most recently active
    out = s.apply(mk("c9", 0), 5, 5, 0)
    assert [(t.conversation.conversation_id, t.kind, t.end_reason) for t in out if t.kind == "conversation_ended"] == [
        ("c1", "conversation_ended", "evicted")
    ]
    big = "x" * 1995
    out = s.apply(mk("c9", 1, "assistant", big), 6, 6, 0)
    assert s.text_bytes <= CFG.max_text_bytes_per_partition
    assert s.evicted >= 2


def test_too_long_conversation_is_rejected_not_grown() -> None:
    s = PartitionState(CFG)
    for i in range(12):
        s.apply(mk("c", i, "user" if i % 2 == 0 else "assistant"), i, 0, 0)
    with pytest.raises(Rejected, match="conversation_too_long"):
        s.apply(mk("c", 12), 12, 0, 0)


ops = st.lists(
    st.one_of(
        st.tuples(st.just("ev"), st.sampled_from("abcdef"), st.integers(0, 6),
                  st.sampled_from(["user", "assistant", "tool", "system", "end"]), st.integers(0, 900),
                  st.booleans()),
        st.tuples(st.just("time"), st.integers(1, 30)),
    ),
    max_size=120,
)


@settings(max_examples=400, deadline=None)
@given(ops)
def test_invariants_hold_under_arbitrary_event_sequences(script: list[tuple[Any, ...]]) -> None:
    s = PartitionState(CFG)
    now = 0.0
    offset = 0
    opened: Counter[str] = Counter()
    ended: Counter[str] = Counter()
    keys_seen: set[tuple[str, int, str, int]] = set()
    model: dict[str, list[int]] = {}  # seqs applied per open conversation, in order

    def take(ts: list[Trigger]) -> None:
        for t in ts:
            cid = t.conversation.conversation_id
            k = (*t.key, opened[cid])
            assert k not in keys_seen, f"trigger {k} produced twice"
            keys_seen.add(k)
            if t.kind == "conversation_ended":
                ended[cid] += 1
                model.pop(cid, None)

    for op in script:
        if op[0] == "time":
            now += op[1]
            take(s.due(now))
            continue
        _, cid, seq, role, size, reuse_id = op
        eid = f"{cid}/{seq}" if reuse_id else f"{cid}/{seq}/{offset}"
        e = mk(cid, seq, end=True) if role == "end" else mk(cid, seq, role, "x" * size, eid=eid)
        is_new = cid not in s.conversations
        try:
            ts = s.apply(e, offset, now, 0)
        except Rejected:
            ts = []
        else:
            if is_new:
                opened[cid] += 1
                model[cid] = []
            if role != "end":
                model.setdefault(cid, []).append(seq)
        offset += 1
        take(ts)
        assert len(s) <= CFG.max_conversations_per_partition
        assert s.text_bytes == sum(c.text_bytes for c in s.conversations.values())
        if len(s) > 1:
            assert s.text_bytes <= CFG.max_text_bytes_per_partition
        for c_id, conv in s.conversations.items():
            assert model[c_id] == list(range(len(conv.messages)))
            assert conv.closed_through <= conv.turns
    take(s.due(now + 10_000))
    assert len(s) == 0
    assert opened == ended  # every opened conversation ended exactly once
