"""The alert evaluation on a hand-built case: known trees, verdicts and labels, so the alerts that
leave the live escalation stage, and their precision, recall, rate and lead time, are known exactly.

The hooks are fakes (what they return is the case); the escalation policy and the post-score stage
are the live ones."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from sidecar.alerting.config import AlertingConfig, PolicyConfig, UncertaintyPolicyConfig
from sidecar.contract import CompletionScored, HookResult, Outcome, Scored, TreeScored, TurnContext
from sidecar.tools.eval.alert_eval import ANY, goals, outcomes, summarize
from sidecar.tools.eval.alert_metrics import Table, baselines, earliness, evaluate
from sidecar.tools.eval.dataset import EvalConversation
from sidecar.tools.eval.replay import contexts, decide, replay_hooks
from sidecar.transcript.model import Message

DISC = {"completion_level": "DisconnectDuringDialogue"}
DONE = {"completion_level": "Complete"}


def conv(cid: str, turns: int, labels: dict[str, Any], *, answered_last: bool = True) -> EvalConversation:
    msgs: list[Message] = []
    for t in range(1, turns + 1):
        msgs.append(Message("user", f"user says {t}"))
        if t < turns or answered_last:
            msgs.append(Message("assistant", f"agent answers {t}"))
    return EvalConversation(cid, tuple(msgs), "star", "", labels)


CASE = [
    conv("c1", 4, DISC, answered_last=False),  # uncertain at turn 2, then stalls (user unanswered)
    conv("c2", 3, DONE),  # uncertain at turn 1: a false alarm
    conv("c3", 3, DISC),  # ends incomplete
    conv("c4", 2, DONE),  # nothing
]
UNCERTAIN = {("c1", 2), ("c2", 1)}
INCOMPLETE = {"c3"}
FULL_LENGTH = {c.conversation_id: len(c.messages) for c in CASE}


class CaseHooks:
    """Trees with 6 leaves where ``UNCERTAIN`` says so (1 elsewhere); final verdicts incomplete for
    ``INCOMPLETE`` and for every cut copy (an ending before the conversation's last message)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, int]] = []

    def on_user_message(self, ctx: TurnContext) -> HookResult:
        self.calls.append((ctx.kind, ctx.conversation_id, ctx.turn))
        leaves = 6 if (ctx.conversation_id, ctx.turn) in UNCERTAIN else 1
        return Scored({}, [TreeScored(leaves, leaves, -1.0, -0.1, 10, None, "base")])

    def on_turn_closed(self, ctx: TurnContext) -> HookResult:
        self.calls.append((ctx.kind, ctx.conversation_id, ctx.turn))
        return self._verdict(ctx, final=False)

    def on_conversation_ended(self, ctx: TurnContext) -> HookResult:
        self.calls.append((ctx.kind, ctx.conversation_id, ctx.turn))

        async def later() -> Outcome:
            return self._verdict(ctx, final=True)

        return later()

    @staticmethod
    def _verdict(ctx: TurnContext, *, final: bool) -> Scored:
        cut = len(ctx.messages) < FULL_LENGTH[ctx.conversation_id]
        complete = not final or not (ctx.conversation_id in INCOMPLETE or cut)
        return Scored({}, [CompletionScored(0.9 if complete else 0.1, complete, "adapter", "a", final=final)])


def alerting() -> AlertingConfig:
    fixed = UncertaintyPolicyConfig(mode="fixed", min_leaves=5, max_best_logprob=-50.0)
    return AlertingConfig(policy=PolicyConfig(uncertainty=fixed))


def run_case(cut: dict[str, int] | None = None) -> tuple[list[Any], CaseHooks]:
    hooks = CaseHooks()
    replays = asyncio.run(replay_hooks(hooks, CASE, cut_turn=lambda c: (cut or {}).get(c.conversation_id)))
    return replays, hooks


def test_hook_calls_follow_the_processor_order() -> None:
    kinds = [(c.kind, c.turn, c.close_reason or c.end_reason) for c in contexts(CASE[3], "idle_ttl")]
    assert kinds == [
        ("user_message", 1, None),
        ("turn_closed", 1, "next_user_message"),
        ("user_message", 2, None),
        ("turn_closed", 2, "idle_debounce"),
        ("conversation_ended", 2, "idle_ttl"),
    ]
    ctx = contexts(CASE[3], "idle_ttl")
    assert [len(c.messages) for c in ctx] == [1, 3, 3, 4, 4]  # a closed turn sees the next user message


def test_the_alerts_leaving_the_stage_are_the_known_ones() -> None:
    replays, _ = run_case()
    got = sorted(
        (a.copy, a.kind, a.turn, a.lead_turns, a.lead_messages) for a in decide([r.full for r in replays], alerting())
    )
    assert got == [
        ("c1", "conversation_stalled", 4, 0, 0),
        # c1: turn 2 of 4, seen through message 3 of 7: 2 user turns and 4 messages later it ends
        ("c1", "uncertain_turn", 2, 2, 4),
        ("c2", "uncertain_turn", 1, 2, 5),
        ("c3", "conversation_incomplete", 3, 0, 0),
    ]


def test_precision_recall_rate_and_lead_are_exact() -> None:
    replays, _ = run_case()
    alerts = decide([r.full for r in replays], alerting())
    summary = summarize(replays, alerts, rounds=0)
    rows = summary["outcomes"]["STAR disconnect"]["alerters"]
    u = rows["uncertain_turn"]
    assert (u["copies"], u["positives"], u["base_rate"]) == (4, 2, 0.5)
    assert (u["alerts"], u["turns"], u["alerts_per_1000_turns"]) == (2, 12, 166.7)
    assert (u["precision"], u["recall"], u["f1"]) == (0.5, 0.5, 0.5)
    assert (u["median_lead_user_turns"], u["median_lead_messages"]) == (2.0, 4.0)
    a = rows[ANY]
    assert (a["alerts"], a["flagged"], a["alert_precision"]) == (4, 3, 0.75)
    assert (a["precision"], a["recall"], a["f1"]) == (0.6667, 1.0, 0.8)
    assert a["median_lead_user_turns"] == 1.0  # c1's first alert 2 turns early, c3's at the end
    s = rows["conversation_stalled"]
    assert (s["precision"], s["recall"], s["median_lead_user_turns"]) == (1.0, 0.5, 0.0)
    # baselines fire as many alerts as the row they are set against
    assert all(b["alerts"] == 4 for b in a["baselines"].values())


def test_earliness_keeps_only_the_alerts_available_by_then() -> None:
    replays, _ = run_case()
    alerts = decide([r.full for r in replays], alerting())
    table = Table.of([r.full for r in replays], outcomes(replays)["STAR disconnect"])
    curve = {p["fraction"]: p for p in earliness(table, alerts)}
    # after 20 % of the turns: c2's turn-1 alert (1 <= ceil(0.6)); c1's turn 2 is not yet in (2 > ceil(0.8))
    assert (curve[0.2]["precision"], curve[0.2]["recall"]) == (0.0, 0.0)
    assert (curve[0.4]["precision"], curve[0.4]["recall"]) == (0.5, 0.5)  # c1's turn 2 <= ceil(1.6)
    assert (curve[1.0]["precision"], curve[1.0]["recall"]) == (0.6667, 1.0)  # the endings count at the end


def test_a_cut_copy_ends_abandoned_and_reuses_the_hooks() -> None:
    replays, hooks = run_case(cut={"c1": 2})
    c1 = replays[0]
    assert c1.cut is not None and (c1.cut.id, c1.cut.turns, c1.cut.messages) == ("c1#cut", 2, 4)
    # one extra hook call for the cut copy: its ending (the prefix's verdict is the cached one live)
    assert hooks.calls.count(("conversation_ended", "c1", 2)) == 1
    alerts = decide([c1.cut], alerting())
    assert sorted((a.kind, a.turn, a.lead_turns, a.lead_messages) for a in alerts) == [
        ("conversation_incomplete", 2, 0, 0),
        ("uncertain_turn", 2, 0, 1),
    ]
    labels = outcomes(replays)["truncation (cut = abandoned)"]
    assert labels == {"c1": False, "c1#cut": True}


def test_baselines_pick_the_top_of_their_score() -> None:
    replays, _ = run_case()
    copies = [r.full for r in replays]
    base = baselines(copies, 1)
    assert [(a.copy, a.turn) for a in base["last message"]] == [("c1", 4)]  # the only unanswered user
    assert [(a.copy, a.turn) for a in base["length"]] == [("c1", 4)]  # the most text before a user message
    assert len(base["random"]) == 1


def test_intervals_bracket_the_estimate_and_goals_are_reported() -> None:
    replays, _ = run_case()
    alerts = decide([r.full for r in replays], alerting())
    table = Table.of([r.full for r in replays], outcomes(replays)["STAR disconnect"])
    row = evaluate(table, alerts, rounds=200)
    lo, hi = row["ci"]["recall"]
    assert lo <= row["recall"] <= hi
    summary = summarize(replays, alerts, rounds=50)
    g = goals(summary["outcomes"])["alerters"]["conversation_stalled"]
    # 1 alert in 12 turns (8 %): over the 5 % rate; precision 1.0 = 2x the 0.5 base rate; lead 0
    assert (g["rate_ok"], g["lift"], g["lift_ok"], g["lead_ok"]) == (False, 2.0, False, False)


@pytest.mark.parametrize("rounds", [0, 30])
def test_the_summary_is_strict_json(rounds: int) -> None:
    replays, _ = run_case(cut={"c1": 2, "c2": 1})
    alerts = decide([r.full for r in replays] + [r.cut for r in replays if r.cut is not None], alerting())
    json.dumps(summarize(replays, alerts, rounds=rounds), allow_nan=False)


def test_rows_rebuild_the_effects_the_policy_decides_on() -> None:
    """turns.jsonl round trip: the rebuilt effects give the same alerts and the same summary."""
    from sidecar.tools.eval.replay_rows import replays_of, row_of

    replays, _ = run_case(cut={"c1": 2, "c3": 1})
    copies = [r.full for r in replays] + [r.cut for r in replays if r.cut is not None]
    alerts = decide(copies, alerting())
    rows = {r.conv.conversation_id: json.loads(json.dumps(row_of(r, alerts))) for r in replays}
    again = replays_of(CASE, rows, "idle_ttl")
    copies_again = [r.full for r in again] + [r.cut for r in again if r.cut is not None]
    assert decide(copies_again, alerting()) == alerts
    assert summarize(again, decide(copies_again, alerting()), rounds=0) == summarize(replays, alerts, rounds=0)


def test_rows_that_do_not_match_the_input_are_refused() -> None:
    from sidecar.errors import ConfigError
    from sidecar.tools.eval.replay_rows import replays_of, row_of

    replays, _ = run_case()
    rows = {r.conv.conversation_id: row_of(r, []) for r in replays}
    with pytest.raises(ConfigError, match="no row"):
        replays_of([*CASE, conv("c5", 1, DONE)], rows, "idle_ttl")
    rows["c2"] = {**rows["c2"], "turns": 7}
    with pytest.raises(ConfigError, match="does not match"):
        replays_of(CASE, rows, "idle_ttl")
