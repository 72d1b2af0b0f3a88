"""What the brokers can do, probed once at start-up, against what the processing guarantee needs.

Kafka-compatible services differ exactly where the sidecar's guarantees rest: an idempotent
producer (``InitProducerId``), and offset commits that keep their metadata (the commit point's
``{"v", "p", "j", "f"}``, see sidecar/source/README.md). The probe asks the brokers for both
without touching the live group: the idempotent producer is started and stopped, and an offset with
a random metadata string is committed for the source topic's partition 0 in a probe group of its
own and read back.

``kafka.processing_guarantee`` says what is required:

* ``exactly_once`` needs the idempotent producer; without it the sidecar refuses to start with
  :class:`BrokerCapabilityError` (one line: the capability, the broker's answer, the setting that
  accepts less).
* ``at_least_once`` needs nothing of the two; producers are then plain ``acks=all`` producers.

Missing commit metadata is never fatal: recovery then reads each journal partition from its
beginning (correct, slower as the results topic grows); the probe says so once, and every such
recovery logs what it cost.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Final, Literal

import structlog
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.errors import KafkaConnectionError, KafkaError
from aiokafka.structs import OffsetAndMetadata

from sidecar.errors import BrokerCapabilityError, BrokerUnreachableError
from sidecar.kafka_clients import client_kwargs
from sidecar.source.config import KafkaConfig
from sidecar.telemetry.stream_metrics import StreamMetrics

log = structlog.get_logger(__name__)

Capability = Literal["idempotent_producer", "commit_metadata"]
CAPABILITIES: Final[tuple[Capability, ...]] = ("idempotent_producer", "commit_metadata")
#: What each guarantee cannot run without.
REQUIRED: Final[dict[str, tuple[Capability, ...]]] = {
    "exactly_once": ("idempotent_producer",),
    "at_least_once": (),
}
_WHAT: Final[dict[Capability, str]] = {
    "idempotent_producer": "an idempotent producer",
    "commit_metadata": "offset commits that keep their metadata",
}


@dataclass(frozen=True, slots=True)
class Probe:
    """One capability as the brokers answered: ``present`` is None when it could not be probed
    (e.g. the probe group is not authorised); ``answer`` is the broker's error or what came back."""

    capability: Capability
    present: bool | None
    answer: str


@dataclass(frozen=True, slots=True)
class BrokerCapabilities:
    """The probe's findings and the guarantee the sidecar runs with."""

    guarantee: str
    probes: tuple[Probe, ...]

    def get(self, capability: Capability) -> Probe:
        return next(p for p in self.probes if p.capability == capability)

    @property
    def missing(self) -> tuple[Capability, ...]:
        return tuple(p.capability for p in self.probes if p.present is False)

    def summary(self) -> str:
        """``/readyz`` detail: empty when everything is present, else what is missing or unknown."""
        parts = [
            f"{p.capability}={'missing' if p.present is False else 'unknown'}" for p in self.probes if not p.present
        ]
        return " ".join(parts)


def probe_group_id(cfg: KafkaConfig) -> str:
    """The probe's own group: the live group id plus a suffix, so a prefixed ACL on the live group
    id covers it, and the live group's offsets are never touched."""
    return f"{cfg.group_id}.capability-probe"


@contextlib.contextmanager
def _quiet_aiokafka() -> Iterator[None]:
    """aiokafka logs a refused InitProducerId at ERROR level on its own; the probe reports it.
    (Its loggers are children of ``aiokafka`` without levels of their own, so they inherit this.)"""
    logger = logging.getLogger("aiokafka")
    previous = logger.level
    logger.setLevel(logging.CRITICAL + 1)
    try:
        yield
    finally:
        logger.setLevel(previous)


async def _probe_idempotence(cfg: KafkaConfig) -> Probe:
    producer = AIOKafkaProducer(
        **client_kwargs(cfg, client_id=f"{cfg.client_id}-probe"), acks="all", enable_idempotence=True
    )
    try:
        with _quiet_aiokafka():
            async with asyncio.timeout(cfg.request_timeout_ms / 1000):
                await producer.start()
    except KafkaConnectionError as exc:
        raise BrokerUnreachableError(f"no Kafka broker answered at {cfg.bootstrap_servers} ({exc})") from None
    except TimeoutError:
        raise BrokerUnreachableError(
            f"no Kafka broker answered at {cfg.bootstrap_servers} within {cfg.request_timeout_ms} ms"
        ) from None
    except KafkaError as exc:
        return Probe("idempotent_producer", False, f"InitProducerId answered {type(exc).__name__}")
    finally:
        with _quiet_aiokafka():
            await producer.stop()
    return Probe("idempotent_producer", True, "ok")


