"""The escalation stage with recording sinks: which effects alert, delivery through outages,
rejections, rate limits, text gating, payloads valid against the published schema."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from prometheus_client import CollectorRegistry

from sidecar.alerting.alert import Alert, alert_id
from sidecar.alerting.config import AlertingConfig
from sidecar.alerting.escalation import Escalations
from sidecar.alerting.metrics import AlertMetrics
from sidecar.alerting.sinks.base import AlertDeliveryError, AlertRejected
from sidecar.contract import CompletionScored, Effect, GoalAssigned, TreeScored, TurnContext
from sidecar.lifecycle import Health
from sidecar.telemetry.labels import AgentLabels
from sidecar.transcript.model import Message

SCHEMA = json.loads((Path(__file__).resolve().parents[2] / "sidecar" / "schemas" / "alert-v1.schema.json").read_text())
USER = Message("user", "help")
BOT = Message("assistant", "sure")


class RecordingSink:
    def __init__(self, name: str = "rec", fail_times: int = 0, reject: bool = False) -> None:
        self.name = name
        self.fail_times = fail_times
        self.reject = reject
        self.sent: list[Alert] = []
        self.attempts = 0

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def send(self, alert: Alert) -> None:
        self.attempts += 1
        if self.reject:
            raise AlertRejected("http_400")
        if self.attempts <= self.fail_times:
            raise AlertDeliveryError("connection_refused")
        self.sent.append(alert)

    def health(self) -> Health:
        return Health(self.name, True)


def cfg(**over: Any) -> AlertingConfig:
    base: dict[str, Any] = {
        "enabled": True,
        "policy": {"uncertainty": {"target_rate": 0.1, "window_trees": 50, "min_trees": 20}},
        "retry": {"initial_backoff_seconds": 0.01, "max_backoff_seconds": 0.02},
    }
    base.update(over)
    return AlertingConfig.model_validate(base)


def make(config: AlertingConfig, *sinks: RecordingSink) -> tuple[Escalations, CollectorRegistry]:
    registry = CollectorRegistry()
    esc = Escalations(config, sinks, AlertMetrics(registry), group="g", agent_label=AgentLabels())
    return esc, registry


def tree_effect(cid: str, leaves: int, lp: float, turn: int = 1) -> Effect:
    ctx = TurnContext("user_message", cid, turn, (USER,), "booking", "acme", triggered_at_unix=time.time() - 1)
    tree = TreeScored(leaves, 1, lp, lp / 10, 40, None, "base", best_branch="I will book it")
    return Effect(ctx, (tree,), {"leaves": leaves})


def end_effect(cid: str, *, complete: bool, end_reason: str = "end_event", last: Message = BOT) -> Effect:
    ctx = TurnContext(
        "conversation_ended",
        cid,
        2,
        (USER, BOT, USER, last),
        "booking",
        None,
        end_reason=end_reason,
        triggered_at_unix=time.time(),
    )  # type: ignore[arg-type]
    final = CompletionScored(0.1 if not complete else 0.9, complete, "adapter", "completion", True, "pay the bill")
    return Effect(ctx, (final, GoalAssigned("ab12-g3")), {"complete": complete})


async def settle(result: Any) -> None:
    if result is not None:
        await asyncio.wait_for(result, 10)


async def warm(esc: Escalations, *sinks: RecordingSink, n: int = 40) -> None:
    """Fill the agent's window (some of these trees are flagged too: the target rate)."""
    for i in range(n):
        await settle(esc.offer(tree_effect(f"w{i}", 1 + i % 3, -5.0 - i % 7)))
    for sink in sinks:
        sink.sent.clear()


def flagged(registry: CollectorRegistry) -> float:
    return registry.get_sample_value("sidecar_uncertain_turns_total", {"agent": "booking"}) or 0.0


async def test_uncertain_turn_alert_is_valid_and_stable() -> None:
    sink = RecordingSink()
    esc, registry = make(cfg(tree_view_base_url="https://sidecar.example/"), sink)
    await warm(esc, sink)
    before = (
        flagged(registry),
        registry.get_sample_value(
            "sidecar_alerts_total", {"kind": "uncertain_turn", "sink": "rec", "outcome": "delivered"}
        )
        or 0.0,
    )
    await settle(esc.offer(tree_effect("hot", 40, -80.0)))
    [alert] = sink.sent
    payload = alert.payload()
    jsonschema.validate(payload, SCHEMA)
    assert payload["kind"] == "uncertain_turn" and payload["severity"] == "warning"
    assert payload["id"] == alert_id("g", "hot", 1, "uncertain_turn")
    assert payload["tree_url"] == f"https://sidecar.example/trees/{payload['id']}"
    assert payload["details"]["leaves"] == 40 and "text" not in payload  # no text unless allowed
    assert flagged(registry) == before[0] + 1
    assert (
        registry.get_sample_value(
            "sidecar_alerts_total", {"kind": "uncertain_turn", "sink": "rec", "outcome": "delivered"}
        )
        == before[1] + 1
    )
    latency = registry.get_sample_value(
        "sidecar_escalation_latency_seconds_count", {"kind": "uncertain_turn", "sink": "rec"}
    )
    assert latency == before[1] + 1


