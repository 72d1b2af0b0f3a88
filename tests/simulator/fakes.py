"""Scripted chat endpoints for the simulator's unit tests (the real server is tested elsewhere)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from sidecar.judge.chat import ChatMessage, ChatReply

Script = Callable[[Sequence[ChatMessage], Mapping[str, Any] | None], str]


class ScriptedChat:
    """Answers with ``script(messages, schema)``; a raised exception propagates. Records requests."""

    def __init__(self, script: Script, prompt_tokens: int = 50, completion_tokens: int = 5) -> None:
        self.script = script
        self.prompt_tokens = prompt_tokens
        self.completion_tokens = completion_tokens
        self.requests: list[tuple[list[dict[str, str]], Mapping[str, Any] | None]] = []

    async def chat(
        self, messages: Sequence[ChatMessage], *, schema: Mapping[str, Any] | None = None, name: str = "answer"
    ) -> ChatReply:
        self.requests.append(([dict(m) for m in messages], schema))
        await asyncio.sleep(0)  # a real request yields to other conversations
        return ChatReply(self.script(messages, schema), self.prompt_tokens, self.completion_tokens, "stop")


def is_check(messages: Sequence[ChatMessage]) -> bool:
    return "<summary>" in messages[-1]["content"]


def is_user_agent(messages: Sequence[ChatMessage]) -> bool:
    return messages[0]["role"] == "system" and "<goal>" in messages[0]["content"]
