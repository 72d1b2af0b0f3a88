"""Alerts to an MQTT broker (aiomqtt): QoS 1 or 2, a persistent session, one topic per alert.

One connection task per sink keeps a session open: it connects with ``clean_start`` (MQTT 5) or
``clean_session`` (3.1.1) off, so the broker keeps the session (for ``session_expiry_seconds``
under MQTT 5) across reconnects, and reconnects with capped, jittered backoff after any loss. The
same client object is reused across reconnects, so unacknowledged publishes of the previous
connection are re-sent with their original packet ids, as the session requires.

:meth:`MqttAlertSink.send` waits, for at most ``timeout_seconds`` in all, for a connection and
for the broker's acknowledgement (PUBACK at QoS 1, PUBCOMP at QoS 2). A negative MQTT 5 reason
code is an answer too: quota and unspecified errors are retryable, the rest (not authorised,
topic name invalid, payload format invalid...) refuse the alert for good.

Topic values are encoded so that no alert can move across topic levels: ``/``, ``+``, ``#``,
``%``, ``$``, NUL and other control characters are percent-encoded (``a/b`` -> ``a%2Fb``); a
missing or empty value is ``_``.
"""

from __future__ import annotations

import asyncio
import re
import ssl
from typing import Any

import aiomqtt
import paho.mqtt.client as paho
import structlog
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode

from sidecar.alerting.alert import Alert
from sidecar.alerting.config import MqttSinkConfig, RetryConfig
from sidecar.alerting.sinks._common import DestinationHealth, encode_payload
from sidecar.alerting.sinks.base import AlertDeliveryError, AlertRejected
from sidecar.errors import ConfigError
from sidecar.lifecycle import Health
from sidecar.retry import Backoff
from sidecar.supervision import Supervised, spawn

log = structlog.get_logger(__name__)

MAX_TOPIC_VALUE_CHARS = 128
# Publishes paho holds (in flight or waiting for a connection) at most; past it a send fails fast.
MAX_QUEUED_PUBLISHES = 1000
# MQTT 5 PUBACK reason codes worth another try: unspecified (0x80), implementation specific
# (0x83), packet identifier in use (0x91), quota exceeded (0x97). Every other failure code refuses
# this alert whatever happens next (0x87 not authorised, 0x90 topic name invalid, 0x99 payload...).
RETRYABLE_REASON_CODES = frozenset({0x80, 0x83, 0x91, 0x97})
_RESERVED = frozenset("/+#%$")
_PLACEHOLDER = re.compile(r"{(agent|kind|severity|tenant)}")


def topic_value(value: str | None) -> str:
    """``value`` as one safe topic level: no separator, wildcard, ``$`` or control character."""
    if not value:
        return "_"
    out = []
    for ch in value[:MAX_TOPIC_VALUE_CHARS]:
        o = ord(ch)
        if ch in _RESERVED or o < 0x20 or 0x7F <= o <= 0x9F or 0xD800 <= o <= 0xDFFF or o in (0xFFFE, 0xFFFF):
            out.append("".join(f"%{b:02X}" for b in ch.encode("utf-8", "replace")))
        else:
            out.append(ch)
    return "".join(out)


def render_topic(template: str, alert: Alert) -> str:
    """``template`` with {agent}, {kind}, {severity} and {tenant} filled in by :func:`topic_value`."""
    values = {"agent": alert.agent, "kind": alert.kind, "severity": alert.severity, "tenant": alert.tenant}
    return _PLACEHOLDER.sub(lambda m: topic_value(values[m.group(1)]), template)


def _properties(packet_type: int) -> Properties:
    return Properties(packet_type)  # type: ignore[no-untyped-call]  # paho's constructor is unannotated


def _tls_context(cfg: MqttSinkConfig) -> ssl.SSLContext | None:
    if not cfg.tls:
        return None
    try:
        ctx = ssl.create_default_context(cafile=cfg.ca_file)
        if cfg.cert_file:
            ctx.load_cert_chain(cfg.cert_file, cfg.key_file)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"alerting.sinks.mqtt TLS files unusable: {type(exc).__name__}") from None
    return ctx


