"""The prompts of Algorithm 1 (paper Appendix B.1) and the JSON answers we ask for.

The describe and merge prompts follow the paper's wording. The paper does not print its summary
prompt, only summaries that start "The user's high-level intent is ..."; ours asks for exactly
that, after the optional application-context paragraph the paper uses for specialised agents.

Every example shown to the model is untrusted conversation text: it is flattened to one line (so
it cannot fake a ``[GROUP]`` header on a line of its own) and cut to a bounded length.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict, Field

from sidecar.transcript.model import Message

MAX_EXAMPLE_CHARS = 600
MAX_ANSWER_CHARS = 2000

_WS = re.compile(r"\s+")
_CTRL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
_HEADER = re.compile(r"\[(?=(?:NOT IN )?GROUP)", re.IGNORECASE)


def one_line(text: str, limit: int = MAX_EXAMPLE_CHARS) -> str:
    """Flatten untrusted text to one bounded line; section markers are defused."""
    text = _CTRL.sub(" ", text)
    text = _WS.sub(" ", text).strip()
    text = _HEADER.sub("(", text)
    return text[:limit]


class SummaryAnswer(BaseModel):
    """What the summary prompt must return."""

    model_config = ConfigDict(extra="forbid")

    intent: str = Field(min_length=3, max_length=MAX_ANSWER_CHARS)


class DescribeAnswer(BaseModel):
    """What the describe prompt must return."""

    model_config = ConfigDict(extra="forbid")

    description: str = Field(min_length=3, max_length=MAX_ANSWER_CHARS)


class MergeAnswer(BaseModel):
    """What the merge prompt must return; ``description`` is informative only (we re-describe)."""

    model_config = ConfigDict(extra="forbid")

    merge: bool
    description: str = Field("", max_length=MAX_ANSWER_CHARS)


def summary_messages(transcript: Sequence[Message], application_context: str, max_chars: int) -> list[dict[str, str]]:
    """Chat messages asking for the user's high-level intent in one or two sentences."""
    lines: list[str] = []
    for m in transcript:
        if m.role == "system":
            continue  # the agent's own instructions are not the user's goal
        who = "tool" if m.role == "tool" else m.role
        lines.append(f"{who}: {one_line(m.content, max_chars)}")
    log = "\n".join(lines)[:max_chars]
    parts = []
    if application_context.strip():
        parts.append(one_line(application_context, 4000))
    parts.append(
        "Based on the [INPUT LOG], describe the user's **high-level intent** in one or two "
        'concise sentences starting with "The user\'s high-level intent is". Answer as JSON: '
        '{"intent": "..."}.'
    )
    parts.append("[INPUT LOG]\n" + log)
    return [{"role": "user", "content": "\n\n".join(parts)}]


def _bullets(items: Sequence[str]) -> str:
    if not items:
        return "- This group is empty."
    return "\n".join(f"- {one_line(s)}" for s in items)


def describe_messages(group: Sequence[str], not_in_group: Sequence[str]) -> list[dict[str, str]]:
    """Phase 1 prompt: summarise [GROUP] in one sentence that excludes [NOT IN GROUP]."""
    content = (
        "You will see a list [GROUP] of task descriptions that all have something in common, and a "
        "list [NOT IN GROUP] of task descriptions that do not fit with the group. Please summarize "
        "the [GROUP] in one sentence. The sentence should describe tasks in the [GROUP], and should "
        'not describe tasks listed under [NOT IN GROUP]. Answer as JSON: {"description": "..."}.\n'
        f"[GROUP]\n{_bullets(group)}\n\n[NOT IN GROUP]\n{_bullets(not_in_group)}"
    )
    return [{"role": "user", "content": content}]


def merge_messages(group1: Sequence[str], group2: Sequence[str], others: Sequence[str]) -> list[dict[str, str]]:
    """Phase 2 prompt: should [GROUP 1] and [GROUP 2] be merged?"""
    content = (
        "You will see two groups of task descriptions, and a third list of unrelated tasks that "
        "aren't in either group. Your goal is to determine whether the two groups should be merged. "
        "If so, determine a description for the merged groups that accurately describes them and "
        "does not describe the unrelated tasks. Answer as JSON: "
        '{"merge": true or false, "description": "..."}.\n'
        f"[GROUP 1]\n{_bullets(group1)}\n\n[GROUP 2]\n{_bullets(group2)}\n\n"
        f"[NOT IN GROUP]\n{_bullets(others)}"
    )
    return [{"role": "user", "content": content}]
