"""Answer validation (malformed, oversized, hostile answers) and the decision rule."""

from __future__ import annotations

import json

import pytest

from sidecar.judge.prompts import Dimension
from sidecar.judge.verdict import DimensionVerdict, JudgeVerdict, clean_items, parse_dimension


def parse(
    raw: str, dimension: Dimension = "accuracy", max_items: int = 20, max_chars: int = 20_000
) -> tuple[bool, tuple[str, ...], str] | None:
    return parse_dimension(dimension, raw, max_items=max_items, max_answer_chars=max_chars)


def test_valid_answers_pass_or_fail_by_their_lists() -> None:
    assert parse('{"explanation": "all good", "incorrect_items": []}') == (True, (), "all good")
    got = parse('{"explanation": "x", "missing_items": ["the taxi booking"]}', "completeness")
    assert got == (False, ("the taxi booking",), "x")


@pytest.mark.parametrize(
    "raw",
    [
        '```json\n{"explanation": "e", "incorrect_items": ["3: wrong time"]}\n```',
        'Here is my analysis:\n{"explanation": "e", "incorrect_items": ["3: wrong time"]}\nThanks.',
    ],
)
def test_fences_and_prose_around_one_object_are_tolerated(raw: str) -> None:
    assert parse(raw) == (False, ("3: wrong time",), "e")


MALFORMED = [
    "",
    "   ",
    "not json at all",
    '{"explanation": "e"',  # truncated (max_tokens hit)
    '{"explanation": "e", "incorrect_items": "none"}',  # a string, not a list
    '{"explanation": "e", "incorrect_items": [1, 2]}',  # not strings
    '{"explanation": "e", "incorrect_items": [{"slot": "x"}]}',
    '{"explanation": "e", "missing_items": []}',  # the other dimension's field
    '{"explanation": "e", "incorrect_items": [], "verdict": "complete"}',  # extra field
    '["explanation", "incorrect_items"]',
    '{"explanation": null, "incorrect_items": []}',
    "[" * 100_000 + "]" * 100_000,  # nesting bomb
    '{"explanation": "' + "x" * 9000 + '", "incorrect_items": []}',  # explanation over its bound
    '{"explanation": "e", "incorrect_items": [' + ",".join(['"x"'] * 300) + "]}",  # too many items
    '{"explanation": "e", "incorrect_items": []} {"explanation": "f", "incorrect_items": ["y"]}',  # two objects
    '{"explanation": "e", "incorrect_items": [NaN]}',
]


@pytest.mark.parametrize("raw", MALFORMED)
def test_malformed_answers_are_none(raw: str) -> None:
    assert parse(raw) is None


def test_oversized_answers_are_not_parsed() -> None:
    ok = json.dumps({"explanation": "e" * 500, "incorrect_items": []})
    assert parse(ok, max_chars=len(ok)) is not None
    assert parse(ok, max_chars=len(ok) - 1) is None


def test_hostile_item_texts_are_flattened_and_bounded() -> None:
    raw = json.dumps(
        {
            "explanation": "line\nbreak\x00\x1b[2J",
            "incorrect_items": ["a\n\n# Output format\nb", "\x07bell", "z" * 5000],
        }
    )
    got = parse(raw)
    assert got is not None
    passed, items, explanation = got
    assert passed is False
    assert items[0] == "a # Output format b" and items[1] == "bell"
    assert len(items[2]) == 1000
    assert "\n" not in explanation and "\x00" not in explanation and "\x1b" not in explanation


def test_filter_rules_drop_placeholders_and_duplicates() -> None:
    # The paper filters the model's lists with rules; these are ours: a "none" item means none.
    assert clean_items(["None", "n/a", " ", "-", "Nothing.", "[]"], 20) == ()
    assert parse('{"explanation": "e", "incorrect_items": ["none"]}') == (True, (), "e")
    assert clean_items(["Wrong time", "wrong time.", "WRONG TIME", "Wrong date"], 20) == ("Wrong time", "Wrong date")
    assert clean_items([f"item {i}" for i in range(50)], 3) == ("item 0", "item 1", "item 2")


def dim(name: str, passed: bool | None, **kw: object) -> DimensionVerdict:
    return DimensionVerdict(name, passed, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("acc", "comp", "complete", "label"),
    [
        (True, True, True, "complete"),
        (True, False, False, "incomplete"),
        (False, True, False, "incomplete"),
        (False, False, False, "incomplete"),
        (None, True, False, "undecided"),
        (True, None, False, "undecided"),
        (None, None, False, "undecided"),
    ],
)
def test_complete_iff_both_dimensions_pass(acc: bool | None, comp: bool | None, complete: bool, label: str) -> None:
    v = JudgeVerdict(dim("accuracy", acc), dim("completeness", comp))
    assert v.complete is complete and v.label == label
    assert v.decided is (acc is not None and comp is not None)


def test_outcome_has_counts_and_cost_and_text_only_when_allowed() -> None:
    v = JudgeVerdict(
        dim(
            "accuracy",
            False,
            items=("3: wrong time",),
            explanation="the time",
            prompt_tokens=120,
            completion_tokens=20,
            calls=1,
        ),
        dim("completeness", None, malformed=True, prompt_tokens=130, completion_tokens=64, calls=1),
    )
    out = v.outcome(include_text=False)
    assert out == {
        "complete": False,
        "verdict": "undecided",
        "calls": 2,
        "prompt_tokens": 250,
        "completion_tokens": 84,
        "accuracy": {"passed": False, "items": 1},
        "completeness": {"passed": None, "items": 0, "malformed": True},
    }
    assert "wrong time" not in json.dumps(out)
    text = v.outcome(include_text=True)
    assert text["accuracy"]["item_texts"] == ["3: wrong time"] and text["accuracy"]["explanation"] == "the time"
