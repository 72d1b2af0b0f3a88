"""``TrainingStoreSink``: the post-score sink that keeps finished conversations for onboarding (file backend).

On each ``conversation_ended`` effect whose ending counts as finished (``end_reasons``) and whose
agent is selected, the conversation's messages (the state's own copy, so already redacted when
``state.redaction`` is on: redaction happens as events arrive) are written as one JSONL record in
the datasets' schema to ``<directory>/<agent>/`` (:mod:`sidecar.training_store.store`), which
``adapters onboard --source DIR --agent NAME`` reads.

Writes run on one worker thread; the effect waits for its write, so a conversation whose effect is
recorded in the results topic is on disk (at-least-once: a crash before the results write repeats
it, and ``adapters`` drops repeated ids; within a process a bounded memory of written ids skips
repeats). A write that fails (disk full, permissions) is logged and counted, the effect goes on:
the store is best effort and must never stall the pipeline. Logs and metrics carry no text.
"""

from __future__ import annotations

import asyncio
import json
from collections import OrderedDict
from collections.abc import Awaitable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

import structlog
from prometheus_client import CollectorRegistry, Counter, Gauge

from sidecar.contract import Effect, TurnContext
from sidecar.lifecycle import Health
from sidecar.telemetry.labels import AgentLabels
from sidecar.training_store.config import TrainingStoreConfig
from sidecar.training_store.store import RotatingJsonlStore
from sidecar.transcript.dataset import message_json
from sidecar.transcript.model import count_turns

log = structlog.get_logger(__name__)

DEFAULT_AGENT = "default"
_REMEMBERED_IDS = 20_000


class TrainingStoreMetrics:
    """Conversations kept or not (closed ``result`` set) and bytes held, per agent label."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.conversations = Counter(
            "sidecar_training_store_conversations_total",
            "Finished conversations offered to the training store, by result (written, duplicate, end_reason, "
            "too_short, too_large, agent_limit, error).",
            ["agent", "result"],
            registry=registry,
        )
        self.bytes = Gauge(
            "sidecar_training_store_bytes",
            "Bytes of the agent's training-store directory as this replica last saw it (bounded by "
            "training_store.max_bytes_per_agent).",
            ["agent"],
            registry=registry,
        )
        self.files_deleted = Counter(
            "sidecar_training_store_files_deleted_total",
            "Oldest training-store files deleted to stay within max_bytes_per_agent.",
            ["agent"],
            registry=registry,
        )


def conversation_record(ctx: TurnContext, agent: str, redacted: bool) -> dict[str, Any]:
    """One line of the store: the datasets' JSONL schema, the sidecar's facts in ``meta``."""
    messages = list(ctx.messages)
    return {
        "conversation_id": ctx.conversation_id,
        "source": agent,
        "domain": "",
        "turns": [message_json(m) for m in messages],
        "meta": {
            "agent": agent,
            "tenant": ctx.tenant,
            "end_reason": ctx.end_reason,
            "split_group": ctx.conversation_id,
            "num_turns": len(messages),
            "num_user_turns": count_turns(messages),
            "redacted": redacted,
            "recorded_at": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        },
    }


def admitted(
    ctx: TurnContext,
    config: TrainingStoreConfig,
    selected: frozenset[str],
    metrics: TrainingStoreMetrics,
    labels: AgentLabels,
) -> str | None:
    """The agent whose store keeps this context, or None: not a finished conversation, an agent not
    selected (not counted: not ours), an ending that does not count or too few user turns (counted)."""
    if ctx.kind != "conversation_ended":
        return None
    agent = ctx.agent or DEFAULT_AGENT
    if selected and agent not in selected:
        return None
    if ctx.end_reason not in config.end_reasons:
        metrics.conversations.labels(labels(ctx.agent), "end_reason").inc()
        return None
    if count_turns(ctx.messages) < config.min_user_turns:
        metrics.conversations.labels(labels(ctx.agent), "too_short").inc()
        return None
    return agent


class TrainingStoreSink:
    """The file backend: an :class:`~sidecar.stage.pipeline.OutcomeSink`, a component and a health
    reporter (the kafka backend is :class:`~sidecar.training_store.topic.KafkaTrainingStoreSink`)."""

    name = "training_store"

    def __init__(
        self, config: TrainingStoreConfig, registry: CollectorRegistry, labels: AgentLabels, *, redacted: bool
    ) -> None:
        if config.directory is None:
            raise ValueError("training_store.directory is required")
        self._cfg = config
        self._labels = labels
        self._redacted = redacted
        self.metrics = TrainingStoreMetrics(registry)
        self._store = RotatingJsonlStore(
            config.directory, max_bytes_per_agent=config.max_bytes_per_agent, max_file_bytes=config.max_file_bytes
        )
        self._pool: ThreadPoolExecutor | None = None
        self._written: OrderedDict[str, None] = OrderedDict()
        self._selected = frozenset(config.agents)
        self._last_error = ""
        self._count = 0

    async def start(self) -> None:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sidecar-training-store")

    async def stop(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            # Writes already queued finish (their effects are waiting on them), then files close.
            await asyncio.get_running_loop().run_in_executor(None, lambda: pool.shutdown(wait=True))
        self._store.close()

    def health(self) -> Health:
        if self._last_error:
            return Health(self.name, False, f"last write failed: {self._last_error}")
        return Health(self.name, True, f"{self._count} conversations written by this replica")

    def _count_result(self, label: str, result: str) -> None:
        self.metrics.conversations.labels(label, result).inc()

    def offer(self, effect: Effect) -> Awaitable[None] | None:
        ctx = effect.ctx
        agent = admitted(ctx, self._cfg, self._selected, self.metrics, self._labels)
        if agent is None:
            return None
        label = self._labels(ctx.agent)
        if ctx.conversation_id in self._written:
            self._count_result(label, "duplicate")
            return None
        if self._pool is None:
            raise RuntimeError("TrainingStoreSink is not started")
        return self._keep(self._pool, ctx, agent, label)

    async def _keep(self, pool: ThreadPoolExecutor, ctx: TurnContext, agent: str, label: str) -> None:
        if await asyncio.get_running_loop().run_in_executor(pool, self._write, ctx, agent, label):
            self._written[ctx.conversation_id] = None
            while len(self._written) > _REMEMBERED_IDS:
                self._written.popitem(last=False)

    def _write(self, ctx: TurnContext, agent: str, label: str) -> bool:
        """On the writer thread: serialise, append, account. Never raises; True once written."""
        if not self._selected and self._store.agents() >= self._cfg.max_agents and self._store.bytes_of(agent) == 0:
            self._count_result(label, "agent_limit")
            return False
        line = (json.dumps(conversation_record(ctx, agent, self._redacted), ensure_ascii=False) + "\n").encode()
        if len(line) > self._cfg.max_file_bytes:
            self._count_result(label, "too_large")
            return False
        try:
            deleted = self._store.append(agent, line)
        except OSError as exc:
            self._last_error = type(exc).__name__
            self._count_result(label, "error")
            log.error("training_store.write_failed", agent=label, error=type(exc).__name__)  # noqa: TRY400 - no traceback
            return False
        self._last_error = ""
        self._count += 1
        if deleted:
            self.metrics.files_deleted.labels(label).inc(deleted)
        self.metrics.bytes.labels(label).set(self._store.bytes_of(agent))
        self._count_result(label, "written")
        return True
