"""Prometheus metrics of the simulator. Labels are closed sets: ``end_reason`` (accepted, goodbye,
turn_limit, error), ``role`` (user, assistant, checker), ``kind`` (prompt, completion)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

_TURN_BUCKETS = (1, 2, 3, 5, 8, 13, 20, 30, 50, 100, 200, 500)


class SimulatorMetrics:
    """Every simulator metric, created on the registry the caller owns."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.conversations = Counter(
            "sidecar_simulator_conversations_total",
            "Simulated conversations finished, by end reason (accepted, goodbye, turn_limit, error).",
            ["end_reason"],
            registry=registry,
        )
        self.turns = Histogram(
            "sidecar_simulator_turns",
            "User turns per simulated conversation.",
            buckets=_TURN_BUCKETS,
            registry=registry,
        )
        self.events = Counter(
            "sidecar_simulator_events_total",
            "Contract-v1 events the simulator emitted (messages and conversation ends).",
            registry=registry,
        )
        self.calls = Counter(
            "sidecar_simulator_llm_calls_total",
            "Chat requests answered, by role (user, assistant, checker).",
            ["role"],
            registry=registry,
        )
        self.tokens = Counter(
            "sidecar_simulator_llm_tokens_total",
            "Tokens the endpoints reported, by role and kind (prompt, completion).",
            ["role", "kind"],
            registry=registry,
        )
        self.invalid_checks = Counter(
            "sidecar_simulator_invalid_checks_total",
            "Summary-check answers that were not valid JSON of the asked schema (the summary was not accepted).",
            registry=registry,
        )