class _Client(aiomqtt.Client):
    """aiomqtt's client with the two things this sink needs that its public API lacks.

    * ``publish_acked`` returns the broker's reason code: aiomqtt's ``publish`` treats an MQTT 5
      PUBACK carrying a failure code (e.g. 0x87 not authorised) as success.
    * Re-entering after an unexpected disconnection waits for the new CONNACK: aiomqtt 2.5 keeps
      the previous connection's completed ``_connected`` future, so a reused client would count
      as connected before the broker had answered (or after it refused).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._ack_waiters: dict[int, asyncio.Future[ReasonCode]] = {}

    async def __aenter__(self) -> _Client:
        if self._connected.done():
            self._connected = asyncio.Future()
        await super().__aenter__()
        return self

    def _on_publish(
        self, client: paho.Client, userdata: Any, mid: int, reason_code: ReasonCode, properties: Properties
    ) -> None:
        fut = self._ack_waiters.pop(mid, None)
        if fut is not None and not fut.done():
            fut.set_result(reason_code)
        super()._on_publish(client, userdata, mid, reason_code, properties)

    async def publish_acked(self, topic: str, payload: bytes, qos: int, properties: Properties | None) -> ReasonCode:
        """Publish and wait (unbounded: the caller bounds it) for the acknowledgement's reason code."""
        info = self._client.publish(topic, payload, qos, False, properties)
        # NO_CONN: paho keeps the message and sends it once the connection is back.
        if info.rc not in (paho.MQTT_ERR_SUCCESS, paho.MQTT_ERR_NO_CONN):
            raise AlertDeliveryError(f"publish refused by the client: {paho.error_string(info.rc)}")
        fut: asyncio.Future[ReasonCode] = asyncio.get_running_loop().create_future()
        # No await between publish() and this line, so the acknowledgement cannot arrive first.
        self._ack_waiters[info.mid] = fut
        try:
            return await fut
        finally:
            if self._ack_waiters.get(info.mid) is fut:
                del self._ack_waiters[info.mid]


