"""The comparison table: the judge's row beside the judge-free rows, with the cost of each.

Every row is one completion-detection method on the same examples: accuracy, precision / recall /
F1 with "complete" as the positive class (the sidecar's README reports F1 that way), how many
examples it could not decide, and what it cost per conversation (chat calls, prompt and generated
tokens; "—" where a method's cost was not measured). Evaluation reports (``adapters eval``,
``sidecar eval``) can include the Markdown or the JSON form as they are.

The judge's undecided examples (a malformed or failed judgement) count as predicted incomplete,
which is what the judge's decision rule returns for them; the ``undecided`` column shows how many.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from sidecar.tools.classification import confusion, precision_recall_f1


@dataclass(frozen=True, slots=True)
class MethodRow:
    """One method's figures on one set of examples."""

    method: str
    n: int
    accuracy: float | None
    precision: float | None
    recall: float | None
    f1: float | None
    judge_free: bool = True
    undecided: int = 0
    calls_per_conversation: float | None = None
    prompt_tokens_per_conversation: float | None = None
    completion_tokens_per_conversation: float | None = None


def _ratio(num: float, den: float) -> float | None:
    return num / den if den else None


def classification_row(
    method: str,
    labels: Sequence[bool],
    predictions: Sequence[bool],
    *,
    judge_free: bool = True,
    undecided: int = 0,
    calls: float | None = None,
    prompt_tokens: float | None = None,
    completion_tokens: float | None = None,
) -> MethodRow:
    """A row from true labels and predictions (True = complete); cost totals become per-conversation."""
    c = confusion(labels, predictions)
    n, tp, tn = c.n, c.tp, c.tn
    precision, recall, f1 = precision_recall_f1(c.tp, c.fp, c.fn)
    if f1 is None and n:
        f1 = 0.0
    return MethodRow(
        method,
        n,
        _ratio(tp + tn, n),
        precision if precision is not None else (0.0 if n else None),
        recall,
        f1,
        judge_free,
        undecided,
        _ratio(calls, n) if calls is not None else None,
        _ratio(prompt_tokens, n) if prompt_tokens is not None else None,
        _ratio(completion_tokens, n) if completion_tokens is not None else None,
    )


# The method keys of an ``adapters eval`` report section (report.json: results.<dataset>.<protocol>),
# with the names its Markdown report uses.
ADAPTERS_METHODS: dict[str, str] = {
    "adapter": "LoRA adapter + end tag (judge-free)",
    "no_end_tag": "adapter trained without end tag",
    "base_only": "base model alone",
    "supervised_classifier": "supervised TF-IDF + LR (ceiling ref., uses labels)",
}


def rows_from_eval_section(
    section: Mapping[str, Any], methods: Mapping[str, str] = ADAPTERS_METHODS
) -> list[MethodRow]:
    """Judge-free rows from one section of an ``adapters eval`` report (``{method: {n, accuracy,
    complete: {precision, recall, f1}}}``); methods absent from the section are left out."""
    rows: list[MethodRow] = []
    for key, name in methods.items():
        m = section.get(key)
        if not isinstance(m, Mapping) or not isinstance(m.get("complete"), Mapping):
            continue
        c = m["complete"]
        raw_cost = m.get("cost")
        cost: Mapping[str, Any] = raw_cost if isinstance(raw_cost, Mapping) else {}
        rows.append(
            MethodRow(
                name,
                int(m.get("n", 0)),
                m.get("accuracy"),
                c.get("precision"),
                c.get("recall"),
                c.get("f1"),
                judge_free=key != "judge",
                undecided=int(m.get("undecided", 0)),
                calls_per_conversation=cost.get("calls_per_conversation"),
                prompt_tokens_per_conversation=cost.get("prompt_tokens_per_conversation"),
                completion_tokens_per_conversation=cost.get("completion_tokens_per_conversation"),
            )
        )
    return rows


def _fmt(value: float | None, digits: int = 3) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def comparison_markdown(rows: Sequence[MethodRow], title: str | None = None) -> str:
    """The rows as a Markdown table (one line per method, cost columns last)."""
    lines = [f"### {title}", ""] if title else []
    lines += [
        "| method | judge-free | n | acc | P(c) | R(c) | F1(c) | undecided | calls/conv | prompt tok/conv "
        "| gen tok/conv |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r.method} | {'yes' if r.judge_free else 'no'} | {r.n} | {_fmt(r.accuracy)} | {_fmt(r.precision)} | "
            f"{_fmt(r.recall)} | {_fmt(r.f1)} | {r.undecided} | {_fmt(r.calls_per_conversation, 2)} | "
            f"{_fmt(r.prompt_tokens_per_conversation, 1)} | {_fmt(r.completion_tokens_per_conversation, 1)} |"
        )
    return "\n".join(lines) + "\n"


def comparison_json(rows: Sequence[MethodRow]) -> list[dict[str, Any]]:
    """The rows as plain JSON objects (round-trips through :func:`json.dumps`)."""
    return [json.loads(json.dumps(asdict(r))) for r in rows]
