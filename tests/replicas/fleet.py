"""Several ``sidecar run`` processes in one consumer group on Tansu: start, scrape, stop, kill.

Each :class:`Replica` is a real process with its own HTTP port; its ``/metrics`` and ``/readyz``
are read over HTTP the way Prometheus and the kubelet read them. :class:`Fleet` waits for the group
to settle (every partition owned by exactly one live replica, recovered and polling).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from sidecar.tools.ports import free_port
from tests.integration.kafka_support import SidecarProcess, http_get, write_config

# Every family with a partition label (sidecar.telemetry.stream_metrics.StreamMetrics.PER_PARTITION).
PER_PARTITION = (
    "sidecar_consumer_lag_records",
    "sidecar_commit_age_seconds",
    "sidecar_oldest_conversation_age_seconds",
)


@dataclass
class Scrape:
    """One reading of a replica's ``/metrics`` and ``/readyz``."""

    at: float
    samples: list[tuple[str, dict[str, str], float]]
    readyz: dict[str, Any]

    def value(self, name: str, **labels: str) -> float:
        return sum(v for n, lab, v in self.samples if n == name and all(lab.get(k) == x for k, x in labels.items()))

    def label_values(self, name: str, label: str) -> set[str]:
        return {lab[label] for n, lab, _ in self.samples if n == name and label in lab}

    def check(self, name: str) -> dict[str, Any]:
        return next(c for c in self.readyz["checks"] if c["name"] == name)


@dataclass
class Replica:
    name: str
    proc: SidecarProcess
    port: int
    last: Scrape | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def scrape(self) -> Scrape | None:
        """Read /metrics and /readyz; None while the process does not answer."""
        try:
            _, metrics = http_get(self.url + "/metrics")
            _, readyz = http_get(self.url + "/readyz")
        except OSError:
            return None
        samples = [
            (s.name, dict(s.labels), float(s.value))
            for family in text_string_to_metric_families(metrics)
            for s in family.samples
        ]
        self.last = Scrape(time.monotonic(), samples, json.loads(readyz))
        return self.last

    def owned(self, scrape: Scrape) -> set[int]:
        """The partitions for which this replica exports any per-partition series."""
        return {int(p) for name in PER_PARTITION for p in scrape.label_values(name, "partition")}


@dataclass
class Fleet:
    """Replicas of one configuration (a YAML written per replica: its own HTTP port)."""

    tmp: Path
    bootstrap: str
    topic: str
    partitions: int
    sections: dict[str, Any]
    argv: list[str] | None = None
    replicas: dict[str, Replica] = field(default_factory=dict)

    def start(self, name: str) -> Replica:
        port = free_port()
        sections = {**self.sections, "http": {**self.sections.get("http", {}), "port": port}}
        kafka = {"processing_guarantee": "at_least_once", "client_id": f"sidecar-{name}", **sections.pop("kafka", {})}
        cfg = write_config(self.tmp / f"{name}.yaml", self.bootstrap, self.topic, kafka=kafka, **sections)
        proc = SidecarProcess(cfg, self.tmp / f"{name}.log", self.argv)
        proc.start()
        replica = Replica(name, proc, port)
        self.replicas[name] = replica
        return replica

    def live(self) -> list[Replica]:
        return [r for r in self.replicas.values() if r.proc.alive()]

    async def settled(self, within: float = 90.0, poll_seconds: float = 0.25) -> dict[str, set[int]]:
        """Wait until every partition is owned by exactly one live replica, each recovered and
        polling, and each replica exports series for exactly the partitions it owns."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within
        last: dict[str, Any] = {}
        while loop.time() < deadline:
            owned: dict[str, set[int]] = {}
            ok = True
            for r in self.live():
                s = r.scrape()
                if s is None:
                    ok = False
                    break
                detail = s.check("kafka")["detail"]
                assigned = int(s.value("sidecar_partitions_assigned"))
                owned[r.name] = r.owned(s)
                last[r.name] = (detail, assigned, sorted(owned[r.name]))
                if "recovering=0" not in detail or "polling=True" not in detail or assigned != len(owned[r.name]):
                    ok = False
            if ok:
                every = [p for parts in owned.values() for p in parts]
                if sorted(every) == list(range(self.partitions)):
                    return owned
            await asyncio.sleep(poll_seconds)
        raise AssertionError(f"the group did not settle: {last}")

    async def wait(self, predicate: Callable[[], bool], within: float, what: str) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within
        while not predicate():
            if loop.time() > deadline:
                raise AssertionError(f"timed out waiting for {what}")
            await asyncio.sleep(0.5)

    def stop_all(self) -> None:
        for r in self.replicas.values():
            r.proc.terminate()
