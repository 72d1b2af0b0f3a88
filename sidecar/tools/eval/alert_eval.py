"""The alert evaluation's numbers: outcomes, alerters (kinds, baselines, candidate rules), goals.

Outcomes (True = failed or abandoned), each over the copies it is defined on:

* ``STAR disconnect``: ``meta.completion_level`` is a disconnect during the dialogue;
* ``STAR user-reported failure``: ``meta.user_reported_task_success`` is false (conversations
  whose user answered the question only);
* ``tau-bench reward < 1``: ``meta.reward`` below 1;
* ``truncation (cut = abandoned)``: the paper's protocol, every conversation whole (finished) and
  cut after turn k (abandoned).

Alerters: each alert kind as it left the escalation stage, ``any alert`` (their union), the
uncertain-turn kind again under the other ``rule``, and per kind the baselines at its alert count.
Candidate uncertain-turn rules (``rules``) are ranked over the whole set (not the live causal
window) and flag the top ``RULE_RATE`` of user turns, so they compare on equal terms.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from sidecar.tools.eval.alert_metrics import (
    Candidate,
    Table,
    baselines,
    earliness,
    evaluate,
    gap_to_baseline,
    matched,
)
from sidecar.tools.eval.replay import Copy, Recorded, Replay

DISCONNECTS = frozenset({"DisconnectDuringDialogue", "EarlyDisconnectDuringDialogue"})
KINDS = ("uncertain_turn", "conversation_incomplete", "conversation_stalled")
ANY = "any alert"
RULE_RATE = 0.05
GOAL_RATE, GOAL_LIFT, GOAL_LEAD = 0.05, 3.0, 1.0
ABANDONMENT = "STAR disconnect"


def outcomes(replays: Sequence[Replay]) -> dict[str, dict[str, bool]]:
    """Each outcome's label per copy id (copies where it is undefined are left out)."""
    out: dict[str, dict[str, bool]] = {
        ABANDONMENT: {},
        "STAR user-reported failure": {},
        "tau-bench reward < 1": {},
        "truncation (cut = abandoned)": {},
    }
    for r in replays:
        lab = r.conv.labels
        if isinstance(lab.get("completion_level"), str):
            out[ABANDONMENT][r.full.id] = lab["completion_level"] in DISCONNECTS
        if isinstance(lab.get("user_reported_task_success"), bool):
            out["STAR user-reported failure"][r.full.id] = not lab["user_reported_task_success"]
        reward = lab.get("reward")
        if isinstance(reward, int | float) and not isinstance(reward, bool):
            out["tau-bench reward < 1"][r.full.id] = reward < 1
        if r.cut is not None:
            out["truncation (cut = abandoned)"][r.full.id] = False
            out["truncation (cut = abandoned)"][r.cut.id] = True
    return {k: v for k, v in out.items() if v}


def by_kind(alerts: Sequence[Recorded]) -> dict[str, list[Recorded]]:
    out: dict[str, list[Recorded]] = {k: [a for a in alerts if a.kind == k] for k in KINDS}
    out[ANY] = list(alerts)
    return out


# -- candidate uncertain-turn rules, ranked over the set --------------------------------------


def _rank_low(values: Sequence[float]) -> np.ndarray:
    """Mid-rank in [0, 1] of each value, the lowest ranked highest."""
    v = -np.asarray(values, dtype=np.float64)
    s = np.sort(v)
    return (
        np.searchsorted(s, v, "left") + 0.5 * (np.searchsorted(s, v, "right") - np.searchsorted(s, v, "left"))
    ) / len(v)


def rule_scores(replays: Sequence[Replay]) -> dict[str, dict[tuple[str, int], float]]:
    """Per (full copy id, turn) with a tree: the candidate rules' scores (high = alert).

    ``min_rank``: min(rank of leaves, rank of low best-branch logprob), the paper's top on both;
    ``best_logprob``: the rank of low best-branch logprob; ``at_risk``: the conversation so far,
    the mean of its trees' low-logprob ranks, averaged with the rank of a low P(end) of the turn
    before (the completion trajectory: a conversation still far from its end)."""
    keys = [(r.full.id, t) for r in replays for t, (_, lp) in sorted(r.trees.items()) if lp is not None]
    if not keys:
        return {"min_rank": {}, "best_logprob": {}, "at_risk": {}}
    trees = {(r.full.id, t): v for r in replays for t, v in r.trees.items()}
    leaves = np.array([trees[k][0] for k in keys], dtype=np.float64)
    lp_rank = _rank_low([trees[k][1] or 0.0 for k in keys])
    leaf_rank = 1.0 - _rank_low(leaves.tolist())  # many leaves ranked highest
    by_key = dict(zip(keys, lp_rank.tolist(), strict=True))
    p_ends = {(r.full.id, t): p for r in replays for t, p in r.p_end.items()}
    pend_keys = sorted(p_ends)
    pend_rank = dict(zip(pend_keys, _rank_low([p_ends[k] for k in pend_keys]).tolist(), strict=True)) if p_ends else {}
    at_risk: dict[tuple[str, int], float] = {}
    for r in replays:
        seen: list[float] = []
        for t in sorted(r.trees):
            k = (r.full.id, t)
            if k not in by_key:
                continue
            seen.append(by_key[k])
            trajectory = pend_rank.get((r.full.id, t - 1))
            mean = float(np.mean(seen))
            at_risk[k] = mean if trajectory is None else 0.5 * (mean + trajectory)
    return {
        "min_rank": dict(zip(keys, np.minimum(leaf_rank, lp_rank).tolist(), strict=True)),
        "best_logprob": by_key,
        "at_risk": at_risk,
    }


