"""``adapters eval``: the paper's protocol (Section 5.2, Table 2) through a real vLLM server.

Every verdict goes through the sidecar's own code path: ``Scorers.score_adapter`` builds the
prompt with the sidecar's ``PromptBuilder`` (``prompt_truncation: tail``, the adapter's context) and
scores it with its ``CompletionScorer`` over its ``VllmClient``, so the figures are what the
sidecar sees in production, including how it reads P(end) exactly (top-k logprobs, else a forced
request, else ``prompt_logprobs``). Before any request, every prompt is checked to be the very
window the adapter was trained on (``adapters.data.tokenizer.encode_messages``, left-truncated).

A method predicts "complete" iff the greedy next token is the end tag (the paper's rule); P(end)
gives the ROC-AUC. Methods: the adapter; the same adapter trained without the end tag; the base
model alone (``--skip-base`` leaves it out); and a supervised classifier trained with the labels
(ceiling reference). Because the two ablations can never emit the end tag by construction, they are
also scored with the tag-free rule "complete iff the greedy next token does not open a new TURN
block" (``*_turn_rule``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog
from prometheus_client import CollectorRegistry
from tqdm import tqdm

from adapters.data.conversations import messages_from_json, stable_unit
from adapters.data.tokenizer import END_TAG, encode_messages, encode_plain, load_tokenizer, special_id
from adapters.evaluation.baseline import tail_text, train_classifier
from adapters.evaluation.binary import binary_metrics
from adapters.evaluation.report import write_report
from adapters.serving.manifest import file_sha256, message_cap, recorded_command, write_manifest
from adapters.serving.vllm_server import VllmServer
from sidecar.scoring.completion import CompletionScorer
from sidecar.scoring.config import ScoringConfig
from sidecar.scoring.scorers import Scorers
from sidecar.transcript.model import Message

log = structlog.get_logger()

LABEL_SETS = (("protocol", "test.jsonl"), ("real", "test_real.jsonl"))
CONCURRENCY = 4


class PromptMismatchError(RuntimeError):
    """The sidecar would send a prompt other than the window the adapter was trained on."""


def load_examples(path: Path, limit: int | None) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    out = [json.loads(line) for line in path.read_text().split("\n") if line.strip()]
    if limit is None:
        return out
    # Label-blind subset; a conversation's full and truncated copies stay together (stable sort).
    return sorted(out, key=lambda e: stable_unit(e["conversation_id"], "eval-subset"))[:limit]


def sidecar_config(
    base_url: str, base: Path, max_context_tokens: int, max_message_tokens: int | None = None
) -> ScoringConfig:
    """The scoring config the demo runs the bundled adapter with, pointed at ``base_url``."""
    return ScoringConfig.model_validate(
        {
            "enabled": True,
            "vllm": {"base_url": base_url, "base_model": "base", "max_concurrency": CONCURRENCY},
            "tokenizer": {"model_dir": str(base)},
            "max_prompt_tokens": max_context_tokens,
            "max_message_tokens": max_message_tokens,
            "prompt_truncation": "tail",
            "completion": {"max_remaining_tokens": 1},
        }
    )


@dataclass(frozen=True, slots=True)
class Verdict:
    """One example as the sidecar scores it, plus P(TURN) for the tag-free rule of the ablations."""

    complete: bool
    p_end: float
    p_end_method: str
    greedy_is_turn: bool | None = None
    p_turn: float | None = None


class SidecarScoring:
    """The sidecar's completion path (scorers: prompt builder, client, scorer) over one vLLM server."""

    def __init__(self, config: ScoringConfig, turn_id: int) -> None:
        self.scorers = Scorers.from_config(config, CollectorRegistry())
        # P(next token = TURN) read the same exact way, for the tag-free rule.
        self._turn = CompletionScorer(
            self.scorers.client,
            end_ids=[turn_id],
            stop_token_ids=[turn_id],
            max_remaining_tokens=1,
            decode=self.scorers.tokenizer.decode,
        )

    def prompt(self, messages: Sequence[Message]) -> list[int]:
        return self.scorers.prompts.completion_adapter(messages)[0]

    async def verdict(self, messages: Sequence[Message], model: str, *, turn_rule: bool) -> Verdict:
        v = await self.scorers.score_adapter(messages, model)
        if not turn_rule:
            return Verdict(v.complete, v.p_end, v.p_end_method)
        t = await self._turn.score(model, self.prompt(messages))
        return Verdict(v.complete, v.p_end, v.p_end_method, t.complete, t.p_end)

    async def score_all(
        self, examples: Sequence[Sequence[Message]], model: str, *, turn_rule: bool, desc: str
    ) -> list[Verdict]:
        bar = tqdm(total=len(examples), desc=desc, unit="ex", leave=False)

        async def one(msgs: Sequence[Message]) -> Verdict:
            out = await self.verdict(msgs, model, turn_rule=turn_rule)
            bar.update(1)
            return out

        try:
            return list(await asyncio.gather(*(one(m) for m in examples)))
        finally:
            bar.close()


