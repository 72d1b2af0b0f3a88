"""The judge against the real vLLM CPU server, whose tiny random model answers nonsense.

What must hold: no crash; every answer is either valid JSON of its schema or malformed, counted and
replaced by the safe default; endpoint refusals (a prompt over the context) are outcomes; the cost
counted is the server's own token count.
"""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from sidecar.judge.config import JudgeConfig
from sidecar.judge.judge import TwoDimensionalJudge
from sidecar.judge.metrics import JudgeMetrics
from sidecar.tools.demo.replay import load_sample
from sidecar.transcript.model import Message
from tests.support.vllm_server import VllmServer

REPO = Path(__file__).resolve().parents[2]


def config(server: VllmServer, **over: Any) -> JudgeConfig:
    llm = {"base_url": server.base_url, "model": server.base_model, "max_tokens": 32, "request_timeout_seconds": 120,
           "max_concurrency": 4, **over.pop("llm", {})}  # fmt: skip
    return JudgeConfig(llm=llm, max_transcript_chars=1500, max_message_chars=300, **over)


def messages(record: dict[str, Any]) -> list[Message]:
    return [Message(t["role"], t["content"]) for t in record["turns"] if not t.get("tool_calls")]


def tokenize_count(server: VllmServer, chat: list[dict[str, str]]) -> int:
    body = json.dumps({"model": server.base_model, "messages": chat, "add_generation_prompt": True}).encode()
    req = urllib.request.Request(server.root_url + "/tokenize", data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as resp:
        return int(json.loads(resp.read())["count"])


def value(registry: CollectorRegistry, name: str, **labels: str) -> float:
    return registry.get_sample_value(name, labels) or 0.0


@pytest.mark.parametrize("structured", ["json_schema", "vllm_structured_outputs", "none"])
async def test_nonsense_answers_are_counted_never_fatal(vllm_server: VllmServer, structured: str) -> None:
    registry = CollectorRegistry()
    judge = TwoDimensionalJudge(config(vllm_server, llm={"structured_output": structured}), JudgeMetrics(registry))
    convs = [messages(r) for r in load_sample()[:4]]
    try:
        verdicts = [await judge.judge(c) for c in convs]
    finally:
        await judge.aclose()
    answers = [d for v in verdicts for d in (v.accuracy, v.completeness)]
    assert len(answers) == 8 and all(d.calls == 1 and d.error is None for d in answers)
    assert all(d.valid != d.malformed for d in answers)  # each answer: parsed, or malformed
    dims = ("accuracy", "completeness")
    malformed = {dim: sum(1 for d in answers if d.dimension == dim and d.malformed) for dim in dims}
    for dim, n in malformed.items():
        assert value(registry, "sidecar_judge_invalid_answers_total", dimension=dim) == n
        assert value(registry, "sidecar_judge_calls_total", dimension=dim) == 4
    assert sum(malformed.values()) >= 1  # a random model does not write the schema's JSON by chance
    assert all(not v.complete for v in verdicts if not v.decided)  # the safe default
    assert sum(value(registry, "sidecar_judge_conversations_total", verdict=k)
               for k in ("complete", "incomplete", "undecided")) == 4  # fmt: skip


async def test_cost_accounting_is_the_servers_token_count(vllm_server: VllmServer) -> None:
    registry = CollectorRegistry()
    judge = TwoDimensionalJudge(config(vllm_server), JudgeMetrics(registry))
    conv = messages(load_sample()[5])
    try:
        v = await judge.judge(conv)
    finally:
        await judge.aclose()
    for d in (v.accuracy, v.completeness):
        expected = tokenize_count(vllm_server, judge.prompt(d.dimension, conv))
        assert d.prompt_tokens == expected > 0
        assert 0 < d.completion_tokens <= 32
        assert value(registry, "sidecar_judge_prompt_tokens_total", dimension=d.dimension) == expected
    assert v.prompt_tokens == v.accuracy.prompt_tokens + v.completeness.prompt_tokens


async def test_a_prompt_over_the_context_is_an_error_outcome(vllm_server: VllmServer) -> None:
    registry = CollectorRegistry()
    cfg = config(vllm_server).model_copy(update={"max_transcript_chars": 200_000, "max_message_chars": 50_000})
    judge = TwoDimensionalJudge(cfg, JudgeMetrics(registry))
    try:
        v = await judge.judge([Message("user", "word " * 6000), Message("assistant", "ok " * 3000)])
    finally:
        await judge.aclose()
    assert v.accuracy.error == "prompt_too_long" and v.completeness.error == "prompt_too_long"
    assert v.label == "undecided" and not v.complete
    assert value(registry, "sidecar_judge_errors_total", dimension="accuracy", kind="permanent") == 1
    assert value(registry, "sidecar_judge_conversations_total", verdict="error") == 1


def test_judge_command_writes_results_summary_and_comparison(vllm_server: VllmServer, tmp_path: Path) -> None:
    from sidecar.cli import main

    report = REPO / "adapters" / "reports" / "report.json"
    data = tmp_path / "convs.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in load_sample()[:3]))
    out, summary, md = tmp_path / "out.jsonl", tmp_path / "summary.json", tmp_path / "table.md"
    rc = main(["judge", str(data), "--base-url", vllm_server.base_url, "--model", vllm_server.base_model,
               "--max-tokens", "24", "--max-transcript-chars", "1500", "--max-message-chars", "300",
               "--protocol", "truncation", "--output", str(out), "--summary", str(summary), "--markdown", str(md),
               "--compare", str(report), "--compare-section", "star"])  # fmt: skip
    assert rc == 0
    doc = json.loads(summary.read_text())
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert doc["judged"] == len(rows) == 6  # 3 conversations, each full and truncated
    assert doc["calls"] == 12 and doc["per_conversation"]["calls"] == 2.0
    assert doc["prompt_tokens"] == sum(r["prompt_tokens"] for r in rows) > 0
    assert sum(doc["malformed"].values()) + sum(doc["errors"].values()) >= 1
    assert {r["kind"] for r in rows} == {"full", "truncated"}
    assert all(r["calls"] == 2 and r["prompt_tokens"] > 0 for r in rows)
    assert doc["classification"]["n"] == 6 and not doc["classification"]["judge_free"]
    table = md.read_text()
    assert "LoRA adapter + end tag (judge-free)" in table and "two-dimensional judge (base)" in table
    assert doc["comparison"][-1]["method"] == "two-dimensional judge (base)"
