"""Scripted chat endpoints for the simulator's unit tests (the real server is tested elsewhere)."""

from __future__ import annotations

from collections.abc import Sequence

from sidecar.judge.chat import ChatMessage
from tests.judge.fakes import ScriptedChat

__all__ = ["ScriptedChat", "is_check", "is_user_agent"]


def is_check(messages: Sequence[ChatMessage]) -> bool:
    return "<summary>" in messages[-1]["content"]


def is_user_agent(messages: Sequence[ChatMessage]) -> bool:
    return messages[0]["role"] == "system" and "<goal>" in messages[0]["content"]
