"""Scripted chat clients for fast unit tests (the real endpoint is tested in test_vllm_judge.py)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from sidecar.judge.chat import ChatMessage, ChatReply

Answer = str | BaseException | Callable[[Sequence[ChatMessage]], str]
Script = Callable[[Sequence[ChatMessage], Mapping[str, Any] | None], str]


def accuracy_json(*items: str, explanation: str = "checked every answer") -> str:
    return json.dumps({"explanation": explanation, "incorrect_items": list(items)})


def completeness_json(*items: str, explanation: str = "checked every request") -> str:
    return json.dumps({"explanation": explanation, "missing_items": list(items)})


class FakeChatClient:
    """Answers by dimension: the prompt's wording tells which judgement is asked.

    ``accuracy`` / ``completeness`` / ``other`` are answers (text, an exception to raise, or a function
    of the request); every request is recorded with its schema."""

    def __init__(
        self,
        accuracy: Answer | None = None,
        completeness: Answer | None = None,
        other: Answer = "",
        prompt_tokens: int = 100,
        completion_tokens: int = 10,
        delay: float = 0.0,
    ) -> None:
        self.answers: dict[str, Answer] = {
            "accuracy": accuracy_json() if accuracy is None else accuracy,
            "completeness": completeness_json() if completeness is None else completeness,
            "other": other,
        }
        self.prompt_tokens = prompt_tokens
        self.completion_tokens = completion_tokens
        self.delay = delay
        self.requests: list[tuple[list[dict[str, str]], Mapping[str, Any] | None, str]] = []

    @staticmethod
    def dimension_of(messages: Sequence[ChatMessage]) -> str:
        text = messages[-1]["content"]
        if "evaluate the ACCURACY" in text:
            return "accuracy"
        if "assess the COMPLETENESS" in text:
            return "completeness"
        return "other"

    async def chat(
        self, messages: Sequence[ChatMessage], *, schema: Mapping[str, Any] | None = None, name: str = "answer"
    ) -> ChatReply:
        self.requests.append(([dict(m) for m in messages], schema, name))
        if self.delay:
            await asyncio.sleep(self.delay)
        answer = self.answers[self.dimension_of(messages)]
        if isinstance(answer, BaseException):
            raise answer
        text = answer(messages) if callable(answer) else answer
        return ChatReply(text, self.prompt_tokens, self.completion_tokens, "stop")


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
