from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from sidecar.otel.config import OtelConfig
from sidecar.otel.ingest import OtelIngest
from sidecar.otel.metrics import OtelMetrics


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()


@pytest.fixture
def ingest(registry: CollectorRegistry) -> OtelIngest:
    # Decides at once: the waits for a late parent, for earlier calls and for content as log records
    # are tested on their own (test_late_parent, test_backlog, test_logs).
    config = OtelConfig(hold={"parent_seconds": 0, "logs_seconds": 0})
    return OtelIngest(config, OtelMetrics(registry), max_event_bytes=1 << 20)


def refused(registry: CollectorRegistry, reason: str, door: str = "test") -> float:
    return registry.get_sample_value("sidecar_otel_refused_total", {"door": door, "reason": reason}) or 0.0
