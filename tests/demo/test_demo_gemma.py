"""``sidecar demo --model gemma3-270m``: the demo scores on a real pretrained base (Gemma 3 270M).

The real command in its own process, on one short conversation: it
starts the mock cluster and a vLLM CPU server on the imported base (the suite's cached build, see
tests/support/gemma.py), scores completion with the instruct prompt and builds response trees, and
stops cleanly on Ctrl-C. The figures it prints (leaves per tree, generated tokens) are for the record.
"""

from __future__ import annotations

import gzip
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from sidecar.tools.ports import free_port
from tests.integration.kafka_support import http_get
from tests.support.gemma import GemmaBase

pytestmark = pytest.mark.slow

LIMIT_SECONDS = 420


def _short_conversations(path: Path) -> int:
    """One short conversation (bounded CI time: Gemma prefills and generates slowly on two cores)."""
    rec = {
        "conversation_id": "gemma-demo-1",
        "turns": [
            {"role": "user", "content": "Can you book a table for two at an Italian place tonight?"},
            {"role": "assistant", "content": "Sure. What time would you like, and which part of town?"},
        ],
    }
    with gzip.open(path, "wt", encoding="utf-8") as fh:
        fh.write(json.dumps(rec) + "\n")
    return len(rec["turns"]) + 1


def _samples(port: int) -> dict[str, float]:
    _, text = http_get(f"http://127.0.0.1:{port}/metrics")
    totals: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            key = s.name + "".join(f"|{k}={v}" for k, v in sorted(s.labels.items()) if k in ("variant", "model"))
            totals[key] = totals.get(key, 0.0) + float(s.value)
    return totals


def test_the_demo_scores_on_gemma(gemma_base: GemmaBase, tmp_path: Path) -> None:
    data = tmp_path / "short.jsonl.gz"
    _short_conversations(data)
    port = free_port()
    env = {**os.environ, "SIDECAR_GEMMA_CACHE": str(gemma_base.root)}
    argv = [sys.executable, "-m", "sidecar", "demo", "--model", "gemma3-270m", "--input", str(data)]
    argv += ["--http-port", str(port), "--goals", "off", "--rate", "20", "--concurrency", "1"]
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen: dict[str, float] = {}
    try:
        deadline = time.monotonic() + LIMIT_SECONDS
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                seen = _samples(port)
            except OSError:
                seen = {}
            if seen.get("sidecar_conversations_ended_total", 0) >= 1 and seen.get("sidecar_tree_leaves_count", 0) >= 1:
                break
            time.sleep(2)
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, out[-3000:]
    assert seen.get("sidecar_conversations_ended_total", 0) >= 1, (seen, out[-3000:])
    trees = seen["sidecar_tree_leaves_count"]
    assert trees >= 1
    assert seen.get("sidecar_vllm_generated_tokens_total|model=base", 0) > 0
    assert seen.get("sidecar_scoring_errors_total", 0) == 0, out[-3000:]
    print(
        f"gemma demo: trees={trees:g} mean_leaves={seen['sidecar_tree_leaves_sum'] / trees:.2f} "
        f"generated_tokens={seen['sidecar_vllm_generated_tokens_total|model=base']:g}"
    )
