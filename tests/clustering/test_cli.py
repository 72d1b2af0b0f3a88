"""``sidecar clusters`` end to end, with the real local embedding model (LLM-free mode)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from sidecar.cli import main
from sidecar.clustering.embed import SentenceTransformerEmbedder
from sidecar.tools.clustering.offline import ReadStats, iter_conversations
from sidecar.transcript.dataset import MAX_LINE_BYTES

TOPICS = {
    "flights": ["I need to book a flight to {c}", "Find me a plane ticket to {c} next week"],
    "restaurants": ["Reserve a table for dinner in {c}", "Find a good restaurant in {c} tonight"],
    "weather": ["What is the weather forecast in {c}?", "Will it rain in {c} tomorrow?"],
}
CITIES = ["Paris", "Berlin", "Rome", "Madrid", "Oslo", "Vienna", "Lisbon", "Prague"]


def write_dataset(path: Path) -> None:
    lines = []
    for topic, templates in TOPICS.items():
        for i, city in enumerate(CITIES):
            turns = [
                {"role": "user", "content": templates[i % 2].format(c=city)},
                {"role": "assistant", "content": "Sure, let me check."},
                {"role": "user", "content": "Thanks."},
            ]
            lines.append(json.dumps({"conversation_id": f"{topic}/{i}", "domain": topic, "turns": turns}))
    lines += [
        "{not json",
        json.dumps({"conversation_id": 5, "turns": []}),
        json.dumps({"conversation_id": "x", "turns": [{"role": "wizard", "content": "hi"}]}),
        json.dumps({"conversation_id": "y", "turns": "nope"}),
        json.dumps([1, 2, 3]),
        "",
    ]
    with gzip.open(path, "wt", encoding="utf-8") as fh:
        fh.write("\n".join(lines) + "\n")
        fh.write(
            '{"conversation_id": "big", "turns": [{"role": "user", "content": "'
            + "a" * (MAX_LINE_BYTES + 10)
            + '"}]}\n'
        )
    with gzip.open(path, "ab") as fhb:
        fhb.write(b'{"conversation_id": "bad-utf8", "turns": [{"role": "user", "content": "\xff\xfe"}]}\n')


def test_clusters_command_with_stability_split_and_plot(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = tmp_path / "convs.jsonl.gz"
    write_dataset(data)
    out = tmp_path / "out.json"
    png = tmp_path / "fig4.png"
    rc = main(
        [
            "clusters",
            str(data),
            "--mode",
            "extractive",
            "--k1",
            "6",
            "--goal-field",
            "domain",
            "--stability",
            "--plot",
            str(png),
            "--split",
            "--output",
            str(out),
        ]
    )
    assert rc == 0
    doc = json.loads(out.read_text())
    assert doc["used"] == 24 and doc["read"] == 24
    assert doc["skipped"] == {
        "invalid_json": 1,
        "bad_conversation_id": 1,
        "not_an_object": 1,
        "bad_message": 1,
        "bad_messages": 1,
        "oversized_line": 1,
        "invalid_utf8": 1,
    }
    assert 1 <= doc["k"] <= 6
    assert sum(c["size"] for c in doc["clusters"]) == 24
    assert set(doc["assignments"]) == {f"{t}/{i}" for t in TOPICS for i in range(8)}
    assert doc["goal_ari"] > 0.5, doc  # three clearly different topics
    st = doc["stability"]
    assert -1 <= st["ari"] <= 1 and 0 < st["diagonal_fraction"] <= 1
    assert sum(map(sum, st["confusion"])) == 24
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    t4 = doc["table4"]
    assert t4["clusters_full"] == doc["k"] and t4["distance_train"] >= 0 and t4["distance_test"] >= 0
    assert doc["llm_calls"] == {}  # LLM-free: no chat request at all
    assert "k=" in capsys.readouterr().err


def test_clusters_command_usage_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["clusters", str(tmp_path / "missing.jsonl")]) == 2
    empty = tmp_path / "empty.jsonl"
    empty.write_text("{}\n[]\n")
    assert main(["clusters", str(empty)]) == 2
    assert "fewer than 2" in capsys.readouterr().err
    assert main(["clusters", str(empty), "--k1", "1"]) == 2


def test_clusters_command_reports_an_unreachable_llm(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = tmp_path / "convs.jsonl.gz"
    write_dataset(data)
    rc = main(["clusters", str(data), "--mode", "llm", "--llm-base-url", "http://127.0.0.1:9/v1"])
    assert rc == 1
    assert "unavailable" in capsys.readouterr().err


def test_reader_counts_every_bad_line(tmp_path: Path) -> None:
    data = tmp_path / "convs.jsonl.gz"
    write_dataset(data)
    stats = ReadStats()
    convs = list(iter_conversations(data, "domain", stats))
    assert len(convs) == stats.records == 24
    assert sum(stats.skipped.values()) == 7
    assert convs[0].goal == "flights"


def test_local_model_embeds_related_sentences_closer() -> None:
    emb = SentenceTransformerEmbedder()
    v = emb.embed(["book a flight to Paris", "I need a plane ticket to Rome", "will it rain tomorrow", ""])
    assert v.shape == (4, 384)
    assert float(v[0] @ v[1]) > float(v[0] @ v[2]) + 0.1
    assert emb.embed([]).shape == (0, 384)
