"""Optional PII redaction, applied to every message as it enters the sidecar's state.

Replaces e-mail addresses, phone numbers, payment card numbers (Luhn-checked, so order numbers of
the same length survive) and operator-supplied patterns with ``[EMAIL]``, ``[PHONE]``, ``[CARD]``
and ``[<LABEL>]``. Cards run before phones, so a card number is never half-eaten as a phone.
Redaction is best effort by nature (regular expressions, not an NER model): it is a guard against
the common cases, documented as such.

Patterns are compiled once; every pattern is linear-time on the built-ins, and operator patterns
are applied to content already bounded by the sidecar's message-size limit.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Protocol

from sidecar.transcript.model import Message, ToolCall

EMAIL_RE = re.compile(r"[A-Za-z0-9._%+-]{1,64}@[A-Za-z0-9-]{1,63}(?:\.[A-Za-z0-9-]{1,63})+")
# 13-19 digits, optionally grouped by single spaces or dashes.
CARD_RE = re.compile(r"(?<![\d-])\d(?:[ -]?\d){12,18}(?![\d-])")
# International or national numbers: optional +CC, optional (area), groups of digits; 7-15 digits.
PHONE_RE = re.compile(r"(?<![\w+])(?:\+\d{1,3}[ .-]?)?(?:\(\d{1,5}\)[ .-]?)?\d{2,5}(?:[ .-]?\d{2,5}){1,4}(?!\w)")
_MIN_PHONE_DIGITS = 7
_MAX_PHONE_DIGITS = 15


class RedactionSettings(Protocol):
    """What :func:`redactor_for` reads (``state.redaction`` in the configuration tree)."""

    @property
    def enabled(self) -> bool: ...
    @property
    def emails(self) -> bool: ...
    @property
    def phone_numbers(self) -> bool: ...
    @property
    def card_numbers(self) -> bool: ...
    @property
    def patterns(self) -> Mapping[str, str]: ...


def luhn_ok(digits: str) -> bool:
    """The Luhn checksum every payment card number satisfies."""
    total = 0
    for i, ch in enumerate(reversed(digits)):
        d = ord(ch) - 48
        if i % 2 == 1:
            d *= 2
            if d > 9:
                d -= 9
        total += d
    return total % 10 == 0


def _card(match: re.Match[str]) -> str:
    digits = re.sub(r"\D", "", match.group(0))
    return "[CARD]" if luhn_ok(digits) else match.group(0)


def _phone(match: re.Match[str]) -> str:
    n = sum(ch.isdigit() for ch in match.group(0))
    return "[PHONE]" if _MIN_PHONE_DIGITS <= n <= _MAX_PHONE_DIGITS else match.group(0)


class Redactor:
    """Applies the configured replacements to text and to whole messages."""

    def __init__(
        self,
        *,
        emails: bool = True,
        phone_numbers: bool = True,
        card_numbers: bool = True,
        patterns: Mapping[str, str] | None = None,
    ) -> None:
        self._emails = emails
        self._phones = phone_numbers
        self._cards = card_numbers
        self._extra = [(f"[{label}]", re.compile(p)) for label, p in (patterns or {}).items()]

    def redact(self, text: str) -> str:
        """``text`` with every match replaced by its label."""
        for label, pattern in self._extra:
            text = pattern.sub(label, text)
        if self._emails:
            text = EMAIL_RE.sub("[EMAIL]", text)
        if self._cards:
            text = CARD_RE.sub(_card, text)
        if self._phones:
            text = PHONE_RE.sub(_phone, text)
        return text

    def redact_message(self, message: Message) -> Message:
        calls = tuple(ToolCall(c.name, self.redact(c.arguments)) for c in message.tool_calls)
        return replace(message, content=self.redact(message.content), tool_calls=calls)

    def redact_messages(self, messages: Sequence[Message]) -> list[Message]:
        return [self.redact_message(m) for m in messages]


def redactor_for(config: RedactionSettings) -> Redactor | None:
    """The redactor a configuration asks for, or None when redaction is off."""
    if not config.enabled:
        return None
    return Redactor(
        emails=config.emails,
        phone_numbers=config.phone_numbers,
        card_numbers=config.card_numbers,
        patterns=config.patterns,
    )
