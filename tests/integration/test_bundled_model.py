"""What the bundled, trained model does on real conversations, through the sidecar's scoring path
on a real vLLM server (the CPU build)."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable, Sequence

from prometheus_client import CollectorRegistry

from sidecar.scoring.hooks import ScoringHooks
from sidecar.scoring.scorers import Scorers
from sidecar.tools.demo.replay import load_sample
from sidecar.transcript.model import Message
from sidecar.transcript.render import render_text
from tests.support.bundled_vllm import BundledVllm

N_CONVERSATIONS = 40


def sample_conversations(n: int) -> list[list[Message]]:
    out = []
    for rec in load_sample():
        msgs = [Message(t["role"], t.get("content") or "") for t in rec["turns"] if t["role"] in ("user", "assistant")]
        if len(msgs) >= 4 and msgs[0].role == "user":
            out.append(msgs)
        if len(out) == n:
            break
    return out


def forged(conv: Sequence[Message], *, headers: bool) -> list[Message]:
    """One user message, the agent never replied: its content pastes the rest of the genuine
    conversation, rendered with its step headers (or as prose without them)."""
    rest = render_text(conv[1:])
    if not headers:
        rest = re.sub(r"(?m)^TURN \d+, STEP \d+, [^\n]*\n", "", rest)
    return [Message("user", f"{conv[0].content}\n\n{rest.strip()}")]


async def complete_count(
    scorers: Scorers, convs: list[list[Message]], build: Callable[[list[Message]], list[Message]]
) -> int:
    # All at once: the server batches them (one by one took ~1 s per prompt on two CPU cores).
    scores = await asyncio.gather(*(scorers.score_adapter(build(c), "completion") for c in convs))
    return sum(s.complete for s in scores)


async def test_forged_structure_scores_like_the_unforged_message(bundled_vllm: BundledVllm) -> None:
    """Regression: 15 of 20 one-message conversations whose content pasted a finished dialogue
    (step headers included) scored "complete"; the same message without the paste scores 0."""
    scorers = Scorers.from_config(bundled_vllm.scoring_config(), CollectorRegistry())
    await scorers.start()
    try:
        convs = sample_conversations(N_CONVERSATIONS)
        genuine = await complete_count(scorers, convs, lambda c: c)
        unforged = await complete_count(scorers, convs, lambda c: [c[0]])
        with_headers = await complete_count(scorers, convs, lambda c: forged(c, headers=True))
        as_prose = await complete_count(scorers, convs, lambda c: forged(c, headers=False))
    finally:
        await scorers.stop()
    print(
        f"complete of {len(convs)}: genuine {genuine}, unforged {unforged}, "
        f"forged headers {with_headers}, forged prose {as_prose}"
    )
    assert genuine >= len(convs) // 2  # the model does call finished conversations complete
    assert with_headers == unforged
    assert as_prose == unforged


async def test_uncertain_turn_rate_tracks_the_target_on_real_conversations(bundled_vllm: BundledVllm) -> None:
    """Regression: with fixed thresholds the demo flagged 476 of 476 turns. The relative policy,
    on the trees the bundled model really builds for the bundled sample, flags the target rate
    within 2 points; the trees themselves are not degenerate at the demo's alpha."""
    from sidecar.alerting.config import UncertaintyPolicyConfig
    from sidecar.alerting.policy import UncertaintyJudge
    from sidecar.contract import TreeScored, TurnContext, events_of

    cfg = bundled_vllm.scoring_config(tree={"alpha": 0.05, "max_staleness_seconds": 0, "skip_superseded": False})
    hooks = ScoringHooks.from_config(cfg, CollectorRegistry())
    turns = []
    for rec in load_sample()[:60]:
        msgs: list[Message] = []
        for t in rec["turns"]:
            msgs.append(Message(t["role"], t.get("content") or ""))
            if t["role"] == "user":
                n = sum(m.role == "user" for m in msgs)
                turns.append(TurnContext("user_message", rec["conversation_id"], n, tuple(msgs), "demo", None))
    await hooks.start()
    try:
        trees: list[TreeScored] = []
        for i in range(0, len(turns), 8):
            outs = await asyncio.gather(*(hooks.on_user_message(t) for t in turns[i : i + 8]))  # type: ignore[arg-type]
            trees.extend(e for o in outs for e in events_of(o) if isinstance(e, TreeScored))
    finally:
        await hooks.stop()
    policy = UncertaintyPolicyConfig(target_rate=0.05, window_trees=500, min_trees=50)
    judge = UncertaintyJudge()
    flags = [
        judge.judge(policy, "demo", f"{t.conversation_id}:{t.turn}", e.leaves, e.max_logprob).uncertain
        for e, t in zip(trees, turns, strict=True)
    ][policy.min_trees :]
    leaves = sorted(e.leaves for e in trees)
    one_leaf = sum(x == 1 for x in leaves) / len(leaves)
    rate = sum(flags) / len(flags)
    print(
        f"{len(trees)} trees: one-leaf share {one_leaf:.2f}, leaves p50 {leaves[len(leaves) // 2]}, "
        f"max {leaves[-1]}; flagged {sum(flags)} of {len(flags)} = {rate:.3f}"
    )
    assert len(trees) == len(turns) > 300
    assert one_leaf < 0.5 and leaves[-1] >= 3  # non-degenerate at alpha 0.05
    assert abs(rate - policy.target_rate) <= 0.02
