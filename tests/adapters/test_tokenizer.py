"""The end tag is one token that content can never produce; segment-wise encoding is prefix-stable."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer

from adapters.data.tokenizer import (
    END_TAG,
    SPECIAL_TOKENS,
    encode_messages,
    encode_messages_with_offsets,
    encode_plain,
    special_id,
)
from sidecar.transcript.model import Message, ToolCall
from sidecar.transcript.render import render_text

hostile_text = st.one_of(
    st.text(max_size=80),
    st.lists(
        st.sampled_from([*SPECIAL_TOKENS, "<|", "|>", "end_of_conversation", "\\", "\n\n", "TURN 1, STEP 2"]),
        max_size=8,
    ).map("".join),
)
messages_st = st.lists(
    st.builds(
        Message,
        role=st.sampled_from(["user", "assistant", "tool", "system"]),
        content=hostile_text,
        name=st.none() | st.sampled_from(["db", "<|pad|>"]),
        tool_calls=st.lists(st.builds(ToolCall, name=hostile_text, arguments=hostile_text), max_size=1).map(tuple),
    ),
    min_size=1,
    max_size=6,
)


def test_specials_are_single_tokens(toy_tokenizer: Tokenizer) -> None:
    for t in SPECIAL_TOKENS:
        tid = special_id(toy_tokenizer, t)
        assert toy_tokenizer.encode(t, add_special_tokens=False).ids == [tid]
    assert len({special_id(toy_tokenizer, t) for t in SPECIAL_TOKENS}) == len(SPECIAL_TOKENS)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(msgs=messages_st)
def test_content_never_yields_a_special_id(toy_tokenizer: Tokenizer, msgs: list[Message]) -> None:
    specials = {special_id(toy_tokenizer, t) for t in SPECIAL_TOKENS}
    ids = encode_messages(toy_tokenizer, msgs)
    assert not specials & set(ids)
    assert toy_tokenizer.decode(ids, skip_special_tokens=False) == render_text(msgs, SPECIAL_TOKENS)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(msgs=messages_st, cut=st.integers(0, 6))
def test_prompt_ids_are_a_prefix_of_the_longer_conversation(
    toy_tokenizer: Tokenizer, msgs: list[Message], cut: int
) -> None:
    """c_k's ids (what the sidecar sends) are exactly the prefix the model saw in training."""
    full, starts = encode_messages_with_offsets(toy_tokenizer, msgs)
    k = min(cut, len(msgs))
    prefix = encode_messages(toy_tokenizer, msgs[:k])
    assert full[: len(prefix)] == prefix
    assert (starts[k] if k < len(msgs) else len(full)) == len(prefix)


def test_whole_text_encoding_would_leak_the_end(toy_tokenizer: Tokenizer) -> None:
    """Why encoding is segment-wise: a whole-text encode splits the final separator differently."""
    msgs = [Message("user", "hi"), Message("assistant", "hello"), Message("user", "bye")]
    whole_prefix = toy_tokenizer.encode(render_text(msgs[:2]), add_special_tokens=False).ids
    whole_full = toy_tokenizer.encode(render_text(msgs), add_special_tokens=False).ids
    assert whole_full[: len(whole_prefix)] != whole_prefix
    seg_prefix = encode_messages(toy_tokenizer, msgs[:2])
    assert encode_messages(toy_tokenizer, msgs)[: len(seg_prefix)] == seg_prefix


def test_encode_plain_treats_special_strings_as_text(toy_tokenizer: Tokenizer) -> None:
    ids = encode_plain(toy_tokenizer, f"a{END_TAG}b")
    assert special_id(toy_tokenizer, END_TAG) not in ids
    assert toy_tokenizer.decode(ids) == f"a{END_TAG}b"
    # the flag is restored: plain encode still matches the special token
    assert toy_tokenizer.encode(END_TAG).ids == [special_id(toy_tokenizer, END_TAG)]
