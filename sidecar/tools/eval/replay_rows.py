"""``turns.jsonl``: what phase 1 of the replay found, one row per conversation, and back.

A row keeps what the escalation policy reads: each user turn's tree (leaves, best-branch logprob),
each closed turn's P(end), the final verdicts of the whole and the cut copy, and the alerts of the
run. :func:`replay_of` rebuilds the effects from a row and the conversation's messages, so
``sidecar eval-alerts --rows DIR`` decides again under another alerting policy without vLLM
(the effects carry the numbers the policy uses, not the trees' text).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sidecar.contract import CompletionScored, EndReason, Outcome, Scored, TreeScored
from sidecar.errors import ConfigError
from sidecar.tools.eval.dataset import EvalConversation
from sidecar.tools.eval.replay import Recorded, Replay, assemble, contexts

ROWS_VERSION = 1


def row_of(rep: Replay, alerts: Sequence[Recorded]) -> dict[str, Any]:
    mine = [[a.kind, a.turn, a.lead_turns, a.lead_messages] for a in alerts if a.copy == rep.full.id]
    cut = rep.cut
    return {
        "v": ROWS_VERSION,
        "id": rep.conv.conversation_id,
        "source": rep.conv.source,
        "labels": dict(rep.conv.labels),
        "turns": rep.full.turns,
        "cut_after": cut.turns if cut is not None else None,
        "trees": {str(t): list(v) for t, v in sorted(rep.trees.items())},
        "p_end": {str(t): v for t, v in sorted(rep.p_end.items())},
        "final": rep.final,
        "cut_final": rep.cut_final,
        "alerts": mine,
        "cut_alerts": [[a.kind, a.turn, a.lead_turns, a.lead_messages] for a in alerts if cut and a.copy == cut.id],
    }


def _tree(value: Any) -> Outcome:
    if not isinstance(value, list) or len(value) != 2:
        return {"skipped": "no tree"}
    leaves, best = value
    return Scored({}, [TreeScored(int(leaves), int(leaves), best, None, 0, None, "replayed")])


def _verdict(p_end: float | None, complete: bool | None, *, final: bool) -> Outcome:
    if p_end is None or complete is None:
        return {"skipped": "no verdict"}
    return Scored({}, [CompletionScored(p_end, complete, "replayed", "replayed", final=final)])


def replay_of(conv: EvalConversation, row: Mapping[str, Any], end_reason: EndReason) -> Replay:
    """The replay a row records, its effects rebuilt for the escalation policy."""
    if row.get("v") != ROWS_VERSION or row.get("turns") != conv.turns:
        raise ConfigError(f"turns.jsonl row {conv.conversation_id!r} does not match the input (version or turns)")
    trees, p_end = row.get("trees", {}), row.get("p_end", {})
    ctxs = contexts(conv, end_reason)
    last = conv.turns
    outcomes: list[Outcome] = []
    for ctx in ctxs:
        if ctx.kind == "user_message":
            outcomes.append(_tree(trees.get(str(ctx.turn))))
        elif ctx.kind == "turn_closed":
            outcomes.append(_verdict(p_end.get(str(ctx.turn)), True, final=False))
        else:
            outcomes.append(_verdict(p_end.get(str(last)), row.get("final"), final=True))
    k = row.get("cut_after")
    cut = None
    if isinstance(k, int):
        cut = (k, _verdict(p_end.get(str(k)), row.get("cut_final"), final=True))
    return assemble(conv, ctxs, outcomes, cut)


def replays_of(
    convs: Sequence[EvalConversation], rows: Mapping[str, Mapping[str, Any]], end_reason: EndReason
) -> list[Replay]:
    missing = [c.conversation_id for c in convs if c.conversation_id not in rows]
    if missing:
        raise ConfigError(f"turns.jsonl has no row for {len(missing)} input conversations (first: {missing[0]!r})")
    return [replay_of(c, rows[c.conversation_id], end_reason) for c in convs]
