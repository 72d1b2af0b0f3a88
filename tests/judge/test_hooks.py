"""JudgeHooks: off by default, sampled, bounded by call and token budgets and pending work."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from prometheus_client import CollectorRegistry

from sidecar.contract import HookResult, TurnContext
from sidecar.judge.config import JudgeConfig
from sidecar.judge.hooks import JudgeHooks
from sidecar.state.hooks import CompositeHooks, RecordingHooks
from sidecar.transcript.model import Message
from tests.judge.fakes import FakeChatClient

MSGS = (Message("user", "Book a table."), Message("assistant", "Done, reference ABC."))


def ended(cid: str = "c1", turn: int = 1) -> TurnContext:
    return TurnContext("conversation_ended", cid, turn, MSGS, "shop", None, end_reason="end_event")


def hooks(fake: FakeChatClient | None = None, **cfg: Any) -> tuple[JudgeHooks, CollectorRegistry]:
    registry = CollectorRegistry()
    config = JudgeConfig(**{"enabled": True, "sample_rate": 1.0, **cfg})
    return JudgeHooks(config, registry, client=fake or FakeChatClient()), registry


async def resolve(result: HookResult) -> Mapping[str, Any]:
    return result if isinstance(result, Mapping) else await result


def skipped(registry: CollectorRegistry, reason: str) -> float:
    return registry.get_sample_value("sidecar_judge_skipped_total", {"reason": reason}) or 0.0


async def test_off_by_default_and_per_turn_hooks_do_nothing() -> None:
    h = JudgeHooks(JudgeConfig(), CollectorRegistry(), client=FakeChatClient())
    assert h.on_conversation_ended(ended()) == {"skipped": "disabled"}
    ctx = TurnContext("user_message", "c1", 1, MSGS, None, None)
    assert h.on_user_message(ctx) == {} and h.on_turn_closed(ctx) == {}
    await h.stop()
    await h.stop()  # idempotent


async def test_judged_outcome_has_the_decision_and_the_cost_but_no_text() -> None:
    fake = FakeChatClient()
    h, _ = hooks(fake)
    out = await resolve(h.on_conversation_ended(ended()))
    assert out["complete"] is True and out["verdict"] == "complete"
    assert (out["calls"], out["prompt_tokens"], out["completion_tokens"]) == (2, 200, 20)
    assert "explanation" not in str(out) and h.pending == 0
    h2, _ = hooks(FakeChatClient(), include_text_in_outcome=True)
    assert "explanation" in (await resolve(h2.on_conversation_ended(ended())))["accuracy"]


async def test_skips_are_immediate_and_counted() -> None:
    h, registry = hooks()
    assert h.on_conversation_ended(ended(turn=0)) == {"skipped": "no_user_turn"}
    h0, r0 = hooks(sample_rate=0.0)
    assert h0.on_conversation_ended(ended()) == {"skipped": "sampled_out"}
    assert skipped(registry, "no_user_turn") == 1 and skipped(r0, "sampled_out") == 1


def would_judge(h: JudgeHooks, cid: str) -> bool:
    result = h.on_conversation_ended(ended(cid))
    if isinstance(result, Mapping):
        return False
    result.close()  # type: ignore[attr-defined]  # a coroutine: not run here
    return True


async def test_sampling_is_deterministic_per_conversation() -> None:
    h, _ = hooks(sample_rate=0.3)
    decisions = [would_judge(h, f"c{i}") for i in range(200)]
    assert decisions == [would_judge(h, f"c{i}") for i in range(200)]
    assert 30 <= sum(decisions) <= 90  # about 30% of 200
    assert h.pending == 0


async def test_call_and_token_budgets_stop_judging() -> None:
    h, registry = hooks(max_calls_per_minute=3)
    await resolve(h.on_conversation_ended(ended("a")))
    await resolve(h.on_conversation_ended(ended("b")))  # 4 calls spent > 3
    assert h.on_conversation_ended(ended("c")) == {"skipped": "call_budget"}
    h, registry = hooks(max_tokens_per_minute=100)
    await resolve(h.on_conversation_ended(ended("a")))  # 220 tokens spent
    assert h.on_conversation_ended(ended("b")) == {"skipped": "token_budget"}
    assert skipped(registry, "token_budget") == 1


async def test_pending_work_is_bounded() -> None:
    h, registry = hooks(FakeChatClient(delay=0.2), max_pending=2)
    results = [h.on_conversation_ended(ended(f"c{i}")) for i in range(4)]
    outs = await asyncio.gather(*(resolve(r) for r in results))
    assert [o.get("skipped") for o in outs].count("overloaded") == 2
    assert sum(1 for o in outs if "verdict" in o) == 2
    assert h.pending == 0 and skipped(registry, "overloaded") == 2


async def test_composes_with_other_hooks_by_name() -> None:
    h, _ = hooks()
    both = CompositeHooks({"recorder": RecordingHooks(), "judge": h})
    out = await resolve(both.on_conversation_ended(ended()))
    assert out["judge"]["verdict"] == "complete" and out["recorder"]["recorded"] is True
    assert (await resolve(both.on_turn_closed(ended())))["judge"] == {}
