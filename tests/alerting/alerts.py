"""Alerts for the sink tests: an ordinary one, and one carrying every hostile input we can think of."""

from __future__ import annotations

import time
from typing import Any

from sidecar.alerting.alert import Alert, alert_id


def make_alert(n: int = 0, **overrides: Any) -> Alert:
    now = time.time()
    fields: dict[str, Any] = {
        "id": alert_id("test-group", f"conv-{n}", n, "uncertain_turn"),
        "kind": "uncertain_turn",
        "severity": "warning",
        "conversation_id": f"conv-{n}",
        "turn": n,
        "agent": "support-bot",
        "tenant": "acme",
        "goal": "g3",
        "triggered_at_unix": now - 1.5,
        "created_at_unix": now,
        "summary": "Uncertain turn: 12 leaves, best branch logprob -7.3",
        "details": {"leaves": 12, "max_logprob": -7.31, "threshold": -5.0, "mode": "fixed"},
    }
    fields.update(overrides)
    return Alert(**fields)


def hostile_alert(n: int = 0) -> Alert:
    """Everything a conversation record or a scorer could put into an alert's strings."""
    return make_alert(
        n,
        agent="a/b/+/#/\x00/$SYS/%2F",
        tenant="t/../#\n\r\x7f\u0085\ud800",
        goal="\u202eevil",
        conversation_id="c" * 10_000 + "\ud800",
        summary="line1\nline2\x00" + "s" * 5000,
        details={
            "huge": "x" * 5_000_000,
            "control": "".join(chr(i) for i in range(32)) + "\x7f\u2028",
            "nan": float("nan"),
            "inf": float("-inf"),
            "big": 10**40,
            "surrogate": "\udfff",
            **{f"k{i}-" + "y" * 100: i for i in range(200)},
        },
        text={"best_branch": "b" * 100_000, "remaining_tasks": "\x00" * 50_000, "other": "dropped"},
        tree_url="http://127.0.0.1/trees/" + "u" * 10_000,
    )
