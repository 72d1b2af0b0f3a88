"""ScoringHooks on the toy model: routing, sampling, budgets, errors, waiting, cancellation."""

from __future__ import annotations

import asyncio
import inspect
import json
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from sidecar.contract import (
    CompletionScored,
    ConversationHooks,
    HookResult,
    Outcome,
    TreeScored,
    TurnContext,
    events_of,
)
from sidecar.scoring.client import VllmRequestError
from sidecar.scoring.config import ScoringConfig
from sidecar.scoring.hooks import ScoringHooks
from sidecar.telemetry.labels import AgentLabels
from sidecar.transcript.model import Message
from tests.scoring.conversations import RESTAURANT, TRAVEL
from tests.scoring.fakes import ToyLM
from tests.support.tiny_model import build_tokenizer


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("tok")
    build_tokenizer(d)
    return d


def _hooks(tok_dir: Path, lm: ToyLM | None = None, **cfg: Any) -> tuple[ScoringHooks, ToyLM, CollectorRegistry]:
    base: dict[str, Any] = {
        "enabled": True,
        "tokenizer": {"model_dir": str(tok_dir)},
        "agents": {"booking": {"adapter": "completion-booking"}},
        "tree": {"alpha": 0.1, "max_depth_tokens": 6},
    }
    for k, v in cfg.items():
        merge = isinstance(v, dict) and v and isinstance(base.get(k), dict)
        base[k] = {**base[k], **v} if merge else v
    lm = lm or ToyLM(vocab=512, seed=1, peak=1.5)
    registry = CollectorRegistry()
    return ScoringHooks.from_config(ScoringConfig(**base), registry, client=lm), lm, registry


async def run(result: HookResult) -> Outcome:
    """Resolve a hook result: an immediate outcome or an awaitable of one."""
    return await result if inspect.isawaitable(result) else result


def _ctx(
    kind: str, messages: list[Message], agent: str | None = "booking", turn: int = 2, cid: str = "c1"
) -> TurnContext:
    return TurnContext(kind, cid, turn, messages, agent, None)  # type: ignore[arg-type]


async def test_implements_the_hook_protocol(tok_dir: Path) -> None:
    hooks, _, _ = _hooks(tok_dir)
    assert isinstance(hooks, object)
    protocol: ConversationHooks = hooks
    assert protocol is hooks


async def test_completion_routes_to_the_agents_adapter(tok_dir: Path) -> None:
    hooks, lm, registry = _hooks(tok_dir)
    out = await run(hooks.on_turn_closed(_ctx("turn_closed", RESTAURANT)))
    assert out["variant"] == "adapter"
    assert 0.0 <= out["p_end"] <= 1.0
    assert lm.requests[0]["model"] == "completion-booking"
    assert "remaining_tasks" not in out  # text stays out of outcomes by default
    json.dumps(out)
    assert registry.get_sample_value("sidecar_completion_probability_count", {"agent": "booking"}) == 1


async def test_agents_without_adapter_use_the_instruct_variant_on_the_base_model(tok_dir: Path) -> None:
    hooks, lm, _ = _hooks(tok_dir)
    out = await run(hooks.on_turn_closed(_ctx("turn_closed", TRAVEL, agent="unknown-agent")))
    assert out["variant"] == "instruct"
    assert lm.requests[0]["model"] == "base"


async def test_text_in_outcomes_only_when_allowed(tok_dir: Path) -> None:
    hooks, _, _ = _hooks(tok_dir, completion={"include_text_in_outcome": True}, tree={"include_text_in_outcome": True})
    out = await run(hooks.on_turn_closed(_ctx("turn_closed", TRAVEL)))
    assert out["complete"] or isinstance(out["remaining_tasks"], str)
    tree = await run(hooks.on_user_message(_ctx("user_message", TRAVEL)))
    assert isinstance(tree["best_branch"], str)


async def test_tree_outcome_event_and_metrics(tok_dir: Path) -> None:
    hooks, lm, registry = _hooks(tok_dir)
    out = await run(hooks.on_user_message(_ctx("user_message", TRAVEL)))
    assert out["leaves"] >= 1
    assert "uncertain" not in out  # the verdict is the post-score stage's (alerting.policy)
    assert lm.requests[0]["model"] == "base"
    assert registry.get_sample_value("sidecar_tree_leaves_count", {"agent": "booking"}) == 1
    [tree] = events_of(out)
    assert isinstance(tree, TreeScored)
    assert tree.leaves == out["leaves"] and tree.max_logprob is not None and tree.model == "base"
    assert "best_branch" not in out and isinstance(tree.best_branch, str)  # text stays in the process
    json.dumps(out)


