"""Decoders and text helpers never crash, whatever they are given."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.clustering.llm import extractive_summary, parse_answer
from sidecar.clustering.model import OTHER, UNKNOWN, metric_label
from sidecar.clustering.naming import goal_name
from sidecar.clustering.prompts import MergeAnswer, merge_messages, one_line
from sidecar.transcript.dataset import InvalidRecord, parse_line
from sidecar.transcript.model import Message

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=20,
)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=2000))
def test_parse_line_never_raises_on_bytes(data: bytes) -> None:
    try:
        conv = parse_line(data)
    except InvalidRecord as bad:
        assert bad.reason
    else:
        assert conv.conversation_id


@settings(max_examples=200, deadline=None)
@given(json_values, json_values)
def test_parse_line_never_raises_on_json(turns: object, goal: object) -> None:
    rec = {"conversation_id": "c", "turns": turns, "meta": {"goal": goal}}
    try:
        conv = parse_line(json.dumps(rec).encode())
    except InvalidRecord:
        return
    assert all(isinstance(m, Message) for m in conv.messages)
    assert conv.lookup("meta.goal") == goal


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=3000), st.lists(st.text(max_size=200), max_size=12))
def test_text_helpers_are_bounded(text: str, group: list[str]) -> None:
    line = one_line(text)
    assert len(line) <= 600 and "\n" not in line and "\x00" not in line
    content = merge_messages([text], [text], [text])[0]["content"]
    assert content.count("\n[GROUP 1]\n") == content.count("\n[GROUP 2]\n") == 1
    assert content.count("\n[NOT IN GROUP]\n") == 1
    label = metric_label(text, 48)
    assert 0 < len(label) <= 48 and label not in (OTHER, UNKNOWN)
    assert set(label) <= set("abcdefghijklmnopqrstuvwxyz0123456789 /&+-")
    assert goal_name(group, [text], min_df=2).count(" and ") <= 1
    assert len(extractive_summary([Message("user", text)], 100)) <= 100
    parsed = parse_answer(text, MergeAnswer)
    assert parsed is None or isinstance(parsed.merge, bool)
