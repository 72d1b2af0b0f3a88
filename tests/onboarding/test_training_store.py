"""The training store: bounded, rotated JSONL per agent, written by a post-score sink, read by adapters."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry
from pydantic import ValidationError

from adapters.data.sources import open_source
from sidecar.contract import Effect, TurnContext
from sidecar.telemetry.labels import AgentLabels
from sidecar.training_store.config import TrainingStoreConfig
from sidecar.training_store.sink import TrainingStoreSink
from sidecar.training_store.store import RotatingJsonlStore, agent_dir_name
from sidecar.transcript.model import Message, ToolCall

MESSAGES = (
    Message("system", "be nice"),
    Message("user", "book a table"),
    Message("assistant", "", tool_calls=(ToolCall("book", '{"n": 2}'),)),
    Message("tool", "ok", name="book"),
    Message("assistant", "done, bye"),
)


def _ended(
    cid: str, agent: str | None = "shop", end_reason: str = "end_event", messages: tuple[Message, ...] = MESSAGES
) -> Effect:
    ctx = TurnContext("conversation_ended", cid, 1, messages, agent, "acme", end_reason=end_reason)  # type: ignore[arg-type]
    return Effect(ctx, (), {})


def _sink(tmp_path: Path, **cfg: object) -> tuple[TrainingStoreSink, CollectorRegistry]:
    registry = CollectorRegistry()
    config = TrainingStoreConfig.model_validate({"enabled": True, "directory": tmp_path / "store", **cfg})
    return TrainingStoreSink(config, registry, AgentLabels(), redacted=False), registry


async def _offer(sink: TrainingStoreSink, effect: Effect) -> None:
    wait = sink.offer(effect)
    if wait is not None:
        await wait


def test_config_requires_a_directory_and_coherent_bounds() -> None:
    with pytest.raises(ValidationError, match="directory"):
        TrainingStoreConfig(enabled=True, backend="file")
    assert TrainingStoreConfig(enabled=True).backend == "kafka"  # the fleet's topic by default
    # A config written for the file store (a directory, no backend) keeps it.
    assert TrainingStoreConfig.model_validate({"enabled": True, "directory": "/x"}).backend == "file"
    with pytest.raises(ValidationError, match="max_file_bytes"):
        TrainingStoreConfig(max_bytes_per_agent=10_000, max_file_bytes=20_000)
    with pytest.raises(ValidationError, match="agent names"):
        TrainingStoreConfig(agents=("..",))


@pytest.mark.parametrize(
    ("agent", "safe"), [("shop", True), ("a:b-c.d_e", True), ("..", False), (".hidden", False), (".", False)]
)
def test_agent_directories_never_escape_the_root(agent: str, safe: bool) -> None:
    name = agent_dir_name(agent)
    assert (name == agent) is safe
    assert "/" not in name and not name.startswith(".")


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(min_value=1, max_value=900), min_size=1, max_size=60))
def test_store_stays_within_its_bound_and_keeps_the_newest(
    tmp_path_factory: pytest.TempPathFactory, sizes: list[int]
) -> None:
    root = tmp_path_factory.mktemp("rot")
    store = RotatingJsonlStore(root, max_bytes_per_agent=4096, max_file_bytes=1024)
    for i, n in enumerate(sizes):
        store.append("a", (f"{i:05d}" + "x" * n + "\n").encode())
        on_disk = sum(p.stat().st_size for p in (root / "a").iterdir())
        assert on_disk <= 4096
        assert on_disk == store.bytes_of("a")
    store.close()
    lines = [x for p in sorted((root / "a").iterdir()) for x in p.read_text().splitlines()]
    kept = [int(x[:5]) for x in lines]
    assert kept == sorted(kept) and kept[-1] == len(sizes) - 1  # oldest dropped first, newest kept


async def test_sink_writes_finished_conversations_in_the_dataset_schema(tmp_path: Path) -> None:
    sink, registry = _sink(tmp_path)
    await sink.start()
    try:
        await _offer(sink, _ended("c1"))
        await _offer(sink, _ended("c1"))  # an effect fired again after a crash
        await _offer(sink, _ended("c2", end_reason="evicted"))  # cut by the sidecar: not a whole conversation
        await _offer(sink, _ended("c3", messages=MESSAGES[:1]))  # no user message
        await _offer(sink, _ended("c4", agent=None))
        other = Effect(TurnContext("turn_closed", "c5", 1, MESSAGES, "shop", None), (), {})
        assert sink.offer(other) is None
    finally:
        await sink.stop()

    def count(agent: str, result: str) -> float | None:
        return registry.get_sample_value(
            "sidecar_training_store_conversations_total", {"agent": agent, "result": result}
        )

    assert (
        count("shop", "written"),
        count("shop", "duplicate"),
        count("shop", "end_reason"),
        count("shop", "too_short"),
        count("default", "written"),
    ) == (1, 1, 1, 1, 1)
    source = open_source(str(tmp_path / "store"), agent="shop")
    convs = list(source.conversations())
    assert [c.conversation_id for c in convs] == ["c1"]
    assert convs[0].messages == MESSAGES
    rec = json.loads(next((tmp_path / "store" / "shop").iterdir()).read_text())
    assert rec["source"] == "shop" and rec["meta"]["end_reason"] == "end_event" and rec["meta"]["num_user_turns"] == 1
    assert sink.health().ready


async def test_sink_keeps_only_the_selected_agents_and_bounds_their_number(tmp_path: Path) -> None:
    sink, _ = _sink(tmp_path, agents=("shop",))
    await sink.start()
    assert sink.offer(_ended("x", agent="other")) is None
    await sink.stop()
    capped, registry = _sink(tmp_path / "capped", max_agents=2)
    await capped.start()
    for i, agent in enumerate(["a", "b", "c", "a"]):
        await _offer(capped, _ended(f"c{i}", agent=agent))
    await capped.stop()
    assert sorted(p.name for p in (tmp_path / "capped" / "store").iterdir()) == ["a", "b"]
    assert (
        registry.get_sample_value("sidecar_training_store_conversations_total", {"agent": "c", "result": "agent_limit"})
        == 1
    )


async def test_a_failing_disk_is_counted_and_never_stalls_the_effect(tmp_path: Path) -> None:
    sink, registry = _sink(tmp_path)
    await sink.start()
    (tmp_path / "store").mkdir()
    (tmp_path / "store" / "shop").write_text("a file where the agent's directory should be")
    await asyncio.wait_for(_offer(sink, _ended("c1")), 10)
    await sink.stop()
    assert (
        registry.get_sample_value("sidecar_training_store_conversations_total", {"agent": "shop", "result": "error"})
        == 1
    )
    health = sink.health()
    assert not health.ready and "FileExistsError" in health.detail


async def test_a_conversation_larger_than_a_file_is_refused(tmp_path: Path) -> None:
    sink, registry = _sink(tmp_path, max_file_bytes=1024, max_bytes_per_agent=4096)
    await sink.start()
    big = (Message("user", "x" * 2000), Message("assistant", "ok"))
    await _offer(sink, _ended("big", messages=big))
    await sink.stop()
    assert (
        registry.get_sample_value(
            "sidecar_training_store_conversations_total", {"agent": "shop", "result": "too_large"}
        )
        == 1
    )