async def test_completion_outcomes_carry_typed_events(tok_dir: Path) -> None:
    hooks, _, _ = _hooks(tok_dir)
    turn = await run(hooks.on_turn_closed(_ctx("turn_closed", RESTAURANT)))
    final = await run(hooks.on_conversation_ended(_ctx("conversation_ended", RESTAURANT, cid="c9")))
    [t], [f] = events_of(turn), events_of(final)
    assert isinstance(t, CompletionScored) and isinstance(f, CompletionScored)
    assert (t.final, f.final) == (False, True)
    assert round(t.p_end, 8) == turn["p_end"] and t.model == "completion-booking"


async def test_stale_trees_are_shed_and_counted(tok_dir: Path) -> None:
    import time

    hooks, lm, registry = _hooks(tok_dir, tree={"max_staleness_seconds": 30})
    old = TurnContext("user_message", "c1", 2, TRAVEL, "booking", None, triggered_at_unix=time.time() - 31)
    out = await run(hooks.on_user_message(old))
    assert out == {"skipped": "stale"} and lm.requests == []
    fresh = TurnContext("user_message", "c2", 2, TRAVEL, "booking", None, triggered_at_unix=time.time())
    assert "leaves" in await run(hooks.on_user_message(fresh))
    value = registry.get_sample_value(
        "sidecar_scoring_skipped_total", {"agent": "booking", "kind": "tree", "reason": "stale"}
    )
    assert value == 1


async def test_sampling_is_deterministic_per_turn(tok_dir: Path) -> None:
    hooks, _, _ = _hooks(tok_dir, agents={"booking": {"adapter": "a", "completion_sample_rate": 0.5}})
    first = [await run(hooks.on_turn_closed(_ctx("turn_closed", RESTAURANT, cid=f"c{i}"))) for i in range(40)]
    again = [await run(hooks.on_turn_closed(_ctx("turn_closed", RESTAURANT, cid=f"c{i}"))) for i in range(40)]
    skipped = [("skipped" in o) for o in first]
    assert skipped == [("skipped" in o) for o in again]
    assert 5 < sum(skipped) < 35


async def test_token_budget_skips_when_spent(tok_dir: Path) -> None:
    hooks, _, _ = _hooks(tok_dir, agents={"booking": {"adapter": "a", "max_tokens_per_minute": 1}})
    first = await run(hooks.on_turn_closed(_ctx("turn_closed", RESTAURANT, cid="x")))
    second = await run(hooks.on_turn_closed(_ctx("turn_closed", RESTAURANT, cid="y")))
    assert "p_end" in first
    assert second == {"skipped": "token_budget"}


async def test_disabled_scoring_does_nothing(tok_dir: Path) -> None:
    hooks, lm, _ = _hooks(tok_dir, completion={"enabled": False}, tree={"enabled": False})
    # Immediate decisions come back as outcomes, not awaitables.
    assert hooks.on_turn_closed(_ctx("turn_closed", RESTAURANT)) == {"skipped": "disabled"}
    assert hooks.on_user_message(_ctx("user_message", RESTAURANT)) == {"skipped": "disabled"}
    assert lm.requests == []


async def test_final_verdict_reuses_the_last_turn_score_and_counts_by_goal(tok_dir: Path) -> None:
    async def labeler(ctx: TurnContext) -> str:
        return "book_table"

    hooks, lm, registry = _hooks(tok_dir)
    hooks._goal = labeler
    closed = await run(hooks.on_turn_closed(_ctx("turn_closed", RESTAURANT, turn=3)))
    n = len(lm.requests)
    final = await run(hooks.on_conversation_ended(_ctx("conversation_ended", RESTAURANT, turn=3)))
    assert len(lm.requests) == n  # same prefix: not recomputed
    assert final["final"] is True
    assert final["p_end"] == closed["p_end"]
    outcome = "complete" if final["complete"] else "incomplete"
    labels = {"agent": "booking", "outcome": outcome, "goal": "book_table"}
    assert registry.get_sample_value("sidecar_conversations_ended_total", labels) == 1


async def test_failing_goal_labeler_gives_unknown(tok_dir: Path) -> None:
    async def broken(ctx: TurnContext) -> str:
        raise RuntimeError("boom")

    hooks, _, _ = _hooks(tok_dir)
    hooks._goal = broken
    final = await run(hooks.on_conversation_ended(_ctx("conversation_ended", TRAVEL, turn=3)))
    assert final["goal"] == "unknown"


async def test_conversation_without_user_turn_is_counted_unscored(tok_dir: Path) -> None:
    hooks, lm, registry = _hooks(tok_dir)
    out = await run(hooks.on_conversation_ended(_ctx("conversation_ended", [Message("system", "hi")], turn=0)))
    assert out["skipped"] == "no_user_turn"
    assert lm.requests == []
    labels = {"agent": "booking", "outcome": "unscored", "goal": "unknown"}
    assert registry.get_sample_value("sidecar_conversations_ended_total", labels) == 1


