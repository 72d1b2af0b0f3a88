"""What every sink shares: the bounded wire form of an alert, and health while a destination fails.

An alert's fields come from conversation records (agent, tenant and conversation ids) and from
scorers (details, text), so a sink treats them as untrusted. :func:`wire_payload` turns an alert
into the ``alert-v1`` JSON every sink sends: it refuses a malformed alert (an id, kind, severity
or turn no receiver could use) with :class:`AlertRejected`, and otherwise always yields a payload
valid under the published schema and bounded in size, whatever the strings hold.
"""

from __future__ import annotations

import json
import re
import time
from typing import Any

from sidecar.alerting.alert import ALERT_KINDS, Alert
from sidecar.alerting.sinks.base import AlertRejected
from sidecar.lifecycle import Health

# Caps the schema states (alert-v1.schema.json ``maxLength``); the tests check they agree.
SCHEMA_MAX_CHARS = {"summary": 200, "conversation_id": 256, "agent": 64, "tenant": 128, "goal": 64}
MAX_DETAILS = 32
MAX_DETAIL_KEY_CHARS = 64
MAX_DETAIL_CHARS = 512
MAX_TEXT_CHARS = 4096
MAX_URL_CHARS = 2048
# The bound these caps give, with every character a control character escaped as \u00XX (6 bytes):
# 32 details x (64 + 512) chars x 6 = 110,592; two texts x 4096 x 6 = 49,152; the ids, summary and
# url x 6 < 20,000. About 180 KB: below every destination's default limit (Kafka's 1 MiB records).
MAX_PAYLOAD_BYTES = 256 * 1024
TEXT_FIELDS = ("best_branch", "remaining_tasks")
SEVERITIES = ("info", "warning", "critical")
_ID = re.compile(r"[0-9a-f]{32}")
_ELLIPSIS = "\u2026"


def clean_text(value: str, max_chars: int) -> str:
    """``value`` as valid UTF-8 (lone surrogates become '?'), cut to ``max_chars`` with an ellipsis."""
    if len(value) > max_chars:
        value = value[: max_chars - 1] + _ELLIPSIS
    return value.encode("utf-8", "replace").decode("utf-8")


def _detail(value: object) -> object:
    if value is None or isinstance(value, bool | int | float):
        return value  # payload() has already turned NaN and the infinities into null
    if isinstance(value, str):
        return clean_text(value, MAX_DETAIL_CHARS)
    return f"<{type(value).__name__}>"  # not a JSON scalar: its type, never its repr


def wire_payload(alert: Alert) -> dict[str, Any]:
    """``alert.payload()``, checked and bounded: valid under ``alert-v1``, at most ~180 KB as JSON.

    Raises :class:`AlertRejected` for an alert no receiver could use: an id that is not 32 hex
    digits (it is the receivers' dedupe key and a header value), an unknown kind or severity, a
    negative turn or an empty conversation id.
    """
    if not isinstance(alert.id, str) or not _ID.fullmatch(alert.id):
        raise AlertRejected("malformed alert: id is not 32 hex digits")
    if alert.kind not in ALERT_KINDS:
        raise AlertRejected("malformed alert: unknown kind")
    if alert.severity not in SEVERITIES:
        raise AlertRejected("malformed alert: unknown severity")
    if isinstance(alert.turn, bool) or not isinstance(alert.turn, int) or alert.turn < 0:
        raise AlertRejected("malformed alert: turn is not a non-negative integer")
    if not alert.conversation_id:
        raise AlertRejected("malformed alert: empty conversation id")
    out = alert.payload()
    for key, cap in SCHEMA_MAX_CHARS.items():
        if isinstance(out[key], str):
            out[key] = clean_text(out[key], cap)
    details = list(out["details"].items())[:MAX_DETAILS]
    out["details"] = {clean_text(str(k), MAX_DETAIL_KEY_CHARS): _detail(v) for k, v in details}
    if "text" in out:
        text = {k: clean_text(str(out["text"][k]), MAX_TEXT_CHARS) for k in TEXT_FIELDS if k in out["text"]}
        if text:
            out["text"] = text
        else:
            del out["text"]
    if "tree_url" in out:
        out["tree_url"] = clean_text(str(out["tree_url"]), MAX_URL_CHARS)
    return out


def encode_payload(alert: Alert) -> bytes:
    """The JSON bytes of :func:`wire_payload` (compact UTF-8; never NaN, never a lone surrogate)."""
    return dump_json(wire_payload(alert))


def dump_json(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode("utf-8")


class DestinationHealth:
    """Ready until a delivery fails; not ready, with the reason and since when, until one succeeds.

    Reasons are short and fixed by the sink (an HTTP status, an exception's type, an MQTT reason
    code): never a URL, a header or an alert's content, so nothing secret reaches ``/readyz``.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self._failing_since: float | None = None
        self._reason = ""

    def ok(self) -> None:
        self._failing_since = None
        self._reason = ""

    def failed(self, reason: str) -> None:
        if self._failing_since is None:
            self._failing_since = time.monotonic()
        self._reason = reason

    @property
    def failing(self) -> bool:
        return self._failing_since is not None

    def health(self, ok_detail: str = "ok") -> Health:
        if self._failing_since is None:
            return Health(self.name, True, ok_detail)
        age = time.monotonic() - self._failing_since
        return Health(self.name, False, f"{self._reason} (failing for {age:.0f}s)")
