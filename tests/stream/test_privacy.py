"""PII never leaves the sidecar when redaction is on, whatever path the text takes.

Conversations full of e-mail addresses, card and phone numbers go through the real processor
with the real scoring hooks (prompts to a recording toy model, text allowed in outcomes) and the
real goal clusterer (summaries and cluster descriptions to a recording LLM), with a malformed
record whose field names carry PII too. Then every place text can reach is searched: the prompts,
the clustering requests, the results records, the dead-letter details, the log lines and the
Prometheus exposition.
"""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import structlog
from prometheus_client import CollectorRegistry, generate_latest

from sidecar.clustering.config import ClusteringConfig
from sidecar.clustering.live import GoalClusterer
from sidecar.clustering.llm import MergeQuery, extractive_summary
from sidecar.scoring.config import ScoringConfig
from sidecar.scoring.hooks import ScoringHooks
from sidecar.source.journal import Recovery, SourceRecord
from sidecar.source.processor import PartitionProcessor
from sidecar.state.config import StateConfig
from sidecar.state.hooks import CompositeHooks
from sidecar.telemetry.config import LoggingConfig
from sidecar.telemetry.logging import configure_logging
from sidecar.telemetry.stream_metrics import StreamMetrics
from sidecar.transcript.model import Message
from tests.clustering.fakes import HashEmbedder
from tests.scoring.fakes import ToyLM
from tests.stream.fakes import FakeJournal, event, record
from tests.support.tiny_model import build_tokenizer

EMAIL = "jane.roe@example.org"
CARD = "4111 1111 1111 1111"
PHONE = "+44 20 7946 0958"
SECRETS = (EMAIL, "jane.roe", CARD, "4111", PHONE, "7946")


class RecordingLM(ToyLM):
    def __init__(self) -> None:
        super().__init__(vocab=512, seed=3, peak=1.5)
        self.prompts: list[list[int]] = []

    async def generate(self, model: str, prompts: Any, **k: Any) -> Any:
        self.prompts.extend(list(p) for p in prompts)
        return await super().generate(model, prompts, **k)


class RecordingGoalLLM:
    """Keeps every text the clusterer sends to its LLM."""

    def __init__(self) -> None:
        self.sent: list[str] = []

    @property
    def describe_examples(self) -> int:
        return 10

    async def summarize(self, transcript: Sequence[Message]) -> str:
        self.sent.extend(m.content for m in transcript)
        return extractive_summary(transcript, 600)

    async def describe(self, group: Sequence[str], not_in_group: Sequence[str], previous: str | None = None) -> str:
        self.sent.extend([*group, *not_in_group])
        return "booking help"

    async def should_merge(self, query: MergeQuery) -> bool:
        self.sent.extend([*query.group1, *query.group2])
        return False


class RecordingDeadLetters(FakeJournal):
    def __init__(self) -> None:
        super().__init__()
        self.details: list[str] = []

    async def dead_letter(self, record: SourceRecord, reason: str, detail: str) -> None:
        self.details.append(f"{reason}: {detail}")
        await super().dead_letter(record, reason, detail)


@pytest.fixture
def log_stream() -> Iterator[io.StringIO]:
    out = io.StringIO()
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    configure_logging(LoggingConfig(level="debug", format="json"), stream=out)
    yield out
    structlog.reset_defaults()
    for h in list(root.handlers):
        if h not in handlers:
            root.removeHandler(h)
    root.setLevel(level)


async def test_no_path_carries_pii_when_redaction_is_on(tmp_path: Path, log_stream: io.StringIO) -> None:
    build_tokenizer(tmp_path)
    registry = CollectorRegistry()
    lm = RecordingLM()
    scoring = ScoringHooks.from_config(
        ScoringConfig(
            enabled=True,
            tokenizer={"model_dir": str(tmp_path)},
            agents={"a": {"adapter": "completion-a"}},
            tree={"alpha": 0.1, "max_depth_tokens": 6, "include_text_in_outcome": True},
            completion={"include_text_in_outcome": True},
        ),
        registry,
        client=lm,
    )
    goal_llm = RecordingGoalLLM()
    goals = GoalClusterer(
        ClusteringConfig(enabled=True, k1=3, min_conversations=4, reservoir_size=50, top_n_labels=5),
        registry,
        llm=goal_llm,
        embedder=HashEmbedder(dim=64),
    )
    journal = RecordingDeadLetters()
    processor = PartitionProcessor(
        partition=0,
        state_config=StateConfig(redaction={"enabled": True}),
        hooks=CompositeHooks({"scoring": scoring, "goals": goals}),
        results=journal,
        dead_letters=journal,
        metrics=StreamMetrics(registry),
        recovery=Recovery.from_journal(start_offset=0, replay_until=0, journal_from=0, journal_end=0, records=[]),
        max_record_bytes=10_000,
        max_pending=8,
    )
    pii = f"I am {EMAIL}, card {CARD}, call me on {PHONE}"
    offset = 0
    for c in range(6):
        cid = f"c{c}"
        for seq, (role, text) in enumerate(
            [("user", f"book a table. {pii}"), ("assistant", f"Sure, I mailed {EMAIL}"), ("user", pii)]
        ):
            await processor.process(record(offset, event(cid, seq, role, text)), 0.0)
            offset += 1
        await processor.process(record(offset, event(cid, 3, None, end=True)), 0.0)
        offset += 1
    hostile_field = {**event("bad", 0, "user", "x"), "message": {"role": "user", "content": "x", EMAIL: CARD}}
    await processor.process(record(offset, hostile_field), 0.0)
    await processor.release(5.0, 5.0)
    assert await goals.recluster("test")
    await scoring.stop()

    prompts = [scoring.scorers.tokenizer.decode(p) for p in lm.prompts]
    places = {
        "prompts": "\n".join(prompts),
        "clustering requests": "\n".join(goal_llm.sent),
        "results": json.dumps(journal.results),
        "dead-letter details": "\n".join(journal.details),
        "logs": log_stream.getvalue(),
        # Names and labels only: a sample's value may contain the digits "7946" by chance.
        "metrics": "\n".join(line.rsplit(" ", 1)[0] for line in generate_latest(registry).decode().splitlines()),
        "clusters": json.dumps(goals.snapshot()),
    }
    assert lm.prompts and goal_llm.sent and journal.details  # every path was exercised
    assert "[EMAIL]" in places["prompts"] and "[CARD]" in places["clustering requests"]
    assert "[PHONE]" in places["prompts"]
    leaks = {where: [s for s in SECRETS if s in text] for where, text in places.items()}
    assert leaks == {where: [] for where in places}
