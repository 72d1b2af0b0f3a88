"""Alerts say who judged: the verdict's evaluator, version, base model and adapter in the details
(and, for an incomplete conversation, the completion rule and its threshold), valid per alert-v1."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
from prometheus_client import CollectorRegistry

from sidecar.alerting.config import AlertingConfig
from sidecar.alerting.escalation import Escalations
from sidecar.alerting.metrics import AlertMetrics
from sidecar.contract import CompletionScored, Effect, Provenance, TreeScored, TurnContext
from sidecar.telemetry.labels import AgentLabels
from sidecar.transcript.model import Message

SCHEMA = json.loads((Path(__file__).resolve().parents[2] / "sidecar" / "schemas" / "alert-v1.schema.json").read_text())
JUDGE = Provenance("llm-agent-sidecar", "1.2.3", "gemma-3-270m", "booking-lora", "route-4", "threshold", 0.3)


def escalations() -> Escalations:
    cfg = AlertingConfig.model_validate(
        {"policy": {"uncertainty": {"mode": "fixed", "min_leaves": 2}, "max_alerts_per_minute": 0}}
    )
    return Escalations(cfg, [], AlertMetrics(CollectorRegistry()), group="g", agent_label=AgentLabels())


def test_incomplete_conversation_alert_names_the_completion_rule_and_threshold() -> None:
    ctx = TurnContext("conversation_ended", "c", 3, (Message("user", "hi"),), "booking", None, end_reason="end_event")
    final = CompletionScored(0.1, False, "adapter", "booking-lora", final=True, provenance=JUDGE)
    [alert] = escalations().decide(Effect(ctx, (final,), {}))
    details = alert.payload()["details"]
    assert {k: details[k] for k in ("evaluator", "evaluator_version", "base_model", "adapter", "adapter_version")} == {
        "evaluator": "llm-agent-sidecar",
        "evaluator_version": "1.2.3",
        "base_model": "gemma-3-270m",
        "adapter": "booking-lora",
        "adapter_version": "route-4",
    }
    assert (details["rule"], details["threshold"]) == ("threshold", 0.3)
    jsonschema.validate(alert.payload(), SCHEMA)


def test_uncertain_turn_alert_keeps_its_own_rule_and_names_the_tree_model() -> None:
    ctx = TurnContext("user_message", "c", 1, (Message("user", "hi"),), "booking", None)
    tree_judge = Provenance("llm-agent-sidecar", "1.2.3", "gemma-3-270m", None, None, "response_tree", 0.1)
    tree = TreeScored(5, 5, -2.0, -0.5, 30, None, "gemma-3-270m", provenance=tree_judge)
    [alert] = escalations().decide(Effect(ctx, (tree,), {}))
    details = alert.payload()["details"]
    assert details["rule"] == "fixed" and details["threshold"] is None  # the uncertainty rule's, not the tree's
    assert (details["base_model"], details["adapter"], details["evaluator_version"]) == ("gemma-3-270m", None, "1.2.3")
    jsonschema.validate(alert.payload(), SCHEMA)


def test_verdicts_without_provenance_add_nothing() -> None:
    ctx = TurnContext("conversation_ended", "c", 3, (Message("user", "hi"),), "booking", None, end_reason="end_event")
    [alert] = escalations().decide(Effect(ctx, (CompletionScored(0.1, False, "adapter", "m", final=True),), {}))
    assert "evaluator" not in alert.payload()["details"]
