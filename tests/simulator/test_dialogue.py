"""One simulated conversation with scripted endpoints: each way it ends, what each side is shown."""

from __future__ import annotations

import itertools
import json
from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from sidecar.judge.chat import ChatMessage, ChatUnavailable
from sidecar.tools.simulator.agents import AssistantAgent, SummaryChecker, UserAgent, assistant_view, user_view
from sidecar.tools.simulator.config import SimulatorConfig
from sidecar.tools.simulator.dialogue import Dialogue, SimulatedConversation
from sidecar.tools.simulator.goals import GoalSpec
from sidecar.tools.simulator.prompts import ASSISTANT_NEXT, USER_ACCEPTED
from sidecar.transcript.model import Message, count_turns
from tests.simulator.fakes import ScriptedChat, is_check, is_user_agent

GOAL = GoalSpec("g1", "You want a table for two at an Italian restaurant in the centre at 7pm.")
SUMMARY = "Summary:\n- a table for two\n- an Italian restaurant in the centre\n- at 7pm"


def endpoint(
    assistant: list[str] | None = None,
    user: str = "A table for two, please.",
    check: str = '{"accepted": true, "feedback": ""}',
) -> ScriptedChat:
    """One endpoint for all three roles; the assistant says its lines in order, then keeps asking."""
    lines = list(assistant or [])

    def script(messages: Sequence[ChatMessage], schema: Mapping[str, Any] | None) -> str:
        if is_check(messages):
            assert schema is not None and "accepted" in schema["properties"]
            return check
        if is_user_agent(messages):
            if USER_ACCEPTED in messages[-1]["content"]:
                return "Great, thank you. Goodbye!"
            return user
        return lines.pop(0) if lines else "Which time would you like?"

    return ScriptedChat(script)


def dialogue(chat: ScriptedChat, **cfg: Any) -> Dialogue:
    config = SimulatorConfig(**cfg)
    assistant = AssistantAgent(chat, config.assistant_mode, config.assistant_system_prompt)
    return Dialogue(config, UserAgent(chat), assistant, SummaryChecker(chat))


async def run(d: Dialogue) -> tuple[SimulatedConversation, list[Message]]:
    seen: list[Message] = []

    async def on_message(m: Message) -> None:
        seen.append(m)

    conv = await d.run(GOAL, "sim-1", on_message)
    return conv, seen


async def test_turn_limit_holds() -> None:
    for limit in (1, 3, 7):
        conv, seen = await run(dialogue(endpoint(), max_turns=limit))
        assert conv.end_reason == "turn_limit" and conv.turns == limit == count_turns(seen)
        assert seen == conv.messages and seen[0].role == "assistant" and seen[-1].role == "assistant"
        roles = [m.role for m in seen]
        assert all(a != b for a, b in itertools.pairwise(roles))  # strictly alternating
        assert conv.summary is None and conv.rouge() is None


async def test_an_accepted_summary_ends_with_the_users_goodbye() -> None:
    chat = endpoint(["Hello! What would you like to do?", "How many people?", SUMMARY])
    conv, seen = await run(dialogue(chat, max_turns=10))
    assert conv.end_reason == "accepted" and conv.summary_accepted and conv.summary == SUMMARY
    assert seen[-1] == Message("user", "Great, thank you. Goodbye!") and conv.turns == 3
    assert conv.checks == 1 and conv.invalid_checks == 0
    scores = conv.rouge()
    assert scores is not None and 0 < scores["rouge1"]["fmeasure"] < 1
    record = conv.record()
    assert record["meta"]["end_reason"] == "accepted" and record["meta"]["final_summary"] == SUMMARY
    assert record["meta"]["cost"]["checker"]["calls"] == 1 and record["turns"][-1]["role"] == "user"
    assert json.loads(json.dumps(record)) == record


async def test_a_rejected_summary_passes_the_feedback_to_the_user() -> None:
    chat = endpoint(["Hi!", SUMMARY], check='{"accepted": false, "feedback": "The time is missing."}')
    conv, _ = await run(dialogue(chat, max_turns=3))
    assert conv.end_reason == "turn_limit" and not conv.summary_accepted and conv.summary == SUMMARY
    user_requests = [r for r, _ in chat.requests if is_user_agent(r)]
    assert "The time is missing." in user_requests[1][-1]["content"]
    assert "The time is missing." in user_requests[2][3]["content"]  # kept in the history afterwards


async def test_a_malformed_check_is_counted_and_not_an_acceptance() -> None:
    conv, _ = await run(dialogue(endpoint(["Hi!", SUMMARY], check="yes looks fine"), max_turns=3))
    assert conv.invalid_checks == 1 and not conv.summary_accepted and conv.end_reason == "turn_limit"


async def test_the_user_saying_goodbye_ends_it() -> None:
    conv, seen = await run(dialogue(endpoint(user="No thanks, bye."), max_turns=10))
    assert conv.end_reason == "goodbye" and conv.turns == 1 and seen[-1].role == "user"


async def test_an_endpoint_failure_ends_it_with_what_was_said() -> None:
    calls = {"n": 0}

    def script(messages: Sequence[ChatMessage], schema: Mapping[str, Any] | None) -> str:
        calls["n"] += 1
        if calls["n"] == 4:
            raise ChatUnavailable("down")
        return "Hello?"

    conv, seen = await run(dialogue(ScriptedChat(script), max_turns=10))
    assert conv.end_reason == "error" and conv.error == "ChatUnavailable" and len(seen) == 3 == len(conv.messages)


async def test_the_user_may_speak_first() -> None:
    conv, seen = await run(dialogue(endpoint(), max_turns=2, first_speaker="user"))
    assert seen[0].role == "user" and conv.turns == 2 and len(seen) == 4


def test_the_user_agent_sees_its_goal_and_the_injected_instructions_kept() -> None:
    history = [Message("assistant", "Hi, what do you need?"), Message("user", "A table."),
               Message("assistant", "For how many?")]  # fmt: skip
    chat = user_view("secret </goal> goal", history, ["INSTRUCTION: A"], "INSTRUCTION: B")
    assert [m["role"] for m in chat] == ["system", "user", "assistant", "user"]
    assert chat[0]["content"].count("</goal>") == 1 and '"secret \\u003c/goal\\u003e goal"' in chat[0]["content"]
    assert chat[1]["content"] == "Hi, what do you need?\n\n(INSTRUCTION: A)"
    assert chat[2]["content"] == "A table." and chat[3]["content"] == "For how many?\n\n(INSTRUCTION: B)"


@pytest.mark.parametrize("mode", ["builtin", "external"])
def test_the_assistant_sees_the_conversation_from_its_side(mode: str) -> None:
    history = [Message("assistant", "Hello"), Message("user", "A table.")]
    chat = assistant_view(history, mode, "")  # type: ignore[arg-type]
    if mode == "builtin":
        assert chat[0]["role"] == "system" and chat[2]["content"] == f"A table.\n\n({ASSISTANT_NEXT})"
    else:
        assert chat == [{"role": "assistant", "content": "Hello"}, {"role": "user", "content": "A table."}]
    assert assistant_view(history, "external", "Be brief.")[0] == {"role": "system", "content": "Be brief."}


def test_summary_and_goodbye_detection() -> None:
    d = dialogue(endpoint())
    assert d.is_summary("Let me summarize:\n- a\n- b") and d.is_summary("====\n- a\n====")
    assert not d.is_summary("What would you like to do?")
    assert d.is_goodbye("Thanks, goodbye!") and d.is_goodbye("Bye") and d.is_goodbye("good-bye")
    assert not d.is_goodbye("I want to buy a bycycle")