async def _probe_commit_metadata(cfg: KafkaConfig) -> Probe:
    nonce = "probe-" + secrets.token_hex(8)
    consumer = AIOKafkaConsumer(
        **client_kwargs(cfg, client_id=f"{cfg.client_id}-probe"), group_id=probe_group_id(cfg), enable_auto_commit=False
    )
    tp = TopicPartition(cfg.topic, 0)
    try:
        async with asyncio.timeout(cfg.request_timeout_ms / 1000):
            await consumer.start()
            consumer.assign([tp])
            await consumer.commit({tp: OffsetAndMetadata(0, nonce)})
            committed = await consumer._coordinator.fetch_committed_offsets([tp])
    except TimeoutError:
        return Probe("commit_metadata", None, f"no answer within {cfg.request_timeout_ms} ms")
    except KafkaError as exc:
        # Not authorised for the probe group, the source topic missing: nothing learnt.
        return Probe("commit_metadata", None, type(exc).__name__)
    finally:
        await consumer.stop()
    om = committed.get(tp)
    if om is None or om.offset < 0:
        return Probe("commit_metadata", False, "the committed offset did not come back")
    if om.metadata != nonce:
        return Probe("commit_metadata", False, f"metadata came back as {om.metadata[:32]!r}")
    return Probe("commit_metadata", True, "ok")


async def probe_broker(cfg: KafkaConfig) -> BrokerCapabilities:
    """Probe the brokers; raises :class:`BrokerUnreachableError` when none answers at all."""
    idempotence = await _probe_idempotence(cfg)
    metadata = await _probe_commit_metadata(cfg)
    return BrokerCapabilities(cfg.processing_guarantee, (idempotence, metadata))


def check(found: BrokerCapabilities) -> None:
    """Raise :class:`BrokerCapabilityError` when the guarantee needs what the brokers lack;
    log the findings either way."""
    lacking = [c for c in REQUIRED[found.guarantee] if c in found.missing]
    if lacking:
        probe = found.get(lacking[0])
        raise BrokerCapabilityError(
            f"kafka.processing_guarantee=exactly_once needs {_WHAT[probe.capability]}, and the brokers refused it "
            f"({probe.answer}); set kafka.processing_guarantee: at_least_once "
            "(env SIDECAR_KAFKA__PROCESSING_GUARANTEE) to run with at-least-once results instead"
        )
    fields = {
        p.capability: ("present" if p.present else "missing" if p.present is False else "unknown") for p in found.probes
    }
    log.info("kafka.capabilities", guarantee=found.guarantee, **fields)
    if found.guarantee == "at_least_once":
        log.warning(
            "kafka.at_least_once",
            detail="results and dead-letter records can be written twice after a producer retry; "
            "hook effects and alerts still happen once (docs/guarantees.md)",
        )
    meta = found.get("commit_metadata")
    if meta.present is False:
        log.warning(
            "kafka.commit_metadata_missing",
            answer=meta.answer,
            detail="every partition assignment reads its journal partition from the beginning; "
            "recovery time grows with the results topic's retention",
        )
    elif meta.present is None:
        log.warning("kafka.commit_metadata_unknown", answer=meta.answer, detail="the probe learnt nothing")


def export(found: BrokerCapabilities, metrics: StreamMetrics) -> None:
    """``sidecar_kafka_capability`` and ``sidecar_processing_guarantee`` from the probe's findings."""
    for probe in found.probes:
        state = "present" if probe.present else "missing" if probe.present is False else "unknown"
        for s in ("present", "missing", "unknown"):
            metrics.kafka_capability.labels(probe.capability, s).set(1 if s == state else 0)
    for guarantee in REQUIRED:
        metrics.processing_guarantee.labels(guarantee).set(1 if guarantee == found.guarantee else 0)
