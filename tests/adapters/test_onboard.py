"""``adapters onboard`` on the suite's tiny model: steps, resumption, report, routing, bad input."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

from adapters.cli import main
from adapters.errors import ServeError
from adapters.serving.serving import load_adapter, write_routing
from sidecar.config import load_config
from tests.adapters.conftest import synthetic_conversation
from tests.support.tiny_model import TinyModel

pytestmark = pytest.mark.filterwarnings("ignore:.*is_gradient_checkpointing.*:FutureWarning")


def _traffic(path: Path, n: int, **override: Any) -> Path:
    with path.open("w") as fh:
        for i in range(n):
            fh.write(json.dumps({**synthetic_conversation(i, 2 + i % 4), **override}) + "\n")
    return path


def _onboard(tiny: TinyModel, source: Path, out: Path, *extra: str) -> list[str]:
    return [
        "onboard",
        "--agent",
        "fresh-agent",
        "--source",
        str(source),
        "--out",
        str(out),
        "--base",
        str(tiny.model_dir),
        "--max-context-tokens",
        "256",
        "--lr",
        "3e-3",
        "--min-steps",
        "60",
        "--batch-size",
        "8",
        *extra,
    ]


def _out(capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    result: dict[str, Any] = json.loads(capsys.readouterr().out)
    return result


def test_onboard_trains_validates_exports_routes_and_resumes(
    tiny_model: TinyModel, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = _traffic(tmp_path / "traffic.jsonl", 60)
    config = tmp_path / "sidecar.yaml"
    config.write_text(yaml.safe_dump({"scoring": {"agents": {"fresh-agent": {"tree_sample_rate": 0.5}}}}))
    argv = _onboard(tiny_model, source, tmp_path / "ob", "--config", str(config))
    assert main(argv) == 0
    result = _out(capsys)
    assert result["serve"] == "not_requested" and "--lora-modules" in result["restart_command"]
    adapter = Path(result["adapter_dir"])
    manifest = json.loads((adapter / "manifest.json").read_text())
    assert manifest["served_name"] == result["served_name"]
    assert manifest["validation"]["f1_complete"] == result["validation_f1"]
    assert result["served_name"].startswith("fresh-agent-")
    report = json.loads((tmp_path / "ob" / "report.json").read_text())
    assert report["split"] == {"train": 48, "holdback": 12, "general": 0, "datasets": ["fresh-agent"]}
    assert report["validation"]["after"]["examples"] == 24  # every held-back conversation whole and truncated
    assert report["validation"]["after"]["greedy"]["roc_auc"] > report["validation"]["before"]["greedy"]["roc_auc"]
    for name in ("report.md", "pend.png", "routing.yaml", "manifest.json"):
        assert (tmp_path / "ob" / name).stat().st_size > 0
    train = report["train"]
    assert train["micro_batch_size"] == 8 and train["gradient_accumulation_steps"] == 1
    assert train["tokens"] > 0 and train["tokens_per_second"] > 0
    assert train["memory"]["kind"] == "cpu" and train["memory"]["peak_rss_gib"] > 0
    assert "tokens/s; on CPU, peak resident memory" in (tmp_path / "ob" / "report.md").read_text()
    patched = yaml.safe_load(config.read_text())["scoring"]
    agent = patched["agents"]["fresh-agent"]
    assert agent["adapter"] == result["served_name"] and agent["tree_sample_rate"] == 0.5
    assert agent["completion_rule"] == result["rule"] and agent["validation_f1"] == result["validation_f1"]
    assert (patched["max_prompt_tokens"], patched["prompt_truncation"]) == (256, "tail")
    assert (tmp_path / "sidecar.yaml.bak").exists()
    load_config(config)

    # Rerun: every step is done already.
    assert main(argv) == 0
    assert _out(capsys)["served_name"] == result["served_name"]
    timings = json.loads((tmp_path / "ob" / "manifest.json").read_text())["steps"]
    assert all(t["skipped"] for t in timings.values()), timings
    # A changed floor re-validates, without reading or training again.
    assert main([*argv, "--min-validation-f1", "0.99"]) == 0
    assert _out(capsys)["trusted"] is (result["validation_f1"] >= 0.99)
    timings = json.loads((tmp_path / "ob" / "manifest.json").read_text())["steps"]
    assert timings["train"]["skipped"] and not timings["validate"]["skipped"]
    # A smaller micro-batch computes the same update: the training done stands.
    assert main([*argv, "--micro-batch-size", "2"]) == 0
    assert _out(capsys)["served_name"] == result["served_name"]
    timings = json.loads((tmp_path / "ob" / "manifest.json").read_text())["steps"]
    assert timings["train"]["skipped"]


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("tiny", "too few conversations for agent 'fresh-agent': 15 usable"),
        ("no-users", "no usable conversation"),
        ("empty", "no usable conversation"),
        ("missing", "no conversations at"),
        ("single-turn", "at least two turns"),
    ],
)
def test_onboard_explains_unusable_data(
    tiny_model: TinyModel, tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str, message: str
) -> None:
    path = tmp_path / "data.jsonl"
    if case == "tiny":
        _traffic(path, 15)
    elif case == "no-users":
        _traffic(path, 30, turns=[{"role": "assistant", "content": "hello?"}])
    elif case == "empty":
        path.write_text("\n\n")
    elif case == "single-turn":
        _traffic(path, 30, turns=[{"role": "user", "content": "hi"}, {"role": "assistant", "content": "bye"}])
    with pytest.raises(SystemExit) as exc:
        main(_onboard(tiny_model, path, tmp_path / "ob"))
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    "bad",
    [
        ["--agent", "../etc"],
        ["--holdback-fraction", "1.5"],
        ["--min-validation-f1", "2"],
        ["--rule", "sometimes"],
        ["--objective", "luck"],
        ["--max-conversations", "0"],
    ],
)
def test_onboard_rejects_bad_arguments(tmp_path: Path, bad: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["onboard", "--agent", "a", "--source", "x.jsonl", "--out", str(tmp_path), *bad]
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    capsys.readouterr()


def test_onboard_names_a_missing_base(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["onboard", "--agent", "a", "--source", "x.jsonl", "--out", str(tmp_path), "--base", str(tmp_path / "no")])
    assert "no base model at" in capsys.readouterr().err


VALIDATION = {"rule": "threshold", "p_end_threshold": 0.0123456789, "validation_f1": 0.91}
RECIPE = {"max_context_tokens": 256, "max_message_tokens": 128}


def test_routing_refuses_a_config_with_another_prompt_window(tmp_path: Path) -> None:
    from adapters.serving.serving import routing

    config = tmp_path / "c.yaml"
    config.write_text("scoring:\n  max_prompt_tokens: 512\n")
    with pytest.raises(ServeError, match="max_prompt_tokens=512"):
        write_routing(tmp_path, routing("shop", "shop-1", VALIDATION, RECIPE), config)
    assert config.read_text() == "scoring:\n  max_prompt_tokens: 512\n"
    config.write_text("- not a mapping\n")
    with pytest.raises(ServeError, match="mapping"):
        write_routing(tmp_path, routing("shop", "shop-1", VALIDATION, RECIPE), config)
    fresh = tmp_path / "new.yaml"
    write_routing(tmp_path, routing("shop", "shop-1", VALIDATION, RECIPE), fresh)
    agent = load_config(fresh).scoring.agents["shop"]
    assert (agent.completion_rule, agent.p_end_threshold, agent.validation_f1) == ("threshold", 0.0123457, 0.91)
    greedy = {**VALIDATION, "rule": "greedy"}
    write_routing(tmp_path, routing("shop", "shop-2", greedy, RECIPE), fresh)
    agent = load_config(fresh).scoring.agents["shop"]
    assert (agent.adapter, agent.completion_rule, agent.p_end_threshold) == ("shop-2", "greedy", None)


def test_routing_of_a_stride_trained_adapter_serves_stride_windows(tmp_path: Path) -> None:
    from adapters.serving.serving import routing

    fresh = tmp_path / "new.yaml"
    write_routing(tmp_path, routing("shop", "shop-1", VALIDATION, {**RECIPE, "window_stride": 64}), fresh)
    scoring = load_config(fresh).scoring
    assert (scoring.prompt_truncation, scoring.prompt_stride_tokens, scoring.max_prompt_tokens) == ("stride", 64, 256)
    # A tail-trained adapter cannot join a sidecar that serves stride windows, nor the other way round.
    with pytest.raises(ServeError, match="prompt_truncation='stride'"):
        write_routing(tmp_path, routing("bank", "bank-1", VALIDATION, RECIPE), fresh)
    with pytest.raises(ServeError, match="prompt_stride_tokens=64"):
        write_routing(tmp_path, routing("bank", "bank-1", VALIDATION, {**RECIPE, "window_stride": 32}), fresh)


class _NoRuntimeLoading(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        self.send_response(404)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        return None


@pytest.fixture
def stub_server() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _NoRuntimeLoading)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        server.shutdown()
        server.server_close()


def test_serving_without_runtime_loading_or_without_a_server(stub_server: str, tmp_path: Path) -> None:
    assert load_adapter(stub_server, "a-1", tmp_path) == "runtime_loading_disabled"
    with pytest.raises(ServeError, match="cannot reach vLLM"):
        load_adapter("http://127.0.0.1:9", "a-1", tmp_path, timeout_seconds=2)


def test_general_conversations_are_mixed_in_by_ratio(tmp_path: Path) -> None:
    from adapters.onboarding.onboard import MIX_NAME, OnboardSpec, collect, split

    source = _traffic(tmp_path / "traffic.jsonl", 40)
    spec = OnboardSpec(agent="a", sources=(str(source),), out=tmp_path, mix=("demo-sample",), mix_ratio=0.5)
    collect(spec, spec.sources, cap=spec.max_conversations, dest=tmp_path / "data" / "conversations.jsonl")
    result = split(spec, tmp_path / "data")
    assert (result["train"], result["holdback"], result["general"]) == (30, 10, 15)
    assert result["datasets"] == ["a", MIX_NAME]
    general = (tmp_path / "data" / "prepared" / MIX_NAME / "train.jsonl").read_text().splitlines()
    assert len(general) == 15 and all("target_start" in json.loads(x) for x in general)
    held = {json.loads(x)["conversation_id"] for x in (tmp_path / "data" / "holdback.jsonl").read_text().splitlines()}
    trained = {
        json.loads(x)["conversation_id"]
        for x in (tmp_path / "data" / "prepared" / "a" / "train.jsonl").read_text().splitlines()
    }
    assert not held & trained and len(held | trained) == 40


def test_collect_keeps_the_last_copy_of_a_repeated_conversation(tmp_path: Path) -> None:
    from adapters.onboarding.onboard import OnboardSpec, collect

    first = _traffic(tmp_path / "a.jsonl", 5)
    again = _traffic(tmp_path / "b.jsonl", 3)  # the same ids, as a training store writes after a crash
    spec = OnboardSpec(agent="a", sources=(str(first), str(again)), out=tmp_path)
    result = collect(spec, spec.sources, cap=4, dest=tmp_path / "c.jsonl")
    assert (result["conversations"], result["duplicates_dropped"], result["dropped_over_cap"]) == (4, 3, 1)
    ids = [json.loads(x)["conversation_id"] for x in (tmp_path / "c.jsonl").read_text().splitlines()]
    assert ids == ["toy/4", "toy/0", "toy/1", "toy/2"]  # newest last; the re-sent ones moved to the end
