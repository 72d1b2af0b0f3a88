"""PII redaction before text leaves the sidecar."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.transcript.model import Message, ToolCall
from sidecar.transcript.redact import EMAIL_RE, Redactor, luhn_ok


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("mail me at jane.doe+x@example.co.uk please", "mail me at [EMAIL] please"),
        ("call 01223 356354 now", "call [PHONE] now"),
        ("or +44 20 7946 0958", "or [PHONE]"),
        ("US (415) 555-2671", "US [PHONE]"),
        ("card 4111 1111 1111 1111 exp 12/29", "card [CARD] exp 12/29"),
        ("card 4111-1111-1111-1111", "card [CARD]"),
        ("card 5500005555555559.", "card [CARD]."),
        ("reference 7GAWK763 stays", "reference 7GAWK763 stays"),
        ("at 7pm for 2 people", "at 7pm for 2 people"),
        ("order 1234 5678 9012 3456 is not a card", "order 1234 5678 9012 3456 is not a card"),
    ],
)
def test_builtin_patterns(text: str, expected: str) -> None:
    assert Redactor().redact(text) == expected


def test_luhn() -> None:
    assert luhn_ok("4111111111111111")
    assert not luhn_ok("4111111111111112")


def test_switches_and_custom_patterns() -> None:
    r = Redactor(emails=False, phone_numbers=False, card_numbers=True, patterns={"BOOKING": r"\b[0-9A-Z]{8}\b"})
    assert r.redact("a@b.io ref 7GAWK763 tel 01223 356354") == "a@b.io ref [BOOKING] tel 01223 356354"


def test_messages_and_tool_arguments_are_redacted() -> None:
    m = Message("assistant", "write to a@b.io", tool_calls=(ToolCall("email", '{"to": "a@b.io"}'),))
    out = Redactor().redact_message(m)
    assert out.content == "write to [EMAIL]"
    assert out.tool_calls[0].arguments == '{"to": "[EMAIL]"}'
    assert out.tool_calls[0].name == "email"


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=200), st.emails())
def test_no_email_survives(prefix: str, email: str) -> None:
    out = Redactor().redact(f"{prefix} {email} ")
    assert email not in out or not EMAIL_RE.search(email)


def test_oversized_and_adversarial_inputs_finish() -> None:
    r = Redactor()
    for text in ("1" * 200_000, "1 " * 100_000, "a@" * 50_000, ("+1 (" * 20_000), "-".join(["12"] * 50_000)):
        out = r.redact(text)
        assert isinstance(out, str)
