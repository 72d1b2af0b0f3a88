"""TwoDimensionalJudge with a scripted client: both judgements, the rule, safe defaults, cost."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from sidecar.judge.chat import ChatRequestError, ChatUnavailable
from sidecar.judge.config import JudgeConfig
from sidecar.judge.judge import TwoDimensionalJudge
from sidecar.judge.metrics import JudgeMetrics
from sidecar.transcript.model import Message
from tests.judge.fakes import FakeChatClient, accuracy_json, completeness_json

CONV = [Message("user", "Book a table for two at 7pm."), Message("assistant", "Booked for 8pm.")]


def make(client: FakeChatClient, **cfg: object) -> tuple[TwoDimensionalJudge, CollectorRegistry]:
    registry = CollectorRegistry()
    return TwoDimensionalJudge(JudgeConfig(**cfg), JudgeMetrics(registry), client), registry


def sample(registry: CollectorRegistry, name: str, **labels: str) -> float:
    return registry.get_sample_value(name, labels) or 0.0


async def test_both_judgements_are_asked_separately_with_their_schemas() -> None:
    fake = FakeChatClient()
    judge, registry = make(fake)
    v = await judge.judge(CONV)
    assert v.complete and v.decided and v.label == "complete"
    names = sorted(name for _, _, name in fake.requests)
    assert names == ["judge_accuracy", "judge_completeness"]
    schemas = {name: schema for _, schema, name in fake.requests}
    assert schemas["judge_accuracy"] is not None and "incorrect_items" in schemas["judge_accuracy"]["properties"]
    assert schemas["judge_completeness"] is not None and "missing_items" in schemas["judge_completeness"]["properties"]
    assert (v.calls, v.prompt_tokens, v.completion_tokens) == (2, 200, 20)
    assert sample(registry, "sidecar_judge_calls_total", dimension="accuracy") == 1
    assert sample(registry, "sidecar_judge_prompt_tokens_total", dimension="completeness") == 100
    assert sample(registry, "sidecar_judge_conversations_total", verdict="complete") == 1


async def test_either_dimension_failing_makes_it_incomplete() -> None:
    judge, _ = make(FakeChatClient(accuracy=accuracy_json("2: booked 8pm, not 7pm")))
    v = await judge.judge(CONV)
    assert not v.complete and v.decided and v.accuracy.items == ("2: booked 8pm, not 7pm",)
    judge, _ = make(FakeChatClient(completeness=completeness_json("the confirmation number")))
    v = await judge.judge(CONV)
    assert not v.complete and v.completeness.passed is False and v.accuracy.passed is True


async def test_malformed_answers_get_the_safe_default_and_are_counted() -> None:
    judge, registry = make(FakeChatClient(accuracy="I think it is fine!", completeness='{"explanation": "e"'))
    v = await judge.judge(CONV)
    assert not v.complete and not v.decided and v.label == "undecided"
    assert v.accuracy.malformed and v.completeness.malformed
    assert (v.calls, v.prompt_tokens) == (2, 200)  # a malformed answer still cost its tokens
    for d in ("accuracy", "completeness"):
        assert sample(registry, "sidecar_judge_invalid_answers_total", dimension=d) == 1
    assert sample(registry, "sidecar_judge_conversations_total", verdict="undecided") == 1


async def test_endpoint_failures_are_outcomes_not_exceptions() -> None:
    fake = FakeChatClient(accuracy=ChatUnavailable("down"), completeness=ChatRequestError("prompt_too_long", "x"))
    judge, registry = make(fake)
    v = await judge.judge(CONV)
    assert v.accuracy.error == "unavailable" and v.completeness.error == "prompt_too_long"
    assert not v.complete and not v.decided
    assert sample(registry, "sidecar_judge_errors_total", dimension="accuracy", kind="retryable") == 1
    assert sample(registry, "sidecar_judge_errors_total", dimension="completeness", kind="permanent") == 1
    assert sample(registry, "sidecar_judge_conversations_total", verdict="error") == 1
    assert v.outcome(include_text=False)["completeness"] == {"passed": None, "items": 0, "error": "prompt_too_long"}


async def test_prompt_limits_and_agent_description_reach_the_prompt() -> None:
    fake = FakeChatClient()
    judge, _ = make(fake, agent_description="Books restaurant tables.", include_system_messages=True,
                    max_message_chars=50)  # fmt: skip
    await judge.judge([Message("system", "policy"), Message("user", "u" * 500)])
    prompt = fake.requests[0][0][0]["content"]
    assert "Books restaurant tables." in prompt and '"speaker": "system"' in prompt
    assert "[... 450 characters cut]" in prompt
