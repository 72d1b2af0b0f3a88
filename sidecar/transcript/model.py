"""The transcript data model shared by the stream, the scorers and the adapters' training code.

A conversation is a sequence of :class:`Message`. A *turn* ``i`` (1-based) is the ``i``-th user
message plus everything the agent does (assistant and tool messages) until the next user message.
Messages before the first user message (a system prompt, an agent greeting) form turn 0, the
preamble, which is rendered but never scored on its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

Role = Literal["system", "user", "assistant", "tool"]
ROLES: tuple[Role, ...] = ("system", "user", "assistant", "tool")


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A tool call riding on an assistant message; ``arguments`` is a JSON text."""

    name: str
    arguments: str = ""


@dataclass(frozen=True, slots=True)
class Message:
    """One message. ``content`` is untrusted user/agent text and may contain anything."""

    role: Role
    content: str
    name: str | None = None
    tool_calls: tuple[ToolCall, ...] = field(default=())


def turn_index_of(messages: Sequence[Message]) -> list[int]:
    """The turn index of every message (0 for the preamble before the first user message)."""
    out: list[int] = []
    turn = 0
    for m in messages:
        if m.role == "user":
            turn += 1
        out.append(turn)
    return out


def count_turns(messages: Sequence[Message]) -> int:
    """Number of turns (user messages) in ``messages``."""
    return sum(1 for m in messages if m.role == "user")


def prefix_through_turn(messages: Sequence[Message], turn: int) -> list[Message]:
    """The messages of turns 0..``turn`` inclusive (c_k in the paper's notation when k=turn)."""
    out: list[Message] = []
    current = 0
    for m in messages:
        if m.role == "user":
            current += 1
            if current > turn:
                break
        out.append(m)
    return out
