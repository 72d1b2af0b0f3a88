"""Render transcripts as text in the paper's format (Soroka et al., Appendix C).

Each message is one *step*; steps are numbered from 1 across the whole conversation, turns from 1
at each user message (0 for the preamble)::

    TURN 1, STEP 1, user chat:
    I need a table for two tonight.

    TURN 1, STEP 2, assistant action:
    TOOL CALLS: [{"name": "find_restaurant", "arguments": "{\\"people\\": 2}"}]

    TURN 1, STEP 3, tool (find_restaurant) chat:
    ...

Injection safety: message content is untrusted.

* Any occurrence of a *forbidden* string (the end tag and every special-token string of the
  model's tokenizer) inside content is escaped by putting a backslash after its first character,
  so the rendered text can never contain the forbidden string except where the renderer itself
  puts it. Token-level safety (content tokenised with special-token matching disabled) is the
  tokenizer's job; this is the text-level half.
* Structure is unforgeable: a content line that reads like a block header (``TURN <n>, STEP <m>``,
  in any case, after any blank or invisible characters) gets the same backslash after its first
  letter, and a tool name cannot hold a line break. A message can no longer render as several
  steps, which made a one-message conversation read as a finished one. No line of the dialogue
  corpora the bundled models were trained on has this shape ("Turn right at ..." does not), so the
  training renderings are byte-identical with and without this rule.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from sidecar.transcript.model import Message

BLOCK_SEPARATOR = "\n\n"


def escape_content(text: str, forbidden: Iterable[str]) -> str:
    """Break every occurrence of each forbidden string in ``text``.

    Repeats until a fixed point, so escaping cannot itself assemble a forbidden string out of
    overlapping pieces.
    """
    needles = sorted({f for f in forbidden if f}, key=len, reverse=True)
    if not needles:
        return text
    changed = True
    while changed:
        changed = False
        for needle in needles:
            if needle in text:
                text = text.replace(needle, needle[0] + "\\" + needle[1:])
                changed = True
    return text


# A line that could pass for a block header: optional blanks or invisible format characters, then
# "turn <digits>," and "step" in any case. Only that shape is touched ("Turn right" is content).
_HEADER_LIKE = re.compile(
    r"^([^\S\n]*[\u200b-\u200f\u2060-\u2064\ufeff]*[^\S\n]*)(t)(urn[^\S\n]*\d+[^\S\n]*,[^\S\n]*step)",
    re.IGNORECASE | re.MULTILINE,
)


def defuse_headers(text: str) -> str:
    """``text`` with every line that reads like a block header broken by a backslash."""
    return _HEADER_LIKE.sub(r"\1\2\\\3", text)


@dataclass(frozen=True, slots=True)
class Segment:
    """A piece of rendered text; ``trusted`` is False for message content."""

    text: str
    trusted: bool


def _header(turn: int, step: int, m: Message, forbidden: tuple[str, ...] = ()) -> str:
    who: str = m.role
    if m.role == "tool" and m.name:
        # A tool's name comes from the event: untrusted, so escaped like content.
        who = f"tool ({escape_content(' '.join(m.name.split()), forbidden)})"
    kind = "action" if m.tool_calls else "chat"
    return f"TURN {turn}, STEP {step}, {who} {kind}:\n"


def _tool_calls_text(m: Message) -> str:
    calls = [{"name": c.name, "arguments": c.arguments} for c in m.tool_calls]
    return "TOOL CALLS: " + json.dumps(calls, ensure_ascii=False)


def render_segments(messages: Sequence[Message], forbidden: Iterable[str] = ()) -> list[Segment]:
    """The transcript as alternating trusted (headers) and untrusted (content) segments."""
    forbidden = tuple(forbidden)
    out: list[Segment] = []
    turn = 0
    for step, m in enumerate(messages, start=1):
        if m.role == "user":
            turn += 1
        out.append(Segment(_header(turn, step, m, forbidden), trusted=True))
        body = m.content
        if m.tool_calls:
            body = (body + "\n" if body else "") + _tool_calls_text(m)
        out.append(Segment(defuse_headers(escape_content(body, forbidden)), trusted=False))
        out.append(Segment(BLOCK_SEPARATOR, trusted=True))
    return out


def render_text(messages: Sequence[Message], forbidden: Iterable[str] = ()) -> str:
    """The transcript as one string (the completion prompt c_k, or a training input)."""
    return "".join(s.text for s in render_segments(messages, forbidden))


def next_step_header(messages: Sequence[Message], role: str) -> str:
    """The header the next step would get, e.g. to prefix an assistant response."""
    turn = sum(1 for m in messages if m.role == "user") + (1 if role == "user" else 0)
    return f"TURN {turn}, STEP {len(messages) + 1}, {role} chat:\n"
