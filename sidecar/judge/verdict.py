"""Answer validation and the decision rule: what one judgement says, and what both say together.

* An answer is read as JSON of its dimension's schema (a code fence or prose around the one JSON
  object is tolerated, because free-text mode and some models add them). Anything else - empty,
  longer than the limit, not JSON, another shape, nested past the parser's depth - is *malformed*:
  the safe default is "not passed, unknown" (``passed=None``), and the caller counts it.
* The items are cleaned as the paper filters its lists with rules: whitespace flattened, cut to a
  bounded length, empty and placeholder items ("none", "n/a", "nothing"...) dropped, duplicates
  (case-insensitive) dropped, at most ``max_items`` kept. A dimension passes iff no item is left.
* Decision rule (paper Section 2.3): the conversation is complete iff both dimensions passed. A
  malformed or failed judgement never passes, so ``complete`` is then False, and ``decided`` is
  False to tell "judged incomplete" from "could not judge".
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from sidecar.judge.prompts import ANSWERS, MAX_ITEM_CHARS, AccuracyAnswer, Dimension

_FENCE = re.compile(r"^\s*```(?:json)?\s*(.*?)\s*```\s*$", re.IGNORECASE | re.DOTALL)
_WS = re.compile(r"\s+")
_CTRL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
PLACEHOLDERS = frozenset(
    {
        "",
        "-",
        "--",
        "none",
        "none.",
        "n/a",
        "na",
        "nil",
        "null",
        "nothing",
        "no",
        "empty",
        "[]",
        "{}",
        "no issues",
        "no incorrect items",
        "no missing items",
        "not applicable",
    }
)


def _json_object_text(raw: str) -> str:
    fenced = _FENCE.match(raw)
    if fenced:
        return fenced.group(1)
    start, end = raw.find("{"), raw.rfind("}")
    return raw[start : end + 1] if 0 <= start < end else raw


def clean_items(items: list[str], max_items: int) -> tuple[str, ...]:
    """The paper's filter rules, adapted: flatten, cut, drop placeholders and duplicates, bound."""
    out: list[str] = []
    seen: set[str] = set()
    for item in items:
        text = _WS.sub(" ", _CTRL.sub(" ", item)).strip()[:MAX_ITEM_CHARS]
        key = text.lower().strip(" .")
        if key in PLACEHOLDERS or text.lower() in PLACEHOLDERS or key in seen:
            continue
        seen.add(key)
        out.append(text)
        if len(out) >= max_items:
            break
    return tuple(out)


@dataclass(frozen=True, slots=True)
class DimensionVerdict:
    """One judgement. ``passed`` is None when the answer was malformed or the call failed."""

    dimension: Dimension
    passed: bool | None
    items: tuple[str, ...] = ()
    explanation: str = ""
    malformed: bool = False
    error: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    calls: int = 0

    @property
    def valid(self) -> bool:
        return self.passed is not None


def parse_dimension(
    dimension: Dimension, raw: str, *, max_items: int, max_answer_chars: int
) -> tuple[bool, tuple[str, ...], str] | None:
    """(passed, items, explanation) of a valid answer, or None when ``raw`` is malformed."""
    if not raw.strip() or len(raw) > max_answer_chars:
        return None
    try:
        data: Any = json.loads(_json_object_text(raw))
        answer = ANSWERS[dimension].model_validate(data)
    except (ValueError, ValidationError, RecursionError):
        return None
    raw_items = answer.incorrect_items if isinstance(answer, AccuracyAnswer) else answer.missing_items
    items = clean_items(raw_items, max_items)
    explanation = _WS.sub(" ", _CTRL.sub(" ", answer.explanation)).strip()
    return (not items, items, explanation)


@dataclass(frozen=True, slots=True)
class JudgeVerdict:
    """Both judgements of one conversation and the decision, with what they cost."""

    accuracy: DimensionVerdict
    completeness: DimensionVerdict
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def complete(self) -> bool:
        """The paper's rule: complete iff both dimensions passed."""
        return self.accuracy.passed is True and self.completeness.passed is True

    @property
    def decided(self) -> bool:
        """Both judgements gave a valid answer (else ``complete`` is the safe default, False)."""
        return self.accuracy.valid and self.completeness.valid

    @property
    def label(self) -> str:
        """complete, incomplete, or undecided (a judgement was malformed or failed)."""
        if not self.decided:
            return "undecided"
        return "complete" if self.complete else "incomplete"

    @property
    def calls(self) -> int:
        return self.accuracy.calls + self.completeness.calls

    @property
    def prompt_tokens(self) -> int:
        return self.accuracy.prompt_tokens + self.completeness.prompt_tokens

    @property
    def completion_tokens(self) -> int:
        return self.accuracy.completion_tokens + self.completeness.completion_tokens

    def outcome(self, *, include_text: bool) -> dict[str, Any]:
        """A small JSON mapping: the decision, per-dimension status and counts, the cost.

        Item texts and explanations paraphrase the conversation: only with ``include_text``."""
        out: dict[str, Any] = {
            "complete": self.complete,
            "verdict": self.label,
            "calls": self.calls,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
        }
        for d in (self.accuracy, self.completeness):
            dim: dict[str, Any] = {"passed": d.passed, "items": len(d.items)}
            if d.malformed:
                dim["malformed"] = True
            if d.error is not None:
                dim["error"] = d.error
            if include_text:
                dim["item_texts"] = list(d.items)
                dim["explanation"] = d.explanation
            out[d.dimension] = dim
        return out
