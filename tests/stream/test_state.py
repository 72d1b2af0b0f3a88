"""Conversation state machine: ordering, idempotency, turn triggers, timers and caps."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.events import Event
from sidecar.state.config import StateConfig
from sidecar.state.memory import CONVERSATION_OVERHEAD_BYTES, MemoryBudget, id_bytes, message_bytes
from sidecar.state.store import PartitionState, Rejected, Trigger
from sidecar.transcript.model import Message

CFG = StateConfig(
    turn_debounce_seconds=5,
    idle_ttl_seconds=50,
    max_conversations_per_partition=4,
    max_messages_per_conversation=12,
    max_conversation_bytes=4000,
    finished_memory=3,
    max_conversation_lifetime_seconds=1000,
)
BUDGET_BYTES = 12_000


def mk(
    cid: str, seq: int, role: str | None = "user", content: str = "hello", eid: str | None = None, end: bool = False
) -> Event:
    msg = None if end else Message(role=role, content=content)  # type: ignore[arg-type]
    return Event(cid, eid or f"{cid}/{seq}", seq, "conversation_end" if end else "message", msg, "a", None)


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
    s = PartitionState(CFG, MemoryBudget(BUDGET_BYTES))
    for i in range(4):
        s.apply(mk(f"c{i}", 0), i, i, 0)
    s.apply(mk("c0", 1, "assistant"), 4, 4, 0)  # c0 becomes the most recently active
    out = s.apply(mk("c9", 0), 5, 5, 0)
    assert [(t.conversation.conversation_id, t.kind, t.end_reason) for t in out if t.kind == "conversation_ended"] == [
        ("c1", "conversation_ended", "evicted")
    ]
    big = "x" * 3000
    s.apply(mk("c9", 1, "assistant", big), 6, 6, 0)
    s.apply(mk("c0", 2, "user", big), 7, 7, 0)
    s.apply(mk("c2", 1, "assistant", big), 8, 8, 0)
    assert s.mem_bytes <= BUDGET_BYTES
    assert s.evicted >= 2


def test_memory_counts_allocations_not_text_length() -> None:
    """Regression: the cap counted UTF-8 text bytes, so wide characters and many small messages held
    several times the configured bytes. A string of emoji costs 4 bytes per character in CPython."""
    s = PartitionState(CFG, MemoryBudget(10**9))
    s.apply(mk("c", 0, "user", "\U0001f600" * 500), 0, 0, 0)
    assert s.mem_bytes >= 4 * 500
    expected = CONVERSATION_OVERHEAD_BYTES + id_bytes("c") + message_bytes(s.conversations["c"].messages[0])
    assert s.mem_bytes == expected


def test_one_conversation_cannot_outgrow_its_cap() -> None:
    """Regression: the conversation being applied was never evicted, so one conversation held 9.5 MiB
    under a 1 MiB cap. Now its own bytes are capped and further messages are dead-lettered."""
    s = PartitionState(CFG, MemoryBudget(10**9))
    s.apply(mk("c", 0, "user", "x" * 1500), 0, 0, 0)
    s.apply(mk("c", 1, "assistant", "x" * 1500), 1, 0, 0)
    with pytest.raises(Rejected, match="conversation_too_large"):
        s.apply(mk("c", 2, "user", "x" * 1500), 2, 0, 0)
    assert s.conversations["c"].mem_bytes <= CFG.max_conversation_bytes
    with pytest.raises(Rejected, match="conversation_too_large"):
        s.apply(mk("big", 0, "user", "x" * 5000), 3, 0, 0)
    assert "big" not in s.conversations  # nothing half-opened


def test_budget_is_shared_and_each_partition_evicts_down_to_its_share() -> None:
    budget = MemoryBudget(BUDGET_BYTES)
    a, b = PartitionState(CFG, budget), PartitionState(CFG, budget)
    for i in range(3):
        a.apply(mk(f"a{i}", 0, "user", "x" * 2500), i, i, 0)
    assert budget.used_bytes == a.mem_bytes
    b.apply(mk("b0", 0, "user", "x" * 2500), 0, 10, 0)  # b is under its share: it does not evict
    assert b.evicted == 0 and budget.over
    a.due(11)  # a is over its share: its sweep evicts until the total is back under the limit
    assert not budget.over and a.evicted >= 1
    assert budget.used_bytes == a.mem_bytes + b.mem_bytes
    a.close()
    assert budget.used_bytes == b.mem_bytes and budget.partitions == 1


def test_lifetime_bound_finalises_the_oldest_even_when_active() -> None:
    """Regression: a conversation sending an event every 29 minutes never idled out and pinned the
    commit point at its first offset forever."""
    s = PartitionState(CFG)
    s.apply(mk("old", 0), 0, 0, 0, opened_at_unix=1_000.0)
    s.apply(mk("new", 0), 1, 0, 0, opened_at_unix=1_900.0)
    s.apply(mk("old", 1, "tool"), 2, 40, 0)  # still active (a tool answer: no debounce)
    assert kinds(s.due(45, wall_now=1_999.0)) == []
    out = s.due(45, wall_now=2_001.0)
    assert [(t.conversation.conversation_id, t.kind, t.end_reason) for t in out] == [
        ("old", "turn_closed", None),
        ("old", "conversation_ended", "max_lifetime"),
    ]
    assert s.oldest() is not None and s.oldest().conversation_id == "new"  # type: ignore[union-attr]
    with pytest.raises(Rejected, match="conversation_finished"):
        s.apply(mk("old", 2, "user"), 3, 46, 0)


def test_finished_memory_is_by_start_order_and_can_be_rebuilt() -> None:
    s = PartitionState(CFG)
    for i, cid in enumerate(["a", "b", "c", "d"]):
        s.apply(mk(cid, 0), i, 0, 0)
    for i, cid in enumerate(["d", "a", "c", "b"]):  # finish in another order than they started
        s.apply(mk(cid, 1, end=True), 10 + i, 0, 0)
    # capacity 3: the earliest-started ("a", offset 0) is forgotten, whatever the finish order
    assert [c for c in "abcd" if s.is_finished(c)] == ["b", "c", "d"]
    assert s.finished_from() == 1
    rebuilt = PartitionState(CFG)
    for cid, first in [("a", 0), ("b", 1), ("c", 2), ("d", 3)]:
        rebuilt.remember_finished(cid, first)
    assert [c for c in "abcd" if rebuilt.is_finished(c)] == ["b", "c", "d"]
    assert rebuilt.finished_from() == 1


def test_too_long_conversation_is_rejected_not_grown() -> None:
    s = PartitionState(CFG)
    for i in range(12):
        s.apply(mk("c", i, "user" if i % 2 == 0 else "assistant"), i, 0, 0)
    with pytest.raises(Rejected, match="conversation_too_long"):
        s.apply(mk("c", 12), 12, 0, 0)


def test_every_message_past_the_cap_is_too_long_and_the_end_still_ends_it() -> None:
    s = PartitionState(CFG)
    for i in range(12):
        s.apply(mk("c", i, "user" if i % 2 == 0 else "assistant"), i, 0, 0)
    for seq in (12, 13, 14, 12, 40):  # the rest of the conversation, a re-sent one, a far one
        with pytest.raises(Rejected) as info:
            s.apply(mk("c", seq, "assistant"), seq, 0, 0)
        assert info.value.reason == "conversation_too_long", info.value
    assert len(s.conversations["c"].messages) == 12
    out = s.apply(mk("c", 15, None, end=True), 15, 0, 0)
    assert kinds(out)[-1] == ("conversation_ended", 6, "end_event")
    with pytest.raises(Rejected, match="conversation_finished"):
        s.apply(mk("c", 16, "user"), 16, 0, 0)


def test_every_message_past_a_too_large_one_is_too_large_until_its_seq_is_filled() -> None:
    s = PartitionState(CFG)
    s.apply(mk("c", 0, "user", "x" * 100), 0, 0, 0)
    with pytest.raises(Rejected, match="conversation_too_large"):
        s.apply(mk("c", 1, "assistant", "x" * 5000), 1, 0, 0)
    with pytest.raises(Rejected) as info:
        s.apply(mk("c", 2, "user"), 2, 0, 0)
    assert info.value.reason == "conversation_too_large"
    # A smaller message at the open seq (another event id) fits: the conversation goes on, and a
    # real gap after it is a gap again.
    s.apply(mk("c", 1, "assistant", "short", eid="c/1/again"), 3, 0, 0)
    with pytest.raises(Rejected) as info:
        s.apply(mk("c", 3, "user"), 4, 0, 0)
    assert info.value.reason == "seq_gap"


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 1500), st.sampled_from(["user", "assistant"]), st.integers(0, 9)),
        min_size=1,
        max_size=40,
    )
)
def test_past_a_cap_no_message_is_called_a_gap(script: list[tuple[int, str, int]]) -> None:
    """One conversation sent in seq order (every tenth event skips a seq): once a message is
    refused for a cap, every following one is refused for it too, until one fills the open seq."""
    s = PartitionState(CFG)
    seq, capped, reasons = 0, None, Counter[str]()
    for offset, (size, role, skip) in enumerate(script):
        if skip == 0 and offset > 0:
            seq += 1  # a lost event: a real gap unless a cap came first
        try:
            s.apply(mk("c", seq, role, "x" * size, eid=f"e{offset}"), offset, 0, 0)
        except Rejected as rejected:
            reasons[rejected.reason] += 1
            if capped is not None:
                assert rejected.reason == capped, (capped, rejected)
            elif rejected.reason in ("conversation_too_long", "conversation_too_large"):
                capped = rejected.reason
        else:
            capped = None
        seq += 1
        assert len(s.conversations["c"].messages) <= CFG.max_messages_per_conversation
    assert set(reasons) <= {"seq_gap", "conversation_too_long", "conversation_too_large"}


def test_a_gap_without_a_cap_is_still_a_gap() -> None:
    s = PartitionState(CFG)
    s.apply(mk("c", 0, "user"), 0, 0, 0)
    for seq in (2, 5):
        with pytest.raises(Rejected) as info:
            s.apply(mk("c", seq, "user"), seq, 0, 0)
        assert info.value.reason == "seq_gap"
    with pytest.raises(Rejected, match="seq_gap"):
        s.apply(mk("c", 3, None, end=True), 3, 0, 0)


ops = st.lists(
    st.one_of(
        st.tuples(
            st.just("ev"),
            st.sampled_from("abcdef"),
            st.integers(0, 6),
            st.sampled_from(["user", "assistant", "tool", "system", "end"]),
            st.integers(0, 2500),
            st.booleans(),
        ),
        st.tuples(st.just("time"), st.integers(1, 30)),
    ),
    max_size=120,
)


@settings(max_examples=400, deadline=None)
@given(ops)
def test_invariants_hold_under_arbitrary_event_sequences(script: list[tuple[Any, ...]]) -> None:
    budget = MemoryBudget(BUDGET_BYTES)
    s = PartitionState(CFG, budget)
    now = 0.0
    offset = 0
    opened: Counter[str] = Counter()
    ended: Counter[str] = Counter()
    keys_seen: set[tuple[str, int, str, int]] = set()
    model: dict[str, list[int]] = {}  # seqs applied per open conversation, in order
    capped: set[str] = set()  # open conversations whose last refused message hit a cap

    def take(ts: list[Trigger]) -> None:
        for t in ts:
            cid = t.conversation.conversation_id
            k = (*t.key, opened[cid])
            assert k not in keys_seen, f"trigger {k} produced twice"
            keys_seen.add(k)
            if t.kind == "conversation_ended":
                ended[cid] += 1
                model.pop(cid, None)
                capped.discard(cid)

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
        except Rejected as rejected:
            ts = []
            if rejected.reason in ("conversation_too_long", "conversation_too_large"):
                capped.add(cid)
            # Past a cap the following seqs can never be filled: never reported as a gap.
            assert not (cid in capped and rejected.reason == "seq_gap"), rejected
        else:
            capped.discard(cid)
            if is_new:
                opened[cid] += 1
                model[cid] = []
            if role != "end":
                model.setdefault(cid, []).append(seq)
        offset += 1
        take(ts)
        assert len(s) <= CFG.max_conversations_per_partition
        assert budget.used_bytes == s.mem_bytes
        held = sum(
            c.mem_bytes + CONVERSATION_OVERHEAD_BYTES + id_bytes(c.conversation_id) for c in s.conversations.values()
        )
        assert s.mem_bytes >= held  # the rest is the finished memory
        for conv in s.conversations.values():
            assert conv.mem_bytes <= CFG.max_conversation_bytes
        if len(s) > 1:
            assert s.mem_bytes <= BUDGET_BYTES + 3 * 400  # plus at most the finished memory's entries
        for c_id, conv in s.conversations.items():
            assert model[c_id] == list(range(len(conv.messages)))
            assert conv.closed_through <= conv.turns
    take(s.due(now + 10_000))
    assert len(s) == 0
    assert opened == ended  # every opened conversation ended exactly once