async def test_retryable_failures_wait_instead_of_failing(tok_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import random

    monkeypatch.setattr(random, "uniform", lambda a, b: 0.001)
    lm = ToyLM(vocab=512, seed=1)
    lm.fail_next = 3
    hooks, _, registry = _hooks(tok_dir, lm)
    out = await run(hooks.on_turn_closed(_ctx("turn_closed", RESTAURANT)))
    assert "p_end" in out
    assert registry.get_sample_value("sidecar_scoring_backpressure_waits_total", {"kind": "completion"}) == 3


async def test_permanent_errors_become_error_outcomes(tok_dir: Path) -> None:
    class Refusing(ToyLM):
        async def generate(self, *a: Any, **k: Any) -> Any:
            raise VllmRequestError("http_404", "no such adapter", 404)

    hooks, _, registry = _hooks(tok_dir, Refusing(vocab=512))
    assert await run(hooks.on_turn_closed(_ctx("turn_closed", RESTAURANT))) == {"error": "http_404"}
    assert await run(hooks.on_user_message(_ctx("user_message", RESTAURANT))) == {"error": "http_404"}
    final = await run(hooks.on_conversation_ended(_ctx("conversation_ended", RESTAURANT)))
    assert final == {"error": "http_404"}
    labels = {"agent": "booking", "kind": "completion", "reason": "http_404"}
    assert registry.get_sample_value("sidecar_scoring_errors_total", labels) == 1
    ended = {"agent": "booking", "outcome": "error", "goal": "unknown"}
    assert registry.get_sample_value("sidecar_conversations_ended_total", ended) == 1


async def test_oversized_conversation_is_a_permanent_error(tok_dir: Path) -> None:
    hooks, lm, _ = _hooks(tok_dir, max_prompt_tokens=64)
    out = await run(hooks.on_turn_closed(_ctx("turn_closed", [Message("user", "word " * 500)], turn=1)))
    assert out == {"error": "prompt_too_long"}
    assert lm.requests == []


async def test_cancellation_propagates(tok_dir: Path) -> None:
    class Hanging(ToyLM):
        async def generate(self, *a: Any, **k: Any) -> Any:
            await asyncio.sleep(3600)

    hooks, _, _ = _hooks(tok_dir, Hanging(vocab=512))
    task = asyncio.ensure_future(run(hooks.on_user_message(_ctx("user_message", RESTAURANT))))
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_hooks_return_quickly_without_running_work(tok_dir: Path) -> None:
    hooks, lm, _ = _hooks(tok_dir)
    aw = hooks.on_turn_closed(_ctx("turn_closed", RESTAURANT))
    assert inspect.isawaitable(aw)
    assert lm.requests == []  # nothing happens until the processor awaits it
    await aw
    assert lm.requests


async def test_agent_labels_are_bounded(tok_dir: Path) -> None:
    """Unlisted agents get their own label, first come first served, up to a cap; then ``other``."""
    hooks, _, registry = _hooks(tok_dir)
    hooks._labels = AgentLabels(["booking"], max_dynamic=3)
    for i in range(5):
        await run(hooks.on_turn_closed(_ctx("turn_closed", TRAVEL, agent=f"attacker-{i}", cid=f"k{i}")))
    await run(hooks.on_turn_closed(_ctx("turn_closed", TRAVEL, agent=None, cid="none")))
    for i in range(3):
        assert registry.get_sample_value("sidecar_completion_probability_count", {"agent": f"attacker-{i}"}) == 1
    assert registry.get_sample_value("sidecar_completion_probability_count", {"agent": "other"}) == 2
    assert registry.get_sample_value("sidecar_completion_probability_count", {"agent": "default"}) == 1


async def test_pending_work_is_bounded_per_kind(tok_dir: Path) -> None:
    running = 0
    peak = 0

    class Slow(ToyLM):
        async def generate(self, *a: Any, **k: Any) -> Any:
            nonlocal running, peak
            running += 1
            peak = max(peak, running)
            await asyncio.sleep(0.02)
            running -= 1
            return await super().generate(*a, **k)

    hooks, _, _ = _hooks(tok_dir, Slow(vocab=512), scheduling={"max_pending_per_kind": 2}, tree={"enabled": False})
    outs = await asyncio.gather(
        *(run(hooks.on_turn_closed(_ctx("turn_closed", TRAVEL, cid=f"p{i}"))) for i in range(8))
    )
    assert all("p_end" in o for o in outs)
    assert peak == 2


async def test_turn_closed_by_the_next_user_message_scores_c_k_without_it(tok_dir: Path) -> None:
    seen: list[list[int]] = []

    class Recording(ToyLM):
        async def generate(self, model: str, prompts: Any, **k: Any) -> Any:
            seen.extend(list(p) for p in prompts)
            return await super().generate(model, prompts, **k)

    hooks, _, _ = _hooks(tok_dir, Recording(vocab=512))
    c2 = TRAVEL[:4]  # two complete turns
    await run(hooks.on_turn_closed(_ctx("turn_closed", [*c2, TRAVEL[4]], turn=2, cid="a")))
    await run(hooks.on_turn_closed(_ctx("turn_closed", c2, turn=2, cid="b")))
    assert seen[0] == seen[1]
    assert "Can you also find a hotel" not in hooks.scorers.tokenizer.decode(seen[0])


async def test_a_failure_in_the_middle_of_a_tree_retries_the_tree(
    tok_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import random

    monkeypatch.setattr(random, "uniform", lambda a, b: 0.001)
    reference, _, _ = _hooks(tok_dir, ToyLM(vocab=512, seed=1, peak=4.0), tree={"alpha": 0.05})
    expected = await run(reference.on_user_message(_ctx("user_message", TRAVEL)))
    assert expected["requests"] >= 2
    lm = ToyLM(vocab=512, seed=1, peak=4.0)
    lm.fail_calls = {2}  # the first branch request fails once
    hooks, _, registry = _hooks(tok_dir, lm, tree={"alpha": 0.05})
    out = await run(hooks.on_user_message(_ctx("user_message", TRAVEL)))
    assert out == expected
    assert registry.get_sample_value("sidecar_scoring_backpressure_waits_total", {"kind": "tree"}) == 1


async def test_paper_format_tree_ends_branches_at_the_next_step_header(tok_dir: Path) -> None:
    hooks, _, _ = _hooks(tok_dir, tree={"use_chat_template": False, "include_text_in_outcome": True})
    assert not hooks.scorers.prompts.tree_chat
    assert hooks.scorers.tree._stop_strings == ("\n\nTURN ",)
    out = await run(hooks.on_user_message(_ctx("user_message", TRAVEL)))
    assert "\n\nTURN " not in out["best_branch"]


async def test_a_tree_superseded_by_a_newer_user_message_is_skipped(tok_dir: Path) -> None:
    hooks, _, registry = _hooks(tok_dir)
    old = hooks.on_user_message(_ctx("user_message", TRAVEL[:3], turn=2, cid="d"))
    new = hooks.on_user_message(_ctx("user_message", TRAVEL[:5], turn=3, cid="d"))
    assert await run(old) == {"skipped": "superseded"}
    assert "leaves" in await run(new)
    labels = {"agent": "booking", "kind": "tree", "reason": "superseded"}
    assert registry.get_sample_value("sidecar_scoring_skipped_total", labels) == 1
    # A replay of the old turn after a restart (newest unknown) computes it.
    fresh, _, _ = _hooks(tok_dir)
    assert "leaves" in await run(fresh.on_user_message(_ctx("user_message", TRAVEL[:3], turn=2, cid="d")))


async def test_tokenizer_without_the_end_tag_serves_the_instruct_variant_only(tok_dir: Path) -> None:
    from sidecar.errors import ConfigError

    with pytest.raises(ConfigError, match="end tag"):
        _hooks(tok_dir, completion={"end_tag": "<|no_such_token|>"})
    hooks, lm, _ = _hooks(tok_dir, completion={"end_tag": "<|no_such_token|>"}, agents={})
    out = await run(hooks.on_turn_closed(_ctx("turn_closed", TRAVEL, agent=None)))
    assert out["variant"] == "instruct"
    assert lm.requests[0]["model"] == "base"


async def test_prompt_building_runs_off_the_event_loop(tok_dir: Path) -> None:
    """Tokenisation grows with the conversation: it must never hold the loop that carries every
    partition and the Kafka heartbeat."""
    import threading

    hooks, _, _ = _hooks(tok_dir)
    loop_thread = threading.get_ident()
    seen: list[int] = []
    for name in ("completion_adapter", "completion_instruct", "tree"):
        real = getattr(hooks.scorers.prompts, name)

        def spy(*a: Any, _real: Any = real, **k: Any) -> Any:
            seen.append(threading.get_ident())
            return _real(*a, **k)

        setattr(hooks.scorers.prompts, name, spy)
    await run(hooks.on_turn_closed(_ctx("turn_closed", RESTAURANT)))
    await run(hooks.on_turn_closed(_ctx("turn_closed", TRAVEL, agent="unknown-agent")))
    await run(hooks.on_user_message(_ctx("user_message", TRAVEL, cid="c2")))
    assert len(seen) == 3
    assert loop_thread not in seen
    await hooks.stop()
