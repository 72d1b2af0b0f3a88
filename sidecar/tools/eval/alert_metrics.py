"""How good are the alerts? Per outcome and alerter: precision, recall, F1, rate, lead time, intervals.

A *copy* is one replayed conversation (a dataset conversation whole, or its cut copy); an
*alerter* is a list of alerts on copies (a kind as it left the escalation stage, a baseline, a
candidate rule). For an outcome (a label per copy, True = failed or abandoned):

* a copy is *flagged* when it has at least one alert; precision, recall and F1 are over copies
  (a person acts on a conversation); ``alert_precision`` is the share of alerts on failed copies;
* ``alerts_per_1000_turns``: alerts per 1,000 user turns of the copies;
* ``lead``: for each flagged failed copy, user turns and messages after the first alert's trigger
  until the copy's last message (an ending alert: 0); medians over those copies;
* 95 % intervals: percentiles of :func:`~sidecar.tools.classification.grouped_bootstrap` over
  dataset conversations (a conversation's full and cut copies are drawn together);
* baselines pick the same number of alerts as the alerter they are set against (:func:`matched`).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from sidecar.tools.classification import grouped_bootstrap, precision_recall_f1
from sidecar.tools.eval.replay import Copy, Recorded

EARLINESS = (0.2, 0.4, 0.6, 0.8, 1.0)
ENDINGS = frozenset({"conversation_incomplete", "conversation_stalled", "last message"})  # after the last message


@dataclass(frozen=True, slots=True)
class Table:
    """One outcome's copies as arrays (the order of ``copies``)."""

    ids: tuple[str, ...]
    groups: tuple[str, ...]
    positive: npt.NDArray[np.bool_]
    turns: npt.NDArray[np.int64]

    @classmethod
    def of(cls, copies: Sequence[Copy], labels: Mapping[str, bool]) -> Table:
        kept = [c for c in copies if c.id in labels]
        return cls(
            tuple(c.id for c in kept),
            tuple(c.group for c in kept),
            np.array([labels[c.id] for c in kept], dtype=bool),
            np.array([c.turns for c in kept], dtype=np.int64),
        )


def _unit(*parts: object) -> float:
    key = "\x00".join(str(p) for p in parts)
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big") / 2.0**64


@dataclass(frozen=True, slots=True)
class Arrays:
    flagged: npt.NDArray[np.bool_]
    alerts: npt.NDArray[np.int64]
    lead_turns: npt.NDArray[np.float64]  # first alert's lead, NaN when not flagged
    lead_messages: npt.NDArray[np.float64]


def arrays(table: Table, alerts: Sequence[Recorded], *, until: float | None = None) -> Arrays:
    """Per copy: flagged, alert count, first alert's lead. ``until``: only alerts whose trigger came
    within that fraction of the copy's user turns (an ending alert only at 1.0)."""
    index = {cid: i for i, cid in enumerate(table.ids)}
    n = len(table.ids)
    count = np.zeros(n, dtype=np.int64)
    lead_t = np.full(n, np.nan)
    lead_m = np.full(n, np.nan)
    for a in alerts:
        i = index.get(a.copy)
        if i is None:
            continue
        if until is not None and until < 1.0:
            opened = int(table.turns[i]) - a.lead_turns  # the user turn the alert came at
            if a.kind in ENDINGS or opened > math.ceil(until * table.turns[i]):
                continue
        count[i] += 1
        if (
            np.isnan(lead_t[i])
            or a.lead_turns > lead_t[i]
            or (a.lead_turns == lead_t[i] and a.lead_messages > lead_m[i])
        ):
            lead_t[i], lead_m[i] = a.lead_turns, a.lead_messages
    return Arrays(count > 0, count, lead_t, lead_m)


def _ratios(table: Table, arr: Arrays, idx: npt.NDArray[np.intp]) -> tuple[float | None, float | None, float | None]:
    pos, flag = table.positive[idx], arr.flagged[idx]
    tp = int(np.sum(pos & flag))
    return precision_recall_f1(tp, int(np.sum(~pos & flag)), int(np.sum(pos & ~flag)))


def _median_lead(table: Table, arr: Arrays, idx: npt.NDArray[np.intp], which: str = "turns") -> float | None:
    lead = (arr.lead_turns if which == "turns" else arr.lead_messages)[idx]
    hit = lead[table.positive[idx] & arr.flagged[idx]]
    return float(np.median(hit)) if hit.size else None


def _ci(values: list[float]) -> list[float] | None:
    if len(values) < 20:
        return None
    lo, hi = np.percentile(values, [2.5, 97.5])
    return [round(float(lo), 4), round(float(hi), 4)]


def _r(value: float | None, digits: int = 4) -> float | None:
    return None if value is None else round(value, digits)


