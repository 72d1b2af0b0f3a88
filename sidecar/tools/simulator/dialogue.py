"""One simulated conversation: the user agent and the assistant take turns until it ends.

The loop (the simulator paper's Section 3.2, with the sidecar's turn notion):

1. The assistant opens (``first_speaker: assistant``, as the paper's agent greets first), or the
   user does.
2. Before each user message: if the assistant's last message is a summary (``summary_pattern``,
   the paper's "regular expressions and predefined keywords"), the checker compares it with the
   hidden goal; the user is then told either the checker's feedback or that the summary is accepted
   and to say goodbye. Otherwise the user is told to answer shortly.
3. The conversation ends with ``accepted`` (the user's goodbye after an accepted summary),
   ``goodbye`` (the user said goodbye by itself, ``goodbye_pattern``), ``turn_limit`` (``max_turns``
   user messages were sent and the assistant answered the last one), or ``error`` (an endpoint failed
   after its retry layer; what was said so far is kept).

Every message is handed to ``on_message`` as soon as it exists, so events can stream live. The
injected instructions are never part of the conversation: only what each side said is.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import structlog

from sidecar.errors import SidecarError
from sidecar.tools.simulator.agents import AssistantAgent, Cost, SummaryChecker, UserAgent
from sidecar.tools.simulator.config import SimulatorConfig
from sidecar.tools.simulator.goals import GoalSpec
from sidecar.tools.simulator.prompts import USER_ACCEPTED, USER_ANSWER, USER_FEEDBACK, USER_OPENING
from sidecar.tools.simulator.rouge import as_json, rouge
from sidecar.transcript.model import Message, count_turns

log = structlog.get_logger()

EndReason = Literal["accepted", "goodbye", "turn_limit", "error"]
END_REASONS: tuple[EndReason, ...] = ("accepted", "goodbye", "turn_limit", "error")
ROLES = ("user", "assistant", "checker")
OnMessage = Callable[[Message], Awaitable[None]]


@dataclass(slots=True)
class SimulatedConversation:
    """What one simulation produced, what it cost, and how it ended."""

    conversation_id: str
    goal: GoalSpec
    messages: list[Message] = field(default_factory=list)
    end_reason: EndReason = "error"
    summary: str | None = None
    summary_accepted: bool = False
    checks: int = 0
    invalid_checks: int = 0
    error: str | None = None
    costs: dict[str, Cost] = field(default_factory=lambda: {r: Cost() for r in ROLES})

    @property
    def turns(self) -> int:
        return count_turns(self.messages)

    def rouge(self) -> dict[str, dict[str, float]] | None:
        """ROUGE-1/2/L of the final summary against the hidden goal (None without a summary)."""
        return as_json(rouge(self.goal.goal, self.summary)) if self.summary is not None else None

    def record(self, source: str = "simulator") -> dict[str, Any]:
        """The conversation in the datasets' JSONL schema (``sidecar judge`` and ``adapters`` read it)."""
        turns = [{"role": m.role, "content": m.content} for m in self.messages]
        return {
            "conversation_id": self.conversation_id,
            "source": source,
            "domain": self.goal.domain,
            "turns": turns,
            "meta": {
                "num_turns": len(turns),
                "num_user_turns": sum(1 for m in self.messages if m.role == "user"),
                "num_assistant_turns": sum(1 for m in self.messages if m.role == "assistant"),
                "num_tool_turns": 0,
                "success_marked_by": "meta.summary_accepted (the simulated user accepted the final summary)",
                "split_group": f"goal:{self.goal.goal_id}",  # simulations of one goal stay on one side
                "goal_id": self.goal.goal_id,
                "goal": self.goal.goal,
                "end_reason": self.end_reason,
                "error": self.error,
                "final_summary": self.summary,
                "summary_accepted": self.summary_accepted,
                "rouge": self.rouge(),
                "checks": self.checks,
                "invalid_checks": self.invalid_checks,
                "cost": {r: c.as_json() for r, c in self.costs.items()},
            },
        }


class Dialogue:
    """Runs conversations with fixed agents and rules (see the module docstring)."""

    def __init__(
        self, config: SimulatorConfig, user: UserAgent, assistant: AssistantAgent, checker: SummaryChecker
    ) -> None:
        self.config = config
        self.user = user
        self.assistant = assistant
        self.checker = checker
        self._summary = re.compile(config.summary_pattern, re.IGNORECASE | re.MULTILINE)
        self._goodbye = re.compile(config.goodbye_pattern, re.IGNORECASE)

    def is_summary(self, text: str) -> bool:
        return bool(self._summary.search(text))

    def is_goodbye(self, text: str) -> bool:
        return bool(self._goodbye.search(text))

    async def run(self, goal: GoalSpec, conversation_id: str, on_message: OnMessage) -> SimulatedConversation:
        """Simulate one conversation; never raises for an endpoint failure (``end_reason`` error)."""
        conv = SimulatedConversation(conversation_id, goal)
        try:
            await self._loop(conv, on_message)
        except SidecarError as exc:
            conv.end_reason = "error"
            conv.error = str(getattr(exc, "reason", None) or type(exc).__name__)
            log.warning("simulator.conversation_failed", error=conv.error, turns=conv.turns)
        return conv

    async def _say(
        self, conv: SimulatedConversation, role: Literal["user", "assistant"], text: str, on_message: OnMessage
    ) -> None:
        message = Message(role, text)
        conv.messages.append(message)
        await on_message(message)

    async def _loop(self, conv: SimulatedConversation, on_message: OnMessage) -> None:
        cfg = self.config
        words = cfg.max_user_words
        instructions: list[str] = []
        if cfg.first_speaker == "assistant":
            await self._say(
                conv, "assistant", await self.assistant.speak(conv.messages, conv.costs["assistant"]), on_message
            )
        while True:
            if conv.turns >= cfg.max_turns:
                conv.end_reason = "turn_limit"
                return
            instruction = USER_ANSWER.format(words=words) if conv.messages else USER_OPENING
            accepted = False
            last = conv.messages[-1] if conv.messages else None
            if last is not None and last.role == "assistant" and self.is_summary(last.content):
                conv.summary = last.content
                check = await self.checker.check(conv.goal.goal, last.content, conv.costs["checker"])
                conv.checks += 1
                conv.invalid_checks += 0 if check.valid else 1
                if check.accepted:
                    accepted = True
                    instruction = USER_ACCEPTED
                elif check.feedback:
                    instruction = USER_FEEDBACK.format(feedback=check.feedback, words=words)
            text = await self.user.speak(conv.goal.goal, conv.messages, instructions, instruction, conv.costs["user"])
            instructions.append(instruction)
            await self._say(conv, "user", text, on_message)
            if accepted:
                conv.summary_accepted = True
                conv.end_reason = "accepted"
                return
            if self.is_goodbye(text):
                conv.end_reason = "goodbye"
                return
            await self._say(
                conv, "assistant", await self.assistant.speak(conv.messages, conv.costs["assistant"]), on_message
            )