class MqttAlertSink:
    """An :class:`~sidecar.alerting.sinks.base.AlertSink` publishing alert JSON to MQTT."""

    name = "mqtt"

    def __init__(self, cfg: MqttSinkConfig, retry: RetryConfig | None = None) -> None:
        self._cfg = cfg
        self._retry = retry or RetryConfig()
        self._tls = _tls_context(cfg)
        self._v5 = cfg.protocol == "5"
        self._task: Supervised | None = None
        self._client: _Client | None = None
        self._connected = asyncio.Event()
        # Two reasons to be unready: no connection (the task's view), or publishes not acknowledged
        # although connected (a broker that accepts connections but not messages).
        self._link = DestinationHealth(self.name)
        self._link.failed("connecting")
        self._acks = DestinationHealth(self.name)

    # -- lifecycle ----------------------------------------------------------------------------

    async def start(self) -> None:
        if self._task is None:
            self._task = spawn("alert-sink-mqtt", self._run)

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is None:
            return
        # Never raises the task's own CancelledError; a cancellation of stop() propagates.
        await task.stop()
        if task.error is not None:
            log.error("alert.mqtt.task_failed", error=type(task.error).__name__)

    def _make_client(self) -> _Client:
        cfg = self._cfg
        kwargs: dict[str, Any] = {}
        if self._v5:
            props = _properties(PacketTypes.CONNECT)
            props.SessionExpiryInterval = cfg.session_expiry_seconds
            kwargs.update(protocol=aiomqtt.ProtocolVersion.V5, clean_start=False, properties=props)
        else:
            kwargs.update(protocol=aiomqtt.ProtocolVersion.V311, clean_session=False)
        return _Client(
            cfg.host,
            cfg.port,
            identifier=cfg.client_id,
            username=cfg.username,
            password=cfg.password.get_secret_value() if cfg.password is not None else None,
            keepalive=cfg.keepalive_seconds,
            timeout=cfg.timeout_seconds,
            tls_context=self._tls,
            max_queued_outgoing_messages=MAX_QUEUED_PUBLISHES,
            **kwargs,
        )

    async def _run(self) -> None:
        """Connect, hold the connection until it breaks, wait out a backoff, repeat (until cancelled)."""
        backoff = Backoff(self._retry.initial_backoff_seconds, self._retry.max_backoff_seconds)
        client = self._make_client()
        while True:
            try:
                async with client:
                    self._client = client
                    self._connected.set()
                    self._link.ok()
                    self._acks.ok()  # a timeout on the previous connection says nothing about this one
                    backoff.reset()
                    log.info("alert.mqtt.connected", host=self._cfg.host, port=self._cfg.port)
                    # Nothing is subscribed: iterating only waits for the connection to break (MqttError).
                    async for _ in client.messages:
                        pass
            except aiomqtt.MqttError as exc:
                reason = f"disconnected: {type(exc).__name__}"
                rc = getattr(exc, "rc", None)
                if rc is not None:
                    reason += f" rc={rc}"
                first = not self._link.failing
                self._link.failed(reason)
                delay = backoff.delay()
                (log.warning if first else log.debug)(
                    "alert.mqtt.disconnected", reason=reason, retry_in_seconds=round(delay, 2)
                )
            else:  # the message iterator cannot end without an error; kept for a clean reconnect
                delay = backoff.delay()
            finally:
                self._connected.clear()
            _raise_if_cancel_swallowed()
            await asyncio.sleep(delay)

    # -- delivery -----------------------------------------------------------------------------

    def _properties(self, alert: Alert) -> Properties | None:
        if not self._v5:
            return None
        props = _properties(PacketTypes.PUBLISH)
        props.PayloadFormatIndicator = 1
        props.ContentType = "application/json"
        props.UserProperty = [("alert_id", alert.id), ("kind", alert.kind), ("schema", "alert-v1")]
        return props

    async def send(self, alert: Alert) -> None:
        payload = encode_payload(alert)  # validates the alert (id, kind...) before it reaches a property
        topic = render_topic(self._cfg.topic_template, alert)
        if self._task is None:
            raise AlertDeliveryError("sink not started")
        timeout = self._cfg.timeout_seconds
        waiting_for = "connection to the broker"
        try:
            async with asyncio.timeout(timeout):
                await self._connected.wait()
                client = self._client
                assert client is not None  # set before the event
                waiting_for = "acknowledgement"
                rc = await client.publish_acked(topic, payload, self._cfg.qos, self._properties(alert))
        except TimeoutError:
            reason = f"no {waiting_for} within {timeout:g}s"
            self._acks.failed(reason)
            raise AlertDeliveryError(reason) from None
        if not rc.is_failure:
            self._acks.ok()
            return
        reason = f"broker refused the publish: {rc.getName()} (0x{rc.value:02x})"
        if rc.value in RETRYABLE_REASON_CODES:
            raise AlertDeliveryError(reason)
        raise AlertRejected(reason)

    def health(self) -> Health:
        if self._task is None:
            return Health(self.name, False, "not started")
        if self._task.done():
            return Health(self.name, False, f"connection task ended: {type(self._task.error).__name__}")
        if self._link.failing:
            return self._link.health()
        return self._acks.health(f"connected to {self._cfg.host}:{self._cfg.port}")


def _raise_if_cancel_swallowed() -> None:
    """Re-raise a cancellation that aiomqtt's connect swallowed.

    aiomqtt waits for CONNACK with ``asyncio.wait_for``; on Python 3.11 a cancel that lands as the
    broker's refusal arrives is dropped (CPython gh-86296) and ``MqttConnectError`` is raised
    instead, so the reconnect loop would run on and ``stop()`` would wait for ever. The task's
    ``cancelling()`` count still records the request.
    """
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError
