"""``FeedbackLedger``: every judged alert, one row of a compacted topic that every replica reads.

With ``alerting.feedback.adapt_thresholds``, a judgement of an alert (true or false alarm, whose
kind moves: :data:`~sidecar.alerting.thresholds.MOVING_KINDS`) does not move a threshold in the
process that took it. It is written to the compacted topic ``alerting.feedback.topic`` (default
``<kafka.topic>.alert-feedback``), keyed by the feedback's ``event_id``, and every replica follows
the topic from its beginning (a :class:`~sidecar.fleet.table.CompactedTable`) and counts its rows
into :class:`~sidecar.alerting.thresholds.FeedbackThresholds`, whose scale is a function of those
counts alone. Hence:

* **The same on every replica**, and **back after a restart**: the thresholds are a function of
  the topic's rows, whoever reads them and in whatever order.
* **Nothing twice**: a row's key is the feedback event id, so the same judgement written again
  (a replay after a crash, a new owner) replaces its own row and counts once.
* **Nothing lost**: the processor holds the commit below a feedback record until its row is
  acknowledged (:meth:`record` returns the future it pins), and a record re-read after a crash
  whose outcome the journal already shows writes its row again unless the table has it
  (``again``), so a crash between the journal and the row loses nothing.
* **Reversible**: only rows of the configured ``epoch`` count; raising it puts every threshold
  back. ``adapt_thresholds: false`` does the same without touching the topic.

Rows: ``{"v": 1, "agent", "kind", "verdict": "true_alarm"|"false_alarm", "epoch"}``. The topic is
untrusted like every fleet table: a row that does not decode is skipped and counted.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Final

import structlog
from prometheus_client import CollectorRegistry

from sidecar.alerting.config import AlertingConfig
from sidecar.alerting.thresholds import MOVING_KINDS, FeedbackThresholds
from sidecar.fleet.publisher import PublishFailed, TablePublisher
from sidecar.fleet.table import Change, CompactedTable, InvalidRow, TableMetrics
from sidecar.fleet.topics import ensure_compacted_topic
from sidecar.lifecycle import Health
from sidecar.retry import Backoff
from sidecar.source.config import KafkaConfig
from sidecar.supervision import Supervised, spawn
from sidecar.telemetry.labels import AgentLabels

log = structlog.get_logger(__name__)

TABLE: Final = "alert-feedback"
ROW_VERSION: Final = 1
MAX_ROW_BYTES: Final = 2048
MAX_AGENT_CHARS: Final = 256
VERDICTS: Final = ("true_alarm", "false_alarm")
PUBLISH_TIMEOUT_SECONDS: Final = 10.0


@dataclass(frozen=True, slots=True)
class Judgement:
    agent: str | None
    kind: str
    true_alarm: bool
    epoch: int


def encode_judgement(j: Judgement) -> bytes:
    verdict = "true_alarm" if j.true_alarm else "false_alarm"
    return json.dumps(
        {"v": ROW_VERSION, "agent": j.agent, "kind": j.kind, "verdict": verdict, "epoch": j.epoch}
    ).encode()


def decode_judgement(value: bytes) -> Judgement:
    """A row, or :class:`InvalidRow` for anything else (the topic is untrusted)."""
    if len(value) > MAX_ROW_BYTES:
        raise InvalidRow("row too large")
    try:
        doc = json.loads(value)
    except (ValueError, RecursionError) as exc:
        raise InvalidRow("not JSON") from exc
    if not isinstance(doc, dict) or doc.get("v") != ROW_VERSION:
        raise InvalidRow("not a version-1 row")
    agent, kind, verdict, epoch = doc.get("agent"), doc.get("kind"), doc.get("verdict"), doc.get("epoch")
    if agent is not None and (not isinstance(agent, str) or len(agent) > MAX_AGENT_CHARS):
        raise InvalidRow("agent")
    if kind not in MOVING_KINDS or verdict not in VERDICTS:
        raise InvalidRow("kind or verdict")
    if not isinstance(epoch, int) or isinstance(epoch, bool) or not 0 <= epoch < 2**31:
        raise InvalidRow("epoch")
    return Judgement(agent, kind, verdict == "true_alarm", epoch)


class FeedbackLedger:
    """Writes judgements to the topic and counts the topic's rows into the thresholds."""

    name = "alert_feedback_ledger"

    def __init__(
        self,
        alerting: AlertingConfig,
        kafka: KafkaConfig,
        thresholds: FeedbackThresholds,
        agent_label: AgentLabels,
        registry: CollectorRegistry,
    ) -> None:
        self._alerting = alerting
        self._cfg = alerting.feedback
        self._kafka = kafka
        self.thresholds = thresholds
        self._label = agent_label
        self.topic = self._cfg.topic_name(kafka.topic)
        self.table: CompactedTable[Judgement] = CompactedTable(
            TABLE,
            self.topic,
            kafka,
            decode_judgement,
            TableMetrics.on(registry),
            max_rows=self._cfg.max_judgements,
            max_record_bytes=MAX_ROW_BYTES,
        )
        self.table.subscribe(self._changed)
        self._publisher = TablePublisher(self.topic, kafka)
        self._writes: set[asyncio.Task[None]] = set()
        self._counted: dict[str, Judgement] = {}
        self._task: Supervised | None = None
        thresholds.waiting_for = self.topic

    # -- lifecycle -----------------------------------------------------------------------------

    async def start(self) -> None:
        if self._task is None:
            self._task = spawn("alert-feedback-topic", self._run, until_cancelled=False)

    async def _run(self) -> None:
        if self._cfg.create_topic:
            await ensure_compacted_topic(self._kafka, self.topic, replication_factor=self._cfg.replication_factor)
        await self.table.start()
        await self.table.wait_caught_up()
        self.thresholds.waiting_for = None
        self.thresholds.restored()
        log.info("alerting.feedback_ledger_read", topic=self.topic, rows=len(self.table), epoch=self._cfg.epoch)

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            await task.stop()
        for w in list(self._writes):
            w.cancel()
        if self._writes:
            await asyncio.gather(*self._writes, return_exceptions=True)
        await self.table.stop()
        await self._publisher.stop()

    def health(self) -> Health:
        table = self.table.health()
        return Health(self.name, table.ready, f"{self.topic}: {table.detail}")

    # -- writing -------------------------------------------------------------------------------

    def record(
        self, event_id: str, agent: str | None, kind: str, *, true_alarm: bool, again: bool
    ) -> asyncio.Future[None]:
        """Write the judgement of feedback ``event_id`` as its row; the future is done once the row
        is acknowledged (cancelled at stop: the commit stays below the record). ``again``: the
        record was re-read after a restart, its row is written only if the table lacks it."""
        row = Judgement(agent, kind, true_alarm, self._cfg.epoch)
        task = asyncio.ensure_future(self._write(event_id, row, again))
        self._writes.add(task)
        task.add_done_callback(self._writes.discard)
        return task

    async def _write(self, event_id: str, row: Judgement, again: bool) -> None:
        if again:
            await self.table.wait_caught_up()
            if self.table.get(event_id) is not None:
                return
        backoff = Backoff(0.2, 10.0)
        while True:
            try:
                await self._publisher.publish(event_id, encode_judgement(row), timeout_seconds=PUBLISH_TIMEOUT_SECONDS)
            except PublishFailed as exc:
                delay = backoff.delay()
                log.warning(
                    "alerting.feedback_row_failed", topic=self.topic, error=str(exc), retry_in_seconds=round(delay, 2)
                )
                await asyncio.sleep(delay)
            else:
                return

    # -- reading -------------------------------------------------------------------------------

    def _changed(self, change: Change[Judgement]) -> None:
        # The rows counted, by key (the same objects the table holds): a replaced or deleted row
        # takes its old judgement out of the tally first.
        previous = self._counted.pop(change.key, None)
        if previous is not None:
            self._count(previous, -1)
        if change.value is not None and change.value.epoch == self._cfg.epoch:
            self._counted[change.key] = change.value
            self._count(change.value, +1)

    def _count(self, row: Judgement, delta: int) -> None:
        policy = self._alerting.policy_for(row.agent)
        self.thresholds.count(
            self._label(row.agent),
            row.kind,
            true_alarm=row.true_alarm,
            delta=delta,
            configured_rate=policy.uncertainty.target_rate,
            announce=self.table.caught_up,  # what was there before this replica started: one line each
        )
