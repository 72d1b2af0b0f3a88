"""The normalised message a span's history is made of, and its canonical form.

Every dialect ends here, so one message reads the same whichever instrumentation wrote it, and the
same message repeated in the next span's input (the assistant's reply, a tool result) has the same
canonical bytes and so the same digest and event id.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

import msgspec

from sidecar.otel.errors import OtelRefused
from sidecar.transcript.model import ROLES, Role

DIGEST_BYTES = 16
_CANONICAL = msgspec.json.Encoder(order="sorted")

# Roles some dialects use for what the contract calls system/user/assistant/tool.
_ROLE_ALIASES: dict[str, Role] = {
    "developer": "system",
    "human": "user",
    "ai": "assistant",
    "model": "assistant",
    "function": "tool",
    "ipython": "tool",
}


@dataclass(frozen=True, slots=True)
class OtelToolCall:
    name: str
    arguments: str
    id: str | None = None


@dataclass(frozen=True, slots=True)
class OtelMessage:
    """One message of a span's history, already in the contract's shape."""

    role: Role
    content: str
    name: str | None = None
    tool_calls: tuple[OtelToolCall, ...] = ()

    def contract(self) -> dict[str, Any]:
        """The ``message`` object of a contract-v1 event."""
        out: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.name is not None:
            out["name"] = self.name
        if self.tool_calls:
            out["tool_calls"] = [
                {"name": c.name, "arguments": c.arguments, **({"id": c.id} if c.id is not None else {})}
                for c in self.tool_calls
            ]
        return out

    def digest(self) -> bytes:
        """16 bytes identifying the message's content (role, text, name, tool calls).

        Raises :class:`OtelRefused` (``malformed_messages``) for text that is not valid Unicode (a
        lone surrogate, which JSON escapes can spell): it could not be written as an event either."""
        try:
            canonical = _CANONICAL.encode(self.contract())
        except UnicodeEncodeError:
            raise OtelRefused("malformed_messages", "text with a lone surrogate") from None
        return hashlib.blake2b(canonical, digest_size=DIGEST_BYTES).digest()


def role_of(value: object) -> Role:
    if isinstance(value, str):
        low = value.strip().lower()
        if low in ROLES:
            return low
        if low in _ROLE_ALIASES:
            return _ROLE_ALIASES[low]
    raise OtelRefused("malformed_messages", "a message has no known role")


def canonical_json(value: object, *, max_depth: int) -> str:
    """Tool-call arguments and tool results as text: a text as it is (what a native producer would
    send), a structured value as JSON with sorted keys and no spaces (the event decoder's own
    canonical form for object arguments)."""
    if isinstance(value, str):
        return value
    check_depth(value, max_depth)
    try:
        return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    except (TypeError, ValueError, RecursionError):
        raise OtelRefused("malformed_messages", "tool arguments are not JSON values") from None


def check_depth(value: object, max_depth: int) -> None:
    """Refuse (``too_deep``) a JSON value nested deeper than ``max_depth``; iterative, so any depth is safe."""
    stack: list[tuple[object, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            if depth > max_depth:
                raise OtelRefused("too_deep", f"JSON nested deeper than {max_depth} levels")
            children = item.values() if isinstance(item, dict) else item
            stack.extend((child, depth + 1) for child in children if isinstance(child, dict | list))