def evaluate(table: Table, alerts: Sequence[Recorded], *, rounds: int = 1000, seed: int = 0) -> dict[str, Any]:
    """Every figure of one alerter on one outcome, with 95 % intervals over conversations."""
    arr = arrays(table, alerts)
    every = np.arange(len(table.ids))
    p, r, f1 = _ratios(table, arr, every)
    n_alerts = int(arr.alerts.sum())
    on_pos = int(arr.alerts[table.positive].sum())
    turns = int(table.turns.sum())

    def boot(stat: Callable[[npt.NDArray[np.intp]], float | None]) -> list[float] | None:
        return _ci(grouped_bootstrap(table.groups, stat, rounds, seed)) if rounds else None

    return {
        "copies": len(table.ids),
        "positives": int(table.positive.sum()),
        "base_rate": _r(float(table.positive.mean())) if len(table.ids) else None,
        "alerts": n_alerts,
        "turns": turns,
        "alert_rate": _r(n_alerts / turns) if turns else None,
        "alerts_per_1000_turns": _r(1000 * n_alerts / turns, 1) if turns else None,
        "flagged": int(arr.flagged.sum()),
        "precision": _r(p),
        "recall": _r(r),
        "f1": _r(f1),
        "alert_precision": _r(on_pos / n_alerts) if n_alerts else None,
        "median_lead_user_turns": _median_lead(table, arr, every),
        "median_lead_messages": _median_lead(table, arr, every, "messages"),
        "ci": {
            "precision": boot(lambda i: _ratios(table, arr, i)[0]),
            "recall": boot(lambda i: _ratios(table, arr, i)[1]),
            "f1": boot(lambda i: _ratios(table, arr, i)[2]),
            "median_lead_user_turns": boot(lambda i: _median_lead(table, arr, i)),
        },
    }


def gap_to_baseline(
    table: Table, alerts: Sequence[Recorded], baseline: Sequence[Recorded], *, rounds: int = 1000, seed: int = 0
) -> dict[str, Any]:
    """Precision of ``alerts`` minus the baseline's, paired over the same bootstrap draws."""
    a, b = arrays(table, alerts), arrays(table, baseline)

    def diff(i: npt.NDArray[np.intp]) -> float | None:
        pa, pb = _ratios(table, a, i)[0], _ratios(table, b, i)[0]
        return None if pa is None or pb is None else pa - pb

    whole = diff(np.arange(len(table.ids)))
    return {"difference": _r(whole), "ci": _ci(grouped_bootstrap(table.groups, diff, rounds, seed)) if rounds else None}


def earliness(table: Table, alerts: Sequence[Recorded]) -> list[dict[str, Any]]:
    """Precision, recall and F1 with only the alerts available after each fraction of the turns."""
    out = []
    for frac in EARLINESS:
        arr = arrays(table, alerts, until=frac)
        p, r, f1 = _ratios(table, arr, np.arange(len(table.ids)))
        out.append({"fraction": frac, "precision": _r(p), "recall": _r(r), "f1": _r(f1)})
    return out


# -- baselines and candidate rules: a score per (copy, turn), the top N alerts -----------------


@dataclass(frozen=True, slots=True)
class Candidate:
    copy: str
    turn: int
    lead_turns: int
    lead_messages: int
    score: float


def matched(candidates: Sequence[Candidate], n: int, *, name: str, seed: int = 0) -> list[Recorded]:
    """The ``n`` highest-scoring candidates as alerts (ties broken by a hash, deterministically)."""
    ranked = sorted(candidates, key=lambda c: (-c.score, _unit(seed, name, c.copy, c.turn)))
    return [Recorded(c.copy, name, c.turn, c.lead_turns, c.lead_messages) for c in ranked[: max(0, n)]]


def turn_candidates(copies: Sequence[Copy], score: Callable[[Copy, int], float | None]) -> list[Candidate]:
    """A candidate at every user message of every copy that ``score`` gives a value for."""
    out = []
    for c in copies:
        for t in range(1, c.turns + 1):
            s = score(c, t)
            if s is not None:
                out.append(Candidate(c.id, t, c.turns - t, c.messages - c.user_positions[t - 1] - 1, s))
    return out


def random_baseline(copies: Sequence[Copy], seed: int = 0) -> list[Candidate]:
    return turn_candidates(copies, lambda c, t: _unit(seed, "random", c.id, t))


def length_baseline(copies: Sequence[Copy]) -> list[Candidate]:
    """Longest conversations so far first: characters of the messages through the user message."""
    return turn_candidates(copies, lambda c, t: float(c.chars_through[t - 1]))


def last_message_baseline(copies: Sequence[Copy]) -> list[Candidate]:
    """At each copy's end: the user spoke last (unanswered) first, then an agent's closing question."""

    def score(c: Copy) -> float:
        if c.last_role == "user":
            return 2.0
        return 1.0 if c.last_role == "assistant" and c.last_text.rstrip().endswith("?") else 0.0

    return [Candidate(c.id, c.turns, 0, 0, score(c)) for c in copies]


def baselines(copies: Sequence[Copy], n: int, seed: int = 0) -> dict[str, list[Recorded]]:
    """Each baseline with ``n`` alerts on ``copies``."""
    return {
        "random": matched(random_baseline(copies, seed), n, name="random", seed=seed),
        "length": matched(length_baseline(copies), n, name="length", seed=seed),
        "last message": matched(last_message_baseline(copies), n, name="last message", seed=seed),
    }
