"""Who judged: every verdict names its evaluator and version, base model, adapter and its version,
rule and threshold, in the hook's events, the results topic, OTLP attributes, Langfuse score and
Phoenix annotation metadata; results records written before provenance existed still read back."""

from __future__ import annotations

import inspect
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import msgspec
import pytest
from prometheus_client import CollectorRegistry

from sidecar.contract import (
    CompletionScored,
    HookKind,
    HookResult,
    Outcome,
    Provenance,
    Scored,
    TreeScored,
    TurnContext,
    events_of,
    provenance_of,
)
from sidecar.evaluations.langfuse import score_body
from sidecar.evaluations.otlp import log_record
from sidecar.evaluations.phoenix import annotation
from sidecar.evaluations.results import evaluation_results
from sidecar.provenance import EVALUATOR_NAME, evaluator_version
from sidecar.scoring.config import ScoringConfig
from sidecar.scoring.hooks import ScoringHooks
from sidecar.source.journal_entry import JournalSigner, read_entry
from sidecar.source.processor import PartitionProcessor
from sidecar.state.config import StateConfig
from sidecar.state.hooks import RecordingHooks
from sidecar.telemetry.stream_metrics import StreamMetrics
from sidecar.transcript.model import Message
from tests.evaluations.effects import completion, effect, tree
from tests.scoring.conversations import RESTAURANT
from tests.scoring.fakes import ToyLM
from tests.stream.fakes import FakeJournal, event, record
from tests.support.tiny_model import build_tokenizer

PROVENANCE = Provenance(
    evaluator=EVALUATOR_NAME,
    evaluator_version="9.9.9",
    base_model="gemma-3-270m",
    adapter="completion-booking",
    adapter_version="route-7",
    rule="threshold",
    threshold=0.35,
)


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("tok")
    build_tokenizer(d)
    return d


async def _run(result: HookResult) -> Outcome:
    return await result if inspect.isawaitable(result) else result


def _hooks(tok_dir: Path, booking: dict[str, Any]) -> ScoringHooks:
    cfg = ScoringConfig(
        enabled=True,
        tokenizer={"model_dir": str(tok_dir)},
        agents={"booking": booking},
        tree={"alpha": 0.1, "max_depth_tokens": 6},
    )
    return ScoringHooks.from_config(cfg, CollectorRegistry(), client=ToyLM(vocab=512, seed=1, peak=1.5))


def _ctx(kind: HookKind, messages: list[Message], agent: str | None = "booking") -> TurnContext:
    return TurnContext(kind, "c1", 2, messages, agent, None)


async def test_completion_verdicts_name_base_adapter_version_rule_and_threshold(tok_dir: Path, tmp_path: Path) -> None:
    manifest = tmp_path / "manifest.json"
    manifest.write_text(json.dumps({"kind": "adapter", "created_utc": "2026-01-02T03:04:05Z"}))
    hooks = _hooks(
        tok_dir,
        {
            "adapter": "completion-booking",
            "completion_rule": "threshold",
            "p_end_threshold": 0.25,
            "adapter_manifest": str(manifest),
        },
    )
    out = await _run(hooks.on_turn_closed(_ctx("turn_closed", RESTAURANT)))
    p = provenance_of(events_of(out))
    assert p == Provenance(
        evaluator="llm-agent-sidecar",
        evaluator_version=evaluator_version(),
        base_model="base",
        adapter="completion-booking",
        adapter_version="2026-01-02T03:04:05Z",
        rule="threshold",
        threshold=0.25,
    )
    assert evaluator_version() not in {"", "unknown"}  # the installed package's own version


async def test_greedy_instruct_and_tree_verdicts(tok_dir: Path) -> None:
    hooks = _hooks(tok_dir, {"adapter": "completion-booking"})
    greedy = provenance_of(events_of(await _run(hooks.on_turn_closed(_ctx("turn_closed", RESTAURANT)))))
    assert greedy is not None
    assert (greedy.adapter, greedy.adapter_version, greedy.rule, greedy.threshold) == (
        "completion-booking",
        None,  # no manifest and no live route: nothing says which build it is
        "greedy",
        None,
    )
    instruct = provenance_of(events_of(await _run(hooks.on_turn_closed(_ctx("turn_closed", RESTAURANT, "other")))))
    assert instruct is not None and (instruct.adapter, instruct.rule, instruct.base_model) == (None, "greedy", "base")
    tree_out = await _run(hooks.on_user_message(_ctx("user_message", RESTAURANT[:1])))
    scored = next(e for e in events_of(tree_out) if isinstance(e, TreeScored))
    assert scored.provenance is not None
    assert (scored.provenance.rule, scored.provenance.threshold, scored.provenance.adapter) == (
        "response_tree",
        0.1,
        None,
    )


