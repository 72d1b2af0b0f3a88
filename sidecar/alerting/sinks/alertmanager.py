"""Alerts to Prometheus Alertmanager: ``POST {url}/api/v2/alerts`` with one alert per request.

Alertmanager identifies an alert by its label set, so a re-sent alert (same ``alert_id`` label)
updates the one it already holds instead of paging twice. Label names are fixed here and all match
Alertmanager's ``[a-zA-Z_][a-zA-Z0-9_]*``; label values and annotations are the alert's bounded
wire fields (:func:`~sidecar.alerting.sinks._common.wire_payload`). ``endsAt`` is now plus
``resolve_after_seconds``: the alert resolves by itself unless it is sent again.
"""

from __future__ import annotations

import math
import time
from datetime import UTC, datetime
from typing import Any

import httpx

from sidecar.alerting.alert import ALERT_KINDS, Alert
from sidecar.alerting.config import AlertmanagerSinkConfig
from sidecar.alerting.sinks._common import dump_json, wire_payload
from sidecar.alerting.sinks._http import HttpDestination
from sidecar.alerting.sinks.base import AlertRejected
from sidecar.lifecycle import Health

ALERTNAMES = {kind: "Agent" + "".join(part.capitalize() for part in kind.split("_")) for kind in ALERT_KINDS}
MAX_LABEL_CHARS = 256
MAX_DESCRIPTION_CHARS = 2048
MAX_TEXT_ANNOTATION_CHARS = 1024


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, tz=UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _cut(value: str, max_chars: int) -> str:
    return value if len(value) <= max_chars else value[: max_chars - 1] + "\u2026"


def _fmt(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def describe(payload: dict[str, Any]) -> str:
    """One line for humans: what fired where, then the numbers behind it (``name=value, ...``)."""
    head = (
        f"{payload['kind']} on turn {payload['turn']} of conversation {payload['conversation_id']} "
        f"(agent {payload['agent'] or '-'})"
    )
    numbers = ", ".join(f"{k}={_fmt(v)}" for k, v in payload["details"].items())
    return _cut(f"{head}: {numbers}" if numbers else head, MAX_DESCRIPTION_CHARS)


def to_alertmanager(alert: Alert, cfg: AlertmanagerSinkConfig, now_unix: float) -> dict[str, Any]:
    """The Alertmanager v2 ``postableAlert`` for ``alert``; raises :class:`AlertRejected` if none can be built."""
    payload = wire_payload(alert)
    alertname = ALERTNAMES.get(payload["kind"])
    if alertname is None:  # wire_payload refuses unknown kinds; kept so a new kind cannot slip through unnamed
        raise AlertRejected("no alertname for this kind")
    labels = {
        "alertname": alertname,
        "severity": payload["severity"],
        "agent": payload["agent"],
        "conversation_id": payload["conversation_id"],
        "turn": str(payload["turn"]),
        "alert_id": payload["id"],
    }
    for optional in ("tenant", "goal"):
        if payload[optional]:
            labels[optional] = payload[optional]
    # An empty value means "no such label" to Alertmanager; drop it rather than send a confusing one.
    labels = {k: _cut(v, MAX_LABEL_CHARS) for k, v in labels.items() if v}
    annotations = {"summary": payload["summary"], "description": describe(payload)}
    if "tree_url" in payload:
        annotations["tree_url"] = payload["tree_url"]
    for name, text in payload.get("text", {}).items():
        annotations[name] = _cut(text, MAX_TEXT_ANNOTATION_CHARS)
    started = alert.triggered_at_unix if alert.triggered_at_unix is not None else alert.created_at_unix
    if not math.isfinite(started):
        raise AlertRejected("malformed alert: start time is not finite")
    out: dict[str, Any] = {
        "labels": labels,
        "annotations": annotations,
        "startsAt": _iso(started),
        "endsAt": _iso(now_unix + cfg.resolve_after_seconds),
    }
    generator = cfg.generator_url or payload.get("tree_url")
    if generator and generator.startswith(("http://", "https://")):
        out["generatorURL"] = generator
    return out


class AlertmanagerAlertSink:
    """An :class:`~sidecar.alerting.sinks.base.AlertSink` for Alertmanager's v2 API."""

    name = "alertmanager"

    def __init__(self, cfg: AlertmanagerSinkConfig, *, transport: httpx.AsyncBaseTransport | None = None) -> None:
        self._cfg = cfg
        headers = {"content-type": "application/json"}
        if cfg.bearer_token is not None:
            headers["authorization"] = f"Bearer {cfg.bearer_token.get_secret_value()}"
        self._http = HttpDestination(
            self.name,
            cfg.url.rstrip("/") + "/api/v2/alerts",
            timeout_seconds=cfg.timeout_seconds,
            headers=headers,
            transport=transport,
        )

    async def start(self) -> None:
        await self._http.start()

    async def stop(self) -> None:
        await self._http.stop()

    async def send(self, alert: Alert) -> None:
        body = dump_json([to_alertmanager(alert, self._cfg, time.time())])
        await self._http.post(body, {})

    def health(self) -> Health:
        return self._http.health()