async def test_incomplete_and_stalled_endings() -> None:
    sink = RecordingSink()
    esc, _ = make(cfg(include_text=True), sink)
    await settle(esc.offer(end_effect("done", complete=True)))
    await settle(esc.offer(end_effect("left", complete=False)))
    await settle(esc.offer(end_effect("ghosted", complete=False, end_reason="idle_ttl", last=USER)))
    kinds = sorted((a.conversation_id, a.kind) for a in sink.sent)
    assert kinds == [
        ("ghosted", "conversation_incomplete"),
        ("ghosted", "conversation_stalled"),
        ("left", "conversation_incomplete"),
    ]
    left = next(a for a in sink.sent if a.conversation_id == "left")
    assert left.text == {"remaining_tasks": "pay the bill"} and left.goal == "ab12-g3"
    for a in sink.sent:
        jsonschema.validate(a.payload(), SCHEMA)


async def test_an_outage_keeps_the_effect_pending_until_the_sink_accepts() -> None:
    flaky = RecordingSink("flaky", fail_times=5)
    esc, registry = make(cfg(), flaky)
    waiting = esc.offer(end_effect("c", complete=False))
    assert waiting is not None
    await settle(waiting)
    assert flaky.attempts == 6 and len(flaky.sent) == 1
    assert registry.get_sample_value("sidecar_alert_delivery_retries_total", {"sink": "flaky"}) == 5
    assert registry.get_sample_value("sidecar_alert_sink_up", {"sink": "flaky"}) == 1


async def test_a_rejected_alert_is_counted_and_the_others_still_go_out() -> None:
    bad, good = RecordingSink("bad", reject=True), RecordingSink("good")
    esc, registry = make(cfg(), bad, good)
    await settle(esc.offer(end_effect("c", complete=False)))
    assert len(good.sent) == 1 and bad.sent == []
    assert (
        registry.get_sample_value(
            "sidecar_alerts_total", {"kind": "conversation_incomplete", "sink": "bad", "outcome": "rejected"}
        )
        == 1
    )


async def test_cancellation_propagates_out_of_a_waiting_delivery() -> None:
    down = RecordingSink("down", fail_times=10**9)
    esc, _ = make(cfg(), down)
    waiting = asyncio.ensure_future(esc.offer(end_effect("c", complete=False)))  # type: ignore[arg-type]
    await asyncio.sleep(0.1)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting


async def test_rate_limit_suppresses_and_counts() -> None:
    sink = RecordingSink()
    esc, registry = make(cfg(policy={"max_alerts_per_minute": 3}), sink)
    for i in range(5):
        await settle(esc.offer(end_effect(f"c{i}", complete=False)))
    assert len(sink.sent) == 3
    assert (
        registry.get_sample_value(
            "sidecar_alerts_suppressed_total", {"kind": "conversation_incomplete", "reason": "rate_limit"}
        )
        == 2
    )


async def test_disabled_alerting_still_judges_turns_but_sends_nothing() -> None:
    sink = RecordingSink()
    esc, registry = make(cfg(enabled=False), sink)
    await warm(esc)
    before = flagged(registry)
    assert esc.offer(tree_effect("hot", 40, -80.0)) is None
    assert sink.sent == []
    assert flagged(registry) == before + 1
    assert esc.health().ready


async def test_per_agent_policy_and_kinds_switched_off() -> None:
    sink = RecordingSink()
    esc, _ = make(cfg(agents={"booking": {"conversation_incomplete": False}}), sink)
    assert esc.offer(end_effect("c", complete=False)) is None
    assert sink.sent == []


def test_non_finite_details_become_null_in_the_payload() -> None:
    a = Alert(
        "0" * 32,
        "uncertain_turn",
        "warning",
        "c",
        1,
        "a",
        None,
        None,
        None,
        0.0,
        "s",
        details={"max_logprob": float("-inf"), "x": float("nan")},
    )
    payload = a.payload()
    assert payload["details"] == {"max_logprob": None, "x": None}
    jsonschema.validate(payload, SCHEMA)


async def test_sink_up_follows_the_sinks_own_health_at_scrape_time() -> None:
    sink = RecordingSink("rec")
    esc, registry = make(cfg(), sink)
    assert registry.get_sample_value("sidecar_alert_sink_up", {"sink": "rec"}) == 1
    sink.health = lambda: Health("rec", False, "connection refused")  # type: ignore[method-assign]
    assert registry.get_sample_value("sidecar_alert_sink_up", {"sink": "rec"}) == 0
    assert not esc.health().ready and "connection refused" in esc.health().detail
