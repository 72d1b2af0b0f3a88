"""The simulator's three LLM roles: the user agent (hidden goal), the assistant, the summary checker.

Each turns the conversation so far into one chat request from its own point of view and adds what
the request cost to a :class:`Cost`. Endpoint failures propagate as
:class:`~sidecar.errors.SidecarError` subclasses (the dialogue ends with ``error``); a malformed
check answer is not an error: the summary is then not accepted, and the caller counts it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass

from pydantic import ValidationError

from sidecar.judge.chat import ChatClient, ChatReply
from sidecar.tools.simulator.config import AssistantMode
from sidecar.tools.simulator.prompts import (
    ASSISTANT_NEXT,
    ASSISTANT_SYSTEM,
    MAX_FEEDBACK_CHARS,
    CheckAnswer,
    check_prompt,
    user_system,
    with_instruction,
)
from sidecar.transcript.model import Message

_WS = re.compile(r"\s+")


@dataclass(slots=True)
class Cost:
    """Chat calls made and tokens the endpoint reported."""

    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0

    def as_json(self) -> dict[str, int]:
        return {"calls": self.calls, "prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens}

    def add(self, reply: ChatReply) -> None:
        self.calls += 1
        self.prompt_tokens += reply.prompt_tokens
        self.completion_tokens += reply.completion_tokens


def user_view(
    goal: str, history: Sequence[Message], instructions: Sequence[str], next_instruction: str
) -> list[dict[str, str]]:
    """The user agent's chat: its goal as system prompt, the assistant's messages as the other party's,
    its own as its answers, and before each answer the instruction that was injected then (kept in the
    history, as the paper does). ``instructions[i]`` belongs to the i-th user message of ``history``."""
    out = [{"role": "system", "content": user_system(goal)}]
    pending: list[str] = []
    k = 0
    for m in history:
        if m.role == "assistant":
            pending.append(m.content)
        elif m.role == "user":
            instruction = instructions[k] if k < len(instructions) else ""
            out.append({"role": "user", "content": with_instruction("\n\n".join(pending), instruction)})
            out.append({"role": "assistant", "content": m.content})
            pending, k = [], k + 1
    out.append({"role": "user", "content": with_instruction("\n\n".join(pending), next_instruction)})
    return out


def assistant_view(history: Sequence[Message], mode: AssistantMode, system_prompt: str) -> list[dict[str, str]]:
    """The assistant's chat. Built-in: its system prompt and "a next message/question" after every user
    message. External (the user's own agent): the conversation as it is, plus a system prompt if set."""
    out: list[dict[str, str]] = []
    system = system_prompt or (ASSISTANT_SYSTEM if mode == "builtin" else "")
    if system:
        out.append({"role": "system", "content": system})
    for m in history:
        if m.role == "user":
            text = with_instruction(m.content, ASSISTANT_NEXT) if mode == "builtin" else m.content
            out.append({"role": "user", "content": text})
        elif m.role == "assistant":
            out.append({"role": "assistant", "content": m.content})
    return out


class UserAgent:
    """Speaks for the user who holds the hidden goal."""

    def __init__(self, client: ChatClient) -> None:
        self.client = client

    async def speak(
        self, goal: str, history: Sequence[Message], instructions: Sequence[str], instruction: str, cost: Cost
    ) -> str:
        reply = await self.client.chat(user_view(goal, history, instructions, instruction))
        cost.add(reply)
        return reply.content.strip()


class AssistantAgent:
    """The assistant under test: the built-in question-asking agent, or the user's own agent."""

    def __init__(self, client: ChatClient, mode: AssistantMode, system_prompt: str = "") -> None:
        self.client = client
        self.mode = mode
        self.system_prompt = system_prompt

    async def speak(self, history: Sequence[Message], cost: Cost) -> str:
        reply = await self.client.chat(assistant_view(history, self.mode, self.system_prompt))
        cost.add(reply)
        return reply.content.strip()


@dataclass(frozen=True, slots=True)
class CheckResult:
    """The checker's decision on one summary; ``valid`` is False when its answer was malformed."""

    accepted: bool
    feedback: str
    valid: bool


class SummaryChecker:
    """Compares a summary with the hidden goal (the paper's summary-comparison component)."""

    def __init__(self, client: ChatClient, max_answer_chars: int = 20_000) -> None:
        self.client = client
        self.max_answer_chars = max_answer_chars

    async def check(self, goal: str, summary: str, cost: Cost) -> CheckResult:
        request = [{"role": "user", "content": check_prompt(goal, summary)}]
        reply = await self.client.chat(request, schema=CheckAnswer.model_json_schema(), name="summary_check")
        cost.add(reply)
        raw = reply.content.strip()
        start, end = raw.find("{"), raw.rfind("}")
        if not raw or len(raw) > self.max_answer_chars or not 0 <= start < end:
            return CheckResult(False, "", False)
        try:
            answer = CheckAnswer.model_validate(json.loads(raw[start : end + 1]))
        except (ValueError, ValidationError, RecursionError):
            return CheckResult(False, "", False)
        return CheckResult(answer.accepted, _WS.sub(" ", answer.feedback).strip()[:MAX_FEEDBACK_CHARS], True)
