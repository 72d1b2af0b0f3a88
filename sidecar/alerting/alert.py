"""An escalation alert: what a human is asked to look at, as data every sink renders its own way.

An alert carries ids and numbers; text (the tree's most probable branch, the remaining tasks) only
when ``alerting.include_text`` allows it. Its ``id`` is stable across restarts and replicas: a
hash of (consumer group, conversation, turn, kind), the exactly-once key of the effect it came
from. Delivery is at-least-once; a crash between a delivery and the journal write of its effect
sends the same alert again *with the same id*, which receivers use to drop the repeat (MQTT:
the payload's ``id``; webhooks: the ``webhook-id`` header; Alertmanager: identical labels).

The payload is published as a JSON Schema: ``sidecar/schemas/alert-v1.schema.json``.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

ALERT_VERSION = 1
AlertKind = Literal["uncertain_turn", "conversation_incomplete", "conversation_stalled"]
ALERT_KINDS: tuple[AlertKind, ...] = ("uncertain_turn", "conversation_incomplete", "conversation_stalled")
Severity = Literal["info", "warning", "critical"]
Detail = float | int | str | bool | None


def alert_id(group: str, conversation_id: str, turn: int, kind: str) -> str:
    """The stable id of the alert for one (conversation, turn, kind) in one consumer group."""
    key = "\x00".join([group, conversation_id, str(turn), kind]).encode("utf-8")
    return hashlib.sha256(key).hexdigest()[:32]


def _iso(ts: float | None) -> str | None:
    if ts is None:
        return None
    return datetime.fromtimestamp(ts, tz=UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _finite(value: Detail) -> Detail:
    # JSON has no NaN or infinity: a detail that is not a finite number is sent as null.
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


@dataclass(frozen=True, slots=True)
class Alert:
    id: str
    kind: AlertKind
    severity: Severity
    conversation_id: str
    turn: int
    agent: str
    tenant: str | None
    goal: str | None
    triggered_at_unix: float | None
    created_at_unix: float
    summary: str
    details: Mapping[str, Detail] = field(default_factory=dict)
    text: Mapping[str, str] = field(default_factory=dict)
    tree_url: str | None = None

    def payload(self) -> dict[str, Any]:
        """The alert as the JSON every sink sends (schema ``alert-v1``)."""
        out: dict[str, Any] = {
            "v": ALERT_VERSION,
            "id": self.id,
            "kind": self.kind,
            "severity": self.severity,
            "summary": self.summary,
            "conversation_id": self.conversation_id,
            "turn": self.turn,
            "agent": self.agent,
            "tenant": self.tenant,
            "goal": self.goal,
            "triggered_at": _iso(self.triggered_at_unix),
            "created_at": _iso(self.created_at_unix),
            "details": {k: _finite(v) for k, v in self.details.items()},
        }
        if self.text:
            out["text"] = dict(self.text)
        if self.tree_url is not None:
            out["tree_url"] = self.tree_url
        return out
