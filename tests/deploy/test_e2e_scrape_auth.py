"""A real Prometheus (Debian's) scrapes the sidecar's scrape listener over mutual TLS with basic
auth, from a scrape config generated here, and gets samples; the same scrape without the basic-auth
credentials fails with 401, and the sidecar counts it in ``sidecar_http_auth_failures_total``.

The sidecar side is the service's own :class:`~sidecar.telemetry.http.HttpServer`, configured the
way ``sidecar run`` configures it (a web-config file in the exporter-toolkit format), on a loop of
its own in a thread so that this test's waiting never stalls a scrape. The certificates come from
a CA made for the test with the openssl command.
"""

from __future__ import annotations

import asyncio
import http.client
import ssl
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from typing import Any

import bcrypt
import pytest
import yaml
from prometheus_client import CollectorRegistry

from sidecar.telemetry.config import HttpConfig
from sidecar.telemetry.http import HttpServer
from tests.support.monitoring import Server, start_prometheus
from tests.support.tls import Pki, make_pki

PASSWORD = "scrape-password-for-the-test"
SCRAPED_SECONDS = 30.0


class ServedInThread:
    """An HttpServer running on its own event loop in a daemon thread until stop()."""

    def __init__(self, config: HttpConfig, registry: CollectorRegistry) -> None:
        self._config = config
        self._registry = registry
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._error: BaseException | None = None
        self.port = 0
        self._thread = threading.Thread(target=asyncio.run, args=(self._main(),), daemon=True)

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        try:
            async with HttpServer(self._config, self._registry, []) as srv:
                self.port = srv.port
                self._ready.set()
                await self._stop.wait()
        except BaseException as exc:
            self._error = exc
            self._ready.set()
            raise

    def start(self) -> None:
        self._thread.start()
        assert self._ready.wait(30), "the sidecar's HTTP server did not start"
        if self._error is not None:
            raise self._error

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def sidecar(pki: Pki, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServedInThread, CollectorRegistry]]:
    root = tmp_path_factory.mktemp("sidecar")
    web_config = root / "web-config.yml"
    web_config.write_text(yaml.safe_dump({
        "tls_server_config": {
            "cert_file": str(pki.server_cert),
            "key_file": str(pki.server_key),
            "client_ca_file": str(pki.ca),
            "client_auth_type": "RequireAndVerifyClientCert",
        },
        "basic_auth_users": {"prometheus": bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=10)).decode()},
    }))  # fmt: skip
    registry = CollectorRegistry()
    config = HttpConfig.model_validate({"host": "127.0.0.1", "port": 0, "scrape": {"web_config_file": str(web_config)}})
    served = ServedInThread(config, registry)
    served.start()
    yield served, registry
    served.stop()


@pytest.fixture(scope="module")
def prometheus(
    pki: Pki, sidecar: tuple[ServedInThread, CollectorRegistry], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("prometheus")
    password_file = root / "password"
    password_file.write_text(PASSWORD)
    tls = {"ca_file": str(pki.ca), "cert_file": str(pki.client_cert), "key_file": str(pki.client_key)}
    target = {"targets": [f"127.0.0.1:{sidecar[0].port}"]}
    server = start_prometheus(root, {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s"},
        "scrape_configs": [
            {"job_name": "authenticated", "scheme": "https", "tls_config": tls,
             "basic_auth": {"username": "prometheus", "password_file": str(password_file)},
             "static_configs": [target]},
            {"job_name": "anonymous", "scheme": "https", "tls_config": tls, "static_configs": [target]},
        ],
    })  # fmt: skip
    yield server
    server.stop()


def _targets(prometheus: Server) -> dict[str, dict[str, Any]]:
    active = prometheus.get_json("/api/v1/targets?state=active")["data"]["activeTargets"]
    return {t["labels"]["job"]: t for t in active}


def test_prometheus_scrapes_over_mutual_tls_with_basic_auth(
    prometheus: Server, sidecar: tuple[ServedInThread, CollectorRegistry]
) -> None:
    _, registry = sidecar
    deadline = time.monotonic() + SCRAPED_SECONDS
    targets: dict[str, dict[str, Any]] = {}
    while time.monotonic() < deadline:
        targets = _targets(prometheus)
        if {t.get("health") for t in targets.values()} == {"up", "down"}:
            break
        time.sleep(0.5)
    assert targets["authenticated"]["health"] == "up", (targets, prometheus.log_tail())
    assert targets["anonymous"]["health"] == "down", targets
    assert "401" in targets["anonymous"]["lastError"], targets["anonymous"]
    # Samples of the sidecar's own metrics, stored from the authenticated scrape (the failure
    # counter's series exist from the start, so the first scrape already carries them).
    query = 'sidecar_http_auth_failures_total{job="authenticated",listener="scrape",reason="missing"}'
    samples: list[dict[str, Any]] = []
    while time.monotonic() < deadline and not samples:
        samples = prometheus.get_json("/api/v1/query?" + urllib.parse.urlencode({"query": query}))["data"]["result"]
        time.sleep(0.2)
    assert samples, prometheus.log_tail()
    # The anonymous scrapes were refused and counted, under the scrape listener and reason missing.
    missing = registry.get_sample_value("sidecar_http_auth_failures_total", {"listener": "scrape", "reason": "missing"})
    assert missing is not None and missing >= 1
    answered_401 = registry.get_sample_value("sidecar_http_requests_total", {"handler": "metrics", "code": "401"})
    assert answered_401 is not None and answered_401 >= 1
    # Anonymous scrapes are not attempts at a password: they never trip the failure limit.
    limited = registry.get_sample_value(
        "sidecar_http_auth_failures_total", {"listener": "scrape", "reason": "rate_limited"}
    )
    assert limited == 0


def test_without_a_client_certificate_the_handshake_fails(
    pki: Pki, sidecar: tuple[ServedInThread, CollectorRegistry]
) -> None:
    """Control for the mutual-TLS half: the same request without the client certificate never gets
    an HTTP answer, while with it (and no password) it gets the 401 Prometheus saw."""
    url = f"https://127.0.0.1:{sidecar[0].port}/metrics"
    without = ssl.create_default_context(cafile=pki.ca)
    with pytest.raises((OSError, http.client.HTTPException)) as refused:
        urllib.request.urlopen(url, timeout=5, context=without)
    assert not isinstance(refused.value, urllib.error.HTTPError), refused.value
    with pytest.raises(urllib.error.HTTPError) as unauthorized:
        urllib.request.urlopen(url, timeout=5, context=pki.client_context(with_cert=True))
    unauthorized.value.close()
    assert unauthorized.value.code == 401
    assert unauthorized.value.headers["WWW-Authenticate"] == 'Basic realm="sidecar"'
