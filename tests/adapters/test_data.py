"""Cleaning, splitting, truncation and SFT pairing of conversations."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from adapters.data.conversations import (
    BadRecordError,
    Conversation,
    eval_examples,
    in_truncation_protocol,
    parse_record,
    split_of,
    target_start,
    truncate,
    truncation_turn,
)
from adapters.data.prepare import prepare_dataset, sft_pair
from adapters.data.sources import read_conversations
from adapters.data.tokenizer import END_TAG, SPECIAL_TOKENS
from sidecar.transcript.model import Message, count_turns
from sidecar.transcript.render import render_text
from tests.adapters.conftest import synthetic_conversation


def conv_of(rec: dict[str, Any]) -> Conversation:
    return parse_record(rec)


def test_parse_record_keeps_turns_and_never_meta() -> None:
    conv = conv_of(synthetic_conversation(1, 3))
    assert [m.role for m in conv.messages] == ["user", "assistant"] * 3
    assert conv.split_group == "g1"
    assert "SECRET-GOAL-TEXT" not in render_text(conv.messages)
    pair = sft_pair(conv)
    assert "SECRET-GOAL-TEXT" not in pair["input"] + pair["target"]


@pytest.mark.parametrize(
    ("rec", "msg"),
    [
        ([], "not an object"),
        ({"turns": [{"role": "user", "content": "x"}]}, "bad conversation id"),
        ({"conversation_id": "a/1", "turns": []}, "bad messages"),
        ({"conversation_id": "a/1", "turns": [{"role": "robot", "content": "x"}]}, "bad message"),
        ({"conversation_id": "a/1", "turns": [{"role": "user", "content": 3}]}, "bad message"),
        ({"conversation_id": "a/1", "turns": ["hi"]}, "bad message"),
        (
            {"conversation_id": "a/1", "turns": [{"role": "assistant", "content": "", "tool_calls": [{}]}]},
            "bad message",
        ),
        ({"conversation_id": "a/1", "turns": [{"role": "assistant", "content": "", "tool_calls": "x"}]}, "bad message"),
        ({"conversation_id": "a/1", "turns": [{"role": "user", "content": "x"}] * 3000}, "bad messages"),
    ],
)
def test_parse_record_rejects_malformed(rec: Any, msg: str) -> None:
    with pytest.raises(BadRecordError, match=msg):
        parse_record(rec)


def test_taubench_stop_token_is_stripped_and_empty_message_dropped() -> None:
    rec = {
        "conversation_id": "taubench_airline/1",
        "source": "taubench_airline",
        "turns": [
            {"role": "user", "content": "cancel my flight"},
            {"role": "assistant", "content": "done"},
            {"role": "user", "content": "Thanks! ###STOP###"},
            {"role": "user", "content": "###STOP###"},
        ],
        "meta": {"reward": 1.0, "split_group": "task:1"},
    }
    conv = parse_record(rec)
    assert [m.content for m in conv.messages] == ["cancel my flight", "done", "Thanks!"]
    assert conv.real_complete is True
    assert "###STOP###" not in render_text(conv.messages)


def test_star_real_label() -> None:
    rec = synthetic_conversation(2, 2) | {"source": "star"}
    rec["meta"] = {"completed": False, "split_group": "star/2"}
    conv = parse_record(rec)
    assert conv.real_complete is False
    # A STAR disconnect is no positive of the truncation protocol; a failed tau-bench task still ended.
    assert not in_truncation_protocol(conv.real_complete, conv.real_label_source)
    assert in_truncation_protocol(True, conv.real_label_source)
    assert in_truncation_protocol(False, "meta.reward == 1 (tau-bench task reward)")
    assert in_truncation_protocol(None, None)


def test_validation_examples_follow_the_test_protocol(tmp_path: Path) -> None:
    from adapters.evaluation.validate import validation_examples

    (tmp_path / "star").mkdir()
    rows = []
    for i, completed in enumerate([True, False, True, True]):
        rec = synthetic_conversation(i, 3)
        rows.append(
            {
                "conversation_id": rec["conversation_id"],
                "messages": rec["turns"],
                "real_complete": completed,
                "real_label_source": "meta.completed (STAR completion_level)",
            }
        )
    (tmp_path / "star" / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    got = validation_examples(tmp_path, "star", skip=1, limit=None)
    # rows 1.. minus the disconnect: two conversations, each complete + its truncated copy
    assert [y for _, y in got] == [True, False, True, False]
    assert [len(m) for m, _ in got] == [6, len(got[1][0]), 6, len(got[3][0])]
    assert (
        validation_examples(tmp_path, "star", skip=0, limit=1)
        == validation_examples(tmp_path, "star", skip=0, limit=2)[:2]
    )


def test_split_is_stable_balanced_and_grouped() -> None:
    convs = [conv_of(synthetic_conversation(i, 2)) for i in range(2000)]
    sides = [split_of(c) for c in convs]
    assert sides == [split_of(c) for c in convs]
    assert 0.45 < sides.count("train") / len(sides) < 0.55
    a = conv_of(synthetic_conversation(1, 2) | {"conversation_id": "x/1"})
    b = conv_of(synthetic_conversation(1, 3) | {"conversation_id": "x/2"})
    assert a.split_group == b.split_group
    assert split_of(a) == split_of(b)


@settings(max_examples=50, deadline=None)
@given(n=st.integers(1, 12), i=st.integers(0, 10_000))
def test_truncation_is_uniform_range_and_ends_after_a_response(n: int, i: int) -> None:
    conv = conv_of(synthetic_conversation(i, n))
    k = truncation_turn(conv, seed=0)
    if n < 2:
        assert k is None
        assert len(eval_examples(conv, 0)) == 1
        return
    assert k is not None
    assert 1 <= k <= n - 1
    assert truncation_turn(conv, seed=0) == k
    cut = truncate(conv.messages, k)
    assert count_turns(cut) == k
    assert cut == conv.messages[: len(cut)]
    assert conv.messages[len(cut)].role == "user"  # c_k stops right before p_{k+1}
    full, trunc = eval_examples(conv, 0)
    assert full.complete and not trunc.complete
    assert trunc.messages == cut


def test_truncation_turn_is_roughly_uniform() -> None:
    counts = dict.fromkeys(range(1, 5), 0)
    for i in range(4000):
        k = truncation_turn(conv_of(synthetic_conversation(i, 5) | {"conversation_id": f"u/{i}"}), seed=3)
        assert k is not None
        counts[k] += 1
    assert all(800 < c < 1200 for c in counts.values())


def test_target_start() -> None:
    u, a, t = Message("user", "q"), Message("assistant", "r"), Message("tool", "x", name="db")
    assert target_start([u, a]) == 1
    assert target_start([u, a, t, a]) == 1
    assert target_start([u, a, u]) == 2  # the user closes the conversation
    with pytest.raises(ValueError, match="empty"):
        target_start([])


def test_sft_pair_is_render_plus_end_tag_once() -> None:
    rec = synthetic_conversation(5, 3)
    rec["turns"][0]["content"] = f"inject {END_TAG} and <|end_of_text|> here"
    conv = conv_of(rec)
    pair = sft_pair(conv)
    assert pair["input"] + pair["target"] == render_text(conv.messages, SPECIAL_TOKENS) + END_TAG
    assert (pair["input"] + pair["target"]).count(END_TAG) == 1
    assert pair["target"].startswith("TURN 3, STEP 6, assistant chat:\n")
    assert pair["input"].endswith("TURN 3, STEP 5, user chat:\n" + rec["turns"][4]["content"] + "\n\n")
    assert not sft_pair(conv, with_end_tag=False)["target"].endswith(END_TAG)


def test_read_conversations_skips_hostile_lines(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl.gz"
    good = json.dumps(synthetic_conversation(1, 2)).encode()
    with gzip.open(path, "wb") as fh:
        fh.write(b"{not json\n")
        fh.write(b"\xff\xfe\xfa\n")
        fh.write(b"[1, 2]\n")
        fh.write(b"\n")
        fh.write(b'{"conversation_id": "a", "turns": "x"}\n')
        fh.write(b'"' + b"a" * (9 * 1024 * 1024) + b'"\n')
        fh.write(good + b"\n")
    convs = list(read_conversations(path))
    assert [c.conversation_id for c in convs] == ["toy/1"]


def test_prepare_dataset_writes_disjoint_sides(toy_dataset_file: Path, tmp_path: Path) -> None:
    out = tmp_path / "prepared"
    stats = prepare_dataset(toy_dataset_file, out, seed=0, max_train=None, max_test=None)
    train = [json.loads(x) for x in (out / "train.jsonl").read_text().split("\n") if x]
    test = [json.loads(x) for x in (out / "test.jsonl").read_text().split("\n") if x]
    assert stats["train_used"] == len(train) > 0
    train_ids = {r["conversation_id"] for r in train}
    test_ids = {r["conversation_id"] for r in test}
    assert not train_ids & test_ids
    assert sum(r["complete"] for r in test) == len(test_ids)
    assert all(r["target"].endswith(END_TAG) for r in train)
    for r in train:
        assert (
            r["input"] + r["target"]
            == render_text([Message(role=m["role"], content=m["content"]) for m in r["messages"]], SPECIAL_TOKENS)
            + END_TAG
        )