def check_prompts(
    scoring: SidecarScoring,
    tok: Any,
    examples: Sequence[Sequence[Message]],
    window: int,
    max_message_tokens: int | None = None,
) -> None:
    """Raise unless the sidecar's prompt is the training window (ids of the rendering, last ``window``)."""
    for i, msgs in enumerate(examples):
        if scoring.prompt(msgs) != encode_messages(tok, msgs, max_message_tokens)[-window:]:
            raise PromptMismatchError(f"example {i}: the sidecar's prompt differs from the training window")


def run_eval(args: argparse.Namespace) -> dict[str, Any]:
    return asyncio.run(_run_eval(args))


async def _run_eval(args: argparse.Namespace) -> dict[str, Any]:
    t0 = time.monotonic()
    tok = load_tokenizer(args.base)
    end_id = special_id(tok, END_TAG)
    turn_id = encode_plain(tok, "TURN 1, STEP 1, user chat:\n")[0]
    models = {"adapter": "completion"} if args.skip_base else {"adapter": "completion", "base_only": "base"}
    loras = {"completion": args.adapter}
    if args.adapter_no_end_tag is not None:
        models["no_end_tag"] = "completion_noend"
        loras["completion_noend"] = args.adapter_no_end_tag
    clf, clf_n = train_classifier(args.data, args.datasets, seed=0)
    results: dict[str, Any] = {}
    hist: dict[str, dict[str, list[float]]] = {}
    out_dir: Path = args.out
    methods_used: Counter[str] = Counter()
    server = VllmServer(args.base, loras, out_dir / "vllm.log", port=args.port)
    with server:
        cap = message_cap(args.adapter)
        scoring = SidecarScoring(
            sidecar_config(f"{server.base_url}/v1", args.base, args.max_context_tokens, cap), turn_id
        )
        await scoring.scorers.start()
        try:
            for name in args.datasets:
                for set_name, fname in LABEL_SETS:
                    exs = load_examples(args.data / name / fname, args.max_examples)
                    if not exs:
                        continue
                    msgs = [messages_from_json(e["messages"]) for e in exs]
                    check_prompts(scoring, tok, msgs, args.max_context_tokens, cap)
                    labels = [bool(e["complete"]) for e in exs]
                    res: dict[str, Any] = {"label_source": exs[0]["label_source"]}
                    for method, served in models.items():
                        outs = await scoring.score_all(
                            msgs, served, turn_rule=method != "adapter", desc=f"{name}/{set_name}/{method}"
                        )
                        methods_used.update(o.p_end_method for o in outs)
                        p_end = [o.p_end for o in outs]
                        res[method] = binary_metrics(labels, [o.complete for o in outs], p_end)
                        if method != "adapter":
                            res[f"{method}_turn_rule"] = binary_metrics(
                                labels, [not o.greedy_is_turn for o in outs], [1 - (o.p_turn or 0.0) for o in outs]
                            )
                        else:
                            hist[f"{name}/{set_name}"] = {
                                "complete": [p for p, y in zip(p_end, labels, strict=True) if y],
                                "incomplete": [p for p, y in zip(p_end, labels, strict=True) if not y],
                            }
                    proba = clf.predict_proba([tail_text(m) for m in msgs])[:, 1]
                    res["supervised_classifier"] = binary_metrics(labels, [p >= 0.5 for p in proba], list(proba))
                    results.setdefault(name, {})[set_name] = res
                    log.info(
                        "adapters.eval.done", dataset=name, set=set_name, f1_complete=res["adapter"]["complete"]["f1"]
                    )
        finally:
            await scoring.scorers.stop()
    wall = round(time.monotonic() - t0, 1)
    command = args.command_line or recorded_command("adapters", getattr(args, "argv", None))
    meta = {
        "command": command,
        "wall_seconds": wall,
        "max_context_tokens": args.max_context_tokens,
        "max_message_tokens": message_cap(args.adapter),
        "end_tag_id": end_id,
        "turn_token_id": turn_id,
        "classifier_train_examples": clf_n,
        "scored_by": "sidecar.scoring.scorers.Scorers.score_adapter (prompt_truncation: tail)",
        "methods": [*models, "supervised_classifier"],
        "p_end_methods": dict(methods_used),
        "adapter_sha256": file_sha256(args.adapter / "adapter_model.safetensors"),
        "base_sha256": file_sha256(args.base / "model.safetensors"),
        "prepared_manifest_sha256": file_sha256(args.data / "manifest.json"),
    }
    write_report(out_dir, results, hist, meta)
    write_manifest(out_dir, "evaluation-report", **meta)
    return {
        "wall_seconds": wall,
        "f1_complete": {d: {s: r[s]["adapter"]["complete"]["f1"] for s in r} for d, r in results.items()},
    }
