"""The ``helm test`` pod: its script, run as rendered against the sidecar's real HTTP server.

The pod runs the sidecar image's Python; here the same script runs with this interpreter, its
Service URL pointed at an :class:`HttpServer` serving a real registry with the stream metrics.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from sidecar.lifecycle import Health
from sidecar.telemetry.config import HttpConfig
from sidecar.telemetry.http import HttpServer
from sidecar.telemetry.stream_metrics import StreamMetrics
from tests.deploy.chart import NAMESPACE, RELEASE, one, render


class Switch:
    def __init__(self) -> None:
        self.ready = True

    def health(self) -> Health:
        return Health("kafka", self.ready, "partitions=1")


def scrape_pod(set_values: dict[str, str] | None = None) -> dict[str, Any]:
    docs = render(set_values=set_values or {})
    pod = one(docs, "Pod", f"{RELEASE}-test-scrape")
    return dict(pod)


@pytest.fixture
async def server() -> AsyncIterator[tuple[HttpServer, Switch]]:
    registry = CollectorRegistry()
    StreamMetrics(registry)
    switch = Switch()
    srv = HttpServer(HttpConfig(host="127.0.0.1", port=0), registry, [switch], core_checks=("kafka",))
    await srv.start()
    yield srv, switch
    await srv.stop()


async def run_script(pod: dict[str, Any], port: int) -> tuple[int, str]:
    (container,) = pod["spec"]["containers"]
    assert container["command"][:2] == ["python", "-c"]
    script = container["command"][2].replace(f"http://{RELEASE}.{NAMESPACE}.svc:9108", f"http://127.0.0.1:{port}")
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", script, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    out, _ = await asyncio.wait_for(proc.communicate(), 60)
    return proc.returncode or 0, out.decode()


def test_the_pod_is_a_helm_test_hook(helm: str) -> None:
    pod = scrape_pod()
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    assert pod["spec"]["restartPolicy"] == "Never"
    assert f"http://{RELEASE}.{NAMESPACE}.svc:9108" in pod["spec"]["containers"][0]["command"][2]
    assert not [d for d in render(set_values={"helmTest.enabled": "false"}) if d["kind"] == "Pod"]


async def test_passes_against_a_ready_sidecar(helm: str, server: tuple[HttpServer, Switch]) -> None:
    srv, _ = server
    code, out = await run_script(scrape_pod(), srv.port)
    assert code == 0, out
    assert "/readyz 200" in out and "sidecar_ metric families" in out


async def test_fails_while_the_sidecar_is_not_ready(helm: str, server: tuple[HttpServer, Switch]) -> None:
    srv, switch = server
    switch.ready = False
    code, out = await run_script(scrape_pod({"helmTest.timeoutSeconds": "2"}), srv.port)
    assert code != 0 and "/readyz" in out, out
