"""The demo's view of its alerts, as a downstream consumer sees them: the alert topic on the mock cluster.

:func:`follow_alerts` reads ``alert-v1`` records from the topic the demo's Kafka alert sink writes
to and keeps the last few in an :class:`AlertFeed`, each with its conversation and a link an
operator can open: the alert's own ``tree_url`` (an uncertain turn's response tree) or else the
listener's ``/escalations`` page. A record that is not an alert is skipped, never fatal: the feed
is a window on the pipeline, not part of it.
"""

from __future__ import annotations

import asyncio
import json
import unicodedata
from collections import deque
from dataclasses import dataclass
from typing import Any, Final

from aiokafka import AIOKafkaConsumer

from sidecar.kafka_clients import plaintext_client_kwargs

RECENT_ALERTS: Final = 5
# Longest summary and conversation id kept per alert (the panel cuts further to its width).
MAX_SUMMARY_CHARS: Final = 200
MAX_ID_CHARS: Final = 80
MAX_LINK_CHARS: Final = 300
# The topic appears when the first alert is produced; look for it this often until then.
_METADATA_REFRESH_MS: Final = 2000


def printable(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters with control and format characters (escape sequences,
    bidi overrides) replaced: alert text can hold a conversation's words, and goes to a terminal."""
    return "".join("?" if unicodedata.category(c) in ("Cc", "Cf") else c for c in text[:limit])


@dataclass(frozen=True, slots=True)
class RecentAlert:
    kind: str
    conversation_id: str
    summary: str
    link: str


class AlertFeed:
    """The last :data:`RECENT_ALERTS` alerts read, newest first, and how many were read in all."""

    def __init__(self, pages_url: str, keep: int = RECENT_ALERTS) -> None:
        self._escalations = f"{pages_url.rstrip('/')}/escalations"
        self._recent: deque[RecentAlert] = deque(maxlen=keep)
        self.read = 0

    def add(self, value: bytes) -> RecentAlert | None:
        """Keep the alert in ``value`` (alert-v1 JSON); None when it is not one."""
        try:
            doc: Any = json.loads(value)
        except (ValueError, RecursionError):
            return None
        if not isinstance(doc, dict) or not isinstance(doc.get("kind"), str):
            return None
        tree_url = doc.get("tree_url")
        alert = RecentAlert(
            kind=printable(doc["kind"], 40),
            conversation_id=printable(str(doc.get("conversation_id", "?")), MAX_ID_CHARS),
            summary=printable(str(doc.get("summary", "")), MAX_SUMMARY_CHARS),
            link=printable(str(tree_url), MAX_LINK_CHARS) if _is_link(tree_url) else self._escalations,
        )
        self._recent.append(alert)
        self.read += 1
        return alert

    def recent(self) -> list[RecentAlert]:
        return list(reversed(self._recent))


def _is_link(value: object) -> bool:
    return isinstance(value, str) and value.startswith(("http://", "https://"))


async def follow_alerts(bootstrap: str, topic: str, feed: AlertFeed, stop: asyncio.Event) -> None:
    """Read ``topic`` from its start into ``feed`` until ``stop`` is set (or the task is cancelled)."""
    consumer = AIOKafkaConsumer(
        topic,
        **plaintext_client_kwargs(bootstrap, client_id="sidecar-demo-alerts"),
        group_id=None,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        metadata_max_age_ms=_METADATA_REFRESH_MS,
    )
    try:  # stopped even when cancelled while starting, or it is left open
        await consumer.start()
        while not stop.is_set():
            batch = await consumer.getmany(timeout_ms=500, max_records=100)
            for records in batch.values():
                for record in records:
                    if record.value is not None:
                        feed.add(record.value)
    finally:
        await consumer.stop()


__all__ = ["RECENT_ALERTS", "AlertFeed", "RecentAlert", "follow_alerts", "printable"]