def rule_alerts(copies: Sequence[Copy], scores: Mapping[tuple[str, int], float], name: str) -> list[Recorded]:
    """The top ``RULE_RATE`` of the copies' user turns under ``scores`` (keyed by the dataset
    conversation: a cut copy's turns are its conversation's first turns, with the same trees)."""
    cands = [
        Candidate(c.id, t, c.turns - t, c.messages - c.user_positions[t - 1] - 1, s)
        for c in copies
        for t in range(1, c.turns + 1)
        if (s := scores.get((c.group, t))) is not None
    ]
    n = round(RULE_RATE * sum(c.turns for c in copies))
    return matched(cands, n, name=name)


# -- the summary -------------------------------------------------------------------------------


def summarize(
    replays: Sequence[Replay],
    alerts: Sequence[Recorded],
    other_rule: tuple[str, Sequence[Recorded]] | None = None,
    *,
    rounds: int = 1000,
    seed: int = 0,
) -> dict[str, Any]:
    """Every number of the report. ``alerts``: what the stage sent under the configured policy;
    ``other_rule``: (rule name, the uncertain-turn alerts under the other rule)."""
    copies = [r.full for r in replays] + [r.cut for r in replays if r.cut is not None]
    scores = rule_scores(replays)
    out: dict[str, Any] = {}
    for name, labels in outcomes(replays).items():
        table = Table.of(copies, labels)
        mine = [c for c in copies if c.id in labels]
        kinds = by_kind([a for a in alerts if a.copy in labels])
        if other_rule is not None:
            kinds[f"uncertain_turn ({other_rule[0]})"] = [a for a in other_rule[1] if a.copy in labels]
        rows: dict[str, Any] = {}
        curves: dict[str, Any] = {}
        for kind, recorded in kinds.items():
            row = evaluate(table, recorded, rounds=rounds, seed=seed)
            base = baselines(mine, row["alerts"], seed)
            row["baselines"] = {b: evaluate(table, alerts_b, rounds=rounds, seed=seed) for b, alerts_b in base.items()}
            row["precision_minus_length"] = gap_to_baseline(table, recorded, base["length"], rounds=rounds, seed=seed)
            rows[kind] = row
            curves[kind] = earliness(table, recorded)
            if kind == ANY:
                curves.update({f"{b} (at {ANY} rate)": earliness(table, a) for b, a in base.items()})
        rules = {
            rule: evaluate(table, rule_alerts(mine, s, rule), rounds=rounds, seed=seed) for rule, s in scores.items()
        }
        out[name] = {"alerters": rows, "earliness": curves, "rules": rules}
    return {"outcomes": out, "goals": goals(out)}


def goals(per_outcome: Mapping[str, Any]) -> dict[str, Any]:
    """The issue's goals, as measured, on STAR disconnects (abandonment): per alerter, whether its
    alert rate is at most 5 % of turns, its precision at least 3x the base rate, its median lead at
    least one user turn, and its precision interval above the length baseline's (paired)."""
    found = per_outcome.get(ABANDONMENT)
    if found is None:
        return {"outcome": ABANDONMENT, "measured": False}
    rows = {}
    for kind, row in found["alerters"].items():
        base = row["base_rate"] or 0.0
        p, lead, gap = row["precision"], row["median_lead_user_turns"], row["precision_minus_length"]["ci"]
        rows[kind] = {
            "alert_rate": row["alert_rate"],
            "rate_ok": row["alert_rate"] is not None and row["alert_rate"] <= GOAL_RATE,
            "lift": round(p / base, 2) if p is not None and base else None,
            "lift_ok": p is not None and base > 0 and p >= GOAL_LIFT * base,
            "median_lead_user_turns": lead,
            "lead_ok": lead is not None and lead >= GOAL_LEAD,
            "precision_minus_length_ci": gap,
            "above_length_ok": gap is not None and gap[0] > 0,
        }
    for r in rows.values():
        r["all_met"] = all(r[k] for k in ("rate_ok", "lift_ok", "lead_ok", "above_length_ok"))
    return {"outcome": ABANDONMENT, "measured": True, "alerters": rows}