def _attrs(rec: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kv in rec.attributes:
        v = kv.value
        out[kv.key] = getattr(v, v.WhichOneof("value"))
    return out


def test_otlp_langfuse_and_phoenix_carry_who_judged() -> None:
    judged = effect("turn_closed", (replace(completion(), provenance=PROVENANCE),))
    result = evaluation_results(judged)[0]
    attrs = _attrs(log_record(result, 1.0))
    assert attrs["gen_ai.evaluation.evaluator.id"] == "llm-agent-sidecar"
    assert attrs["gen_ai.evaluation.evaluator.version"] == evaluator_version()
    assert attrs["sidecar.base_model"] == "gemma-3-270m"
    assert attrs["sidecar.adapter"] == "completion-booking"
    assert attrs["sidecar.adapter.version"] == "route-7"
    assert attrs["sidecar.rule"] == "threshold"
    assert attrs["sidecar.threshold"] == 0.35
    expected = {
        "evaluator": "llm-agent-sidecar",
        "evaluator_version": "9.9.9",
        "base_model": "gemma-3-270m",
        "adapter": "completion-booking",
        "adapter_version": "route-7",
        "rule": "threshold",
        "threshold": 0.35,
    }
    assert score_body(result)["metadata"].items() >= expected.items()
    assert annotation(result)["metadata"].items() >= expected.items()
    # A verdict without provenance (a goal) still names its evaluator; nothing else is made up.
    bare = evaluation_results(effect("user_message", (tree(),)))[0]
    bare_attrs = _attrs(log_record(bare, 1.0))
    assert bare_attrs["gen_ai.evaluation.evaluator.id"] == "llm-agent-sidecar"
    assert not any(k.startswith(("sidecar.rule", "sidecar.adapter", "sidecar.base_model")) for k in bare_attrs)
    assert set(annotation(bare)["metadata"]) == {"turn", "hook", "evaluator", "evaluator_version"}


class _Judging(RecordingHooks):
    def on_turn_closed(self, ctx: TurnContext) -> HookResult:
        super().on_turn_closed(ctx)
        verdict = CompletionScored(0.7, True, "adapter", "completion-booking", provenance=PROVENANCE)
        return Scored({"complete": True}, [verdict])


async def test_results_topic_records_carry_provenance() -> None:
    journal = FakeJournal()
    proc = PartitionProcessor(
        partition=0,
        state_config=StateConfig(),
        hooks=_Judging(),
        results=journal,
        dead_letters=journal,
        metrics=StreamMetrics(CollectorRegistry()),
        recovery=journal.recovery(None),
        max_record_bytes=10_000,
        max_pending=8,
    )
    for i, (role, end) in enumerate([("user", False), ("assistant", False), (None, True)]):
        await proc.process(record(i, event("c", i, role, end=end)), 0.0)
    await proc.drain(5)
    closed = next(r for r in journal.results if r["kind"] == "turn_closed")
    assert closed["provenance"] == PROVENANCE.as_dict()
    assert all("provenance" not in r for r in journal.results if r["kind"] != "turn_closed")


OLD_RECORD = (
    b'{"v":1,"partition":0,"position":1,"trigger":"record","kind":"turn_closed","conversation_id":"c","turn":1,'
    b'"close_reason":null,"end_reason":null,"agent":null,"tenant":null,"messages":2,"outcome":{},"group":"g",'
    b'"topic":"t"}'
)


def test_records_without_provenance_still_read_back_and_new_ones_round_trip() -> None:
    entry, why = read_entry(OLD_RECORD, JournalSigner([]))
    assert why is None and entry is not None and entry.provenance is msgspec.UNSET
    assert msgspec.json.encode(entry) == OLD_RECORD  # absent stays absent: the wire format is unchanged
    with_p = json.loads(OLD_RECORD)
    with_p["provenance"] = PROVENANCE.as_dict()
    back, why = read_entry(json.dumps(with_p).encode(), JournalSigner([]))
    assert why is None and back is not None and not isinstance(back.provenance, msgspec.UnsetType)
    assert msgspec.structs.asdict(back.provenance) == PROVENANCE.as_dict()
    for bad in ({**PROVENANCE.as_dict(), "rule": "x" * 10_000}, {**PROVENANCE.as_dict(), "threshold": "high"}, [1]):
        hostile = {**with_p, "provenance": bad}
        assert read_entry(json.dumps(hostile).encode(), JournalSigner([])) == (None, "invalid")
