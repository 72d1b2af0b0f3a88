"""The committed demo sample is exactly what the maintenance script builds from the shared data."""

from __future__ import annotations

import gzip
import json
from importlib import resources
from pathlib import Path

from tests.tools.build_demo_sample import OUT_DIR, SOURCES, STOP_TOKEN, build


def test_committed_sample_and_attribution_are_reproducible(corpora: Path) -> None:
    data, attribution = build(corpora)
    assert (OUT_DIR / "sample.jsonl.gz").read_bytes() == data
    assert (OUT_DIR / "ATTRIBUTION.md").read_text(encoding="utf-8") == attribution
    # The same bytes are what the installed package ships.
    assert resources.files("sidecar.tools.demo").joinpath("data/sample.jsonl.gz").read_bytes() == data


def test_sample_content_is_small_clean_and_attributed(corpora: Path) -> None:
    data, attribution = build(corpora)
    assert len(data) < 1_000_000
    records = [json.loads(line) for line in gzip.decompress(data).decode("utf-8").splitlines()]
    assert len(records) == sum(s.count for s in SOURCES)
    assert len({r["conversation_id"] for r in records}) == len(records)
    for rec in records:
        assert set(rec) == {"conversation_id", "source", "domain", "turns", "meta"}
        assert all(STOP_TOKEN not in t["content"] for t in rec["turns"])
        assert set(rec["meta"]) <= {"completion_level", "completed", "user_reported_task_success", "reward", "success"}
    for needle in ("RasaHQ/STAR", "thu-coai/ConvLab-2", "sierra-research/tau-bench", "Commit: `", "MIT", "Apache-2.0"):
        assert needle in attribution
