"""Conversations from anywhere: any data-set name, files, directories, the training store, Kafka; bad input."""

from __future__ import annotations

import asyncio
import gzip
import json
from pathlib import Path
from typing import Any

import pytest

from adapters.cli import main
from adapters.data.prepare import prepare_dataset
from adapters.data.sources import discover, open_source, source_limits
from adapters.errors import DataError
from sidecar.tools.demo.mock_cluster import MockKafkaCluster
from sidecar.tools.demo.replay import conversation_events, encode
from tests.adapters.conftest import synthetic_conversation
from tests.integration.kafka_support import produce_raw


def _write(path: Path, records: list[Any], *, gz: bool = False) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    data = "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records).encode()
    path.write_bytes(gzip.compress(data) if gz else data)
    return path


def _convs(n: int, prefix: str = "a") -> list[dict[str, Any]]:
    return [{**synthetic_conversation(i, 2 + i % 3), "conversation_id": f"{prefix}/{i}"} for i in range(n)]


def test_any_name_under_a_datasets_dir_and_any_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ddir = tmp_path / "datasets"
    _write(ddir / "myagent" / "part-1.jsonl.gz", _convs(30), gz=True)
    _write(ddir / "support-bot.jsonl", _convs(20, "b"))
    assert discover(ddir) == ["myagent", "support-bot"]
    assert main(["prepare", "--datasets-dir", str(ddir), "--datasets", "myagent", "--out", str(tmp_path / "p")]) == 0
    assert json.loads(capsys.readouterr().out)["datasets"][0]["dataset"] == "myagent"
    plain = _write(tmp_path / "elsewhere" / "traffic.jsonl", _convs(12, "c"))
    assert (
        main(["prepare", "--datasets", f"mine={plain},{ddir / 'support-bot.jsonl'}", "--out", str(tmp_path / "q")]) == 0
    )
    out = json.loads(capsys.readouterr().out)
    assert [d["dataset"] for d in out["datasets"]] == ["mine", "support-bot"]
    assert (tmp_path / "q" / "mine" / "train.jsonl").exists()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--datasets", "nope"], "no conversations at 'nope'"),
        (["--datasets", "bad name=empty"], "invalid name"),
        (["--datasets", "empty"], "no usable conversation"),
        (["--datasets", "users-missing"], "1 without a user message"),
        (["--datasets", "garbage"], "3 malformed"),
        (["--datasets", "notgzip"], "not a readable gzip"),
    ],
)
def test_prepare_explains_unusable_input(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    ddir = tmp_path / "d"
    _write(ddir / "empty.jsonl", [])
    _write(ddir / "users-missing.jsonl", [{"conversation_id": "x", "turns": [{"role": "assistant", "content": "hi"}]}])
    _write(ddir / "garbage.jsonl", ["{oops", "[1]", '{"conversation_id": "y", "turns": "no"}'])
    (ddir / "notgzip.jsonl.gz").write_bytes(b"this is not gzip at all")
    with pytest.raises(SystemExit) as exc:
        main(["prepare", "--datasets-dir", str(ddir), "--out", str(tmp_path / "o"), *argv])
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_a_source_over_its_byte_bound_is_an_error_not_a_silent_cut(tmp_path: Path) -> None:
    path = _write(tmp_path / "big.jsonl.gz", _convs(50), gz=True)  # small compressed, larger inflated
    source = open_source(str(path), limits=source_limits(2000))
    with pytest.raises(DataError, match="more than 2000 bytes"):
        list(source.conversations())
    capped = open_source(str(path), limits=source_limits(10**9, max_records=7))
    assert len(list(capped.conversations())) == 7


def test_a_line_without_end_is_skipped_without_holding_it(tmp_path: Path) -> None:
    path = tmp_path / "huge.jsonl"
    with path.open("wb") as fh:
        fh.write(json.dumps(_convs(1)[0]).encode() + b"\n")
        fh.write(b'{"conversation_id": "' + b"z" * (9 * 1024 * 1024))  # 9 MiB, no newline
    source = open_source(str(path))
    assert [c.conversation_id for c in source.conversations()] == ["a/0"]
    assert source.stats.skipped == {"oversized_line": 1}


def test_training_store_root_needs_an_agent(tmp_path: Path) -> None:
    _write(tmp_path / "store" / "shop" / "0001-w-1.jsonl", _convs(3))
    _write(tmp_path / "store" / "desk" / "0001-w-1.jsonl", _convs(2, "d"))
    with pytest.raises(DataError, match="one directory per agent"):
        open_source(str(tmp_path / "store"))
    source = open_source(str(tmp_path / "store"), agent="desk")
    assert source.name == "desk" and len(list(source.conversations())) == 2


def test_prepare_dataset_counts_conversations_without_users(tmp_path: Path) -> None:
    recs = [*_convs(10), {"conversation_id": "nouser", "turns": [{"role": "system", "content": "x"}]}]
    stats = prepare_dataset(
        _write(tmp_path / "toy" / "dev.jsonl", recs), tmp_path / "out", seed=0, max_train=None, max_test=None
    )
    assert stats["without_user_message"] == 1 and stats["dataset"] == "toy"


async def test_kafka_topic_of_contract_v1_events(tmp_path: Path) -> None:
    recs = _convs(4)
    events = [
        *conversation_events(recs[0], agent="shop"),
        *conversation_events(recs[1], agent="shop"),
        *conversation_events(recs[2], agent="desk"),
        *conversation_events(recs[3], agent="shop", end=False),
    ]
    with MockKafkaCluster(1) as kafka:
        await produce_raw(kafka.bootstrap_servers, "ev", [*(encode(e) for e in events), (b"k", b"{bad json")])
        source = open_source(f"kafka://{kafka.bootstrap_servers}/ev", agent="shop")
        convs = await asyncio.to_thread(lambda: list(source.conversations()))
        missing = open_source(f"kafka://{kafka.bootstrap_servers}/no-such-topic", agent="shop")
        with pytest.raises(DataError, match="not found"):
            await asyncio.to_thread(lambda: list(missing.conversations()))
    assert sorted(c.conversation_id for c in convs) == ["a/0", "a/1"]
    by_id = {c.conversation_id: c for c in convs}  # the topic's partitions interleave them in any order
    assert by_id["a/0"].messages[0].content == recs[0]["turns"][0]["content"]
    assert by_id["a/1"].messages[0].content == recs[1]["turns"][0]["content"]
    described = source.describe()
    assert described["malformed"] == 1
    assert described["conversations_skipped"] == {"not_ended": 1, "other_agent": 1}
    with pytest.raises(DataError, match="sidecar-config"):
        open_source("kafka:", agent="shop")
