"""The Alertmanager sink against Debian's real Alertmanager (started on free ports per module), and
its status classification against an in-process transport."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import datetime
from typing import Any

import httpx
import pytest
from pydantic import SecretStr

from sidecar.alerting.alert import ALERT_KINDS, alert_id
from sidecar.alerting.config import AlertmanagerSinkConfig
from sidecar.alerting.sinks.alertmanager import AlertmanagerAlertSink
from sidecar.alerting.sinks.base import AlertDeliveryError, AlertRejected
from sidecar.tools.ports import free_port
from tests.alerting.alerts import hostile_alert, make_alert
from tests.alerting.servers import Alertmanager

RESOLVE_AFTER = 900.0


@asynccontextmanager
async def running(url: str, **overrides: Any) -> AsyncIterator[AlertmanagerAlertSink]:
    sink = AlertmanagerAlertSink(AlertmanagerSinkConfig(enabled=True, url=url, **overrides))
    await sink.start()
    try:
        yield sink
    finally:
        await sink.stop()


async def held(am: Alertmanager, aid: str) -> list[dict[str, Any]]:
    async with httpx.AsyncClient() as client:
        r = await client.get(f"{am.url}/api/v2/alerts", params={"filter": f'alert_id="{aid}"'})
    r.raise_for_status()
    alerts: list[dict[str, Any]] = r.json()
    return alerts


def _unix(iso: str) -> float:
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


async def test_labels_annotations_and_ends_at_as_mapped(alertmanager: Alertmanager) -> None:
    alert = make_alert(7, tree_url="http://sidecar.example/trees/abc")
    async with running(alertmanager.url, resolve_after_seconds=RESOLVE_AFTER) as sink:
        before = time.time()
        await sink.send(alert)
        after = time.time()
        assert sink.health().ready
    [got] = await held(alertmanager, alert.id)
    assert got["labels"] == {
        "alertname": "AgentUncertainTurn",
        "severity": "warning",
        "agent": "support-bot",
        "tenant": "acme",
        "goal": "g3",
        "conversation_id": "conv-7",
        "turn": "7",
        "alert_id": alert.id,
    }
    assert got["annotations"]["summary"] == alert.summary
    assert got["annotations"]["description"] == (
        "uncertain_turn on turn 7 of conversation conv-7 (agent support-bot): "
        "leaves=12, max_logprob=-7.31, threshold=-5, mode=fixed"
    )
    assert got["annotations"]["tree_url"] == "http://sidecar.example/trees/abc"
    assert got["generatorURL"] == "http://sidecar.example/trees/abc"
    assert got["status"]["state"] == "active"
    assert alert.triggered_at_unix is not None
    assert _unix(got["startsAt"]) == pytest.approx(alert.triggered_at_unix, abs=0.001)
    assert before + RESOLVE_AFTER - 0.001 <= _unix(got["endsAt"]) <= after + RESOLVE_AFTER + 0.001


async def test_each_kind_gets_its_alertname_and_a_resend_is_the_same_alert(alertmanager: Alertmanager) -> None:
    names = {}
    async with running(alertmanager.url) as sink:
        for kind in ALERT_KINDS:
            alert = make_alert(1, kind=kind, id=alert_id("g", "conv-k", 1, kind), tenant=None, goal=None)
            await sink.send(alert)
            await sink.send(alert)  # at-least-once: the repeat carries the same labels
            [got] = await held(alertmanager, alert.id)
            names[kind] = got["labels"]["alertname"]
            assert "tenant" not in got["labels"]
            assert "goal" not in got["labels"]
    assert names == {
        "uncertain_turn": "AgentUncertainTurn",
        "conversation_incomplete": "AgentConversationIncomplete",
        "conversation_stalled": "AgentConversationStalled",
    }


async def test_a_hostile_alert_is_accepted_bounded(alertmanager: Alertmanager) -> None:
    alert = hostile_alert(3)
    async with running(alertmanager.url) as sink:
        await sink.send(alert)
    [got] = await held(alertmanager, alert.id)
    assert got["labels"]["agent"] == "a/b/+/#/\x00/$SYS/%2F"  # values are free text for Alertmanager
    assert len(got["labels"]["conversation_id"]) <= 256
    assert len(got["annotations"]["description"]) <= 2048
    assert len(got["annotations"]["best_branch"]) <= 1024


async def test_a_request_alertmanager_refuses_is_rejected(alertmanager: Alertmanager) -> None:
    # Starting ten days from now, ending in 15 minutes: Alertmanager answers 400.
    future = make_alert(4, triggered_at_unix=None, created_at_unix=time.time() + 10 * 86_400)
    async with running(alertmanager.url, resolve_after_seconds=RESOLVE_AFTER) as sink:
        with pytest.raises(AlertRejected, match="HTTP 400"):
            await sink.send(future)
        assert sink.health().ready  # Alertmanager refused this alert, it is not down
        assert await held(alertmanager, future.id) == []


async def test_an_alert_the_sink_cannot_label_is_rejected_unsent(alertmanager: Alertmanager) -> None:
    async with running(alertmanager.url) as sink:
        with pytest.raises(AlertRejected, match="malformed alert"):
            await sink.send(make_alert(5, kind="not_a_kind"))
        with pytest.raises(AlertRejected, match="malformed alert"):
            await sink.send(make_alert(5, id='x"} or {a="'))


async def test_alertmanager_down_is_retryable_until_it_answers(alertmanager: Alertmanager) -> None:
    async with running(f"http://127.0.0.1:{free_port()}", timeout_seconds=2) as sink:
        with pytest.raises(AlertDeliveryError, match="ConnectError"):
            await sink.send(make_alert(6))
        assert not sink.health().ready
        assert "ConnectError" in sink.health().detail


async def _status_of(status: int, **overrides: Any) -> tuple[AlertmanagerAlertSink, list[httpx.Request]]:
    seen: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(status, headers={"location": "http://elsewhere/"}, content=b"x" * 1_000_000)

    cfg = AlertmanagerSinkConfig(enabled=True, url="http://am.test:9093/", **overrides)
    sink = AlertmanagerAlertSink(cfg, transport=httpx.MockTransport(answer))
    await sink.start()
    return sink, seen


@pytest.mark.parametrize(
    ("status", "error"),
    [
        (200, None),
        (202, None),
        (408, AlertDeliveryError),
        (429, AlertDeliveryError),
        (500, AlertDeliveryError),
        (503, AlertDeliveryError),
        (400, AlertRejected),
        (401, AlertRejected),
        (404, AlertRejected),
        (302, AlertRejected),
    ],
)
async def test_status_classification(status: int, error: type[Exception] | None) -> None:
    sink, seen = await _status_of(status, bearer_token=SecretStr("tok-123"))
    try:
        if error is None:
            await sink.send(make_alert())
            assert sink.health().ready
        else:
            with pytest.raises(error, match=f"HTTP {status}") as info:
                await sink.send(make_alert())
            assert "tok-123" not in str(info.value)
            assert sink.health().ready == (status == 400)
            assert "tok-123" not in sink.health().detail
        [request] = seen  # one request per send, no retry inside the sink, no redirect followed
        assert request.url == "http://am.test:9093/api/v2/alerts"
        assert request.headers["authorization"] == "Bearer tok-123"
    finally:
        await sink.stop()
