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
    return OtelIngest(OtelConfig(), OtelMetrics(registry), max_event_bytes=1 << 20)


def refused(registry: CollectorRegistry, reason: str, door: str = "test") -> float:
    return registry.get_sample_value("sidecar_otel_refused_total", {"door": door, "reason": reason}) or 0.0
