"""Replay dataset conversations as Kafka events of contract v1.

Three pieces, usable on their own (the kill test and the benchmark reuse the first two):

* :func:`conversation_events`: one dataset record -> its events (pure, deterministic);
* :func:`interleave`: many conversations -> one stream in which up to ``concurrency``
  conversations are open at once, each conversation's events in order (pure given the seed);
* :func:`produce`: write events to a topic with aiokafka at a bounded rate.

Dataset records follow the shared JSONL schema: ``conversation_id``, ``source``, ``turns`` of
``{role, content, tool_calls?, name?}``. :func:`load_jsonl_gz` reads them with
:mod:`sidecar.transcript.dataset` in strict mode: the first malformed line is an error naming it.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from importlib import resources
from pathlib import Path
from typing import Any, Final

from aiokafka import AIOKafkaProducer

from sidecar.errors import SidecarError
from sidecar.kafka_clients import plaintext_client_kwargs
from sidecar.transcript.dataset import DatasetError, ReadStats, read_conversations, record_json

Event = dict[str, Any]
ProgressFn = Callable[[int], None]

# Fixed namespace: event ids are a pure function of (conversation_id, seq), so a replay of the same
# conversation produces the same ids and the sidecar recognises duplicates.
EVENT_ID_NAMESPACE: Final = uuid.UUID("5f0c7e52-3c1e-4bb0-9d7a-0c6a51d1f1a7")
SAMPLE_RESOURCE: Final = ("sidecar.tools.demo", "data/sample.jsonl.gz")
_AGENT_OK: Final = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.:-")


class SampleError(SidecarError):
    """A conversations file cannot be read or a record does not follow the dataset schema."""


def event_id(conversation_id: str, seq: int) -> str:
    """The deterministic idempotency key of event ``seq`` of a conversation."""
    return str(uuid.uuid5(EVENT_ID_NAMESPACE, f"{conversation_id}\x1f{seq}"))


def agent_tag(source: str) -> str:
    """A dataset tag made valid for the event's ``agent`` field (``[A-Za-z0-9_.:-]{1,64}``)."""
    tag = "".join(c if c in _AGENT_OK else "_" for c in source)[:64]
    return tag or "unknown"


def _message(turn: Mapping[str, Any]) -> dict[str, Any]:
    msg: dict[str, Any] = {"role": turn["role"], "content": turn["content"]}
    if turn.get("name"):
        msg["name"] = turn["name"]
    if turn.get("tool_calls"):
        msg["tool_calls"] = [dict(c) for c in turn["tool_calls"]]
    return msg


def conversation_events(
    record: Mapping[str, Any],
    *,
    agent: str | None = None,
    tenant: str | None = "demo",
    start_ts: float = 0.0,
    seconds_per_event: float = 1.0,
    conversation_id: str | None = None,
    end: bool = True,
) -> list[Event]:
    """The events of one conversation: one ``message`` per turn, then ``conversation_end``.

    ``seq`` runs from 0; ``event_id`` is :func:`event_id`; ``ts`` is ``start_ts +
    seq * seconds_per_event`` (Unix seconds); ``agent`` defaults to the record's dataset tag.
    ``conversation_id`` overrides the record's id (replaying the same conversation again as a new
    one); ``end=False`` leaves the conversation open (it then ends by idle timeout).
    """
    cid = conversation_id if conversation_id is not None else record["conversation_id"]
    agent_name = agent if agent is not None else agent_tag(str(record.get("source") or "unknown"))
    events: list[Event] = []
    for seq, turn in enumerate(record["turns"]):
        events.append(
            {
                "v": 1,
                "conversation_id": cid,
                "event_id": event_id(cid, seq),
                "seq": seq,
                "ts": start_ts + seq * seconds_per_event,
                "type": "message",
                "message": _message(turn),
                "agent": agent_name,
                "tenant": tenant,
            }
        )
    if end:
        seq = len(events)
        events.append(
            {
                "v": 1,
                "conversation_id": cid,
                "event_id": event_id(cid, seq),
                "seq": seq,
                "ts": start_ts + seq * seconds_per_event,
                "type": "conversation_end",
                "agent": agent_name,
                "tenant": tenant,
            }
        )
    return events


def interleave(conversations: Iterable[Sequence[Event]], *, concurrency: int, seed: int | None = 0) -> Iterator[Event]:
    """Merge conversations into one stream, ``concurrency`` of them open at any moment.

    Each step picks one open conversation uniformly at random and emits its next event; a finished
    conversation's slot goes to the next one from ``conversations``, which is consumed lazily (it
    may be infinite). Guarantees: every event is emitted exactly once; each conversation's events
    keep their order; the same inputs and seed give the same stream.
    """
    if concurrency < 1:
        raise ValueError(f"concurrency must be at least 1, not {concurrency}")
    rng = random.Random(seed)
    source = iter(conversations)
    open_: list[tuple[Sequence[Event], int]] = []
    exhausted = False
    while True:
        while not exhausted and len(open_) < concurrency:
            nxt = next(source, None)
            if nxt is None:
                exhausted = True
            elif nxt:
                open_.append((nxt, 0))
        if not open_:
            return
        i = rng.randrange(len(open_))
        events, pos = open_[i]
        yield events[pos]
        if pos + 1 < len(events):
            open_[i] = (events, pos + 1)
        else:
            # Swap-remove: O(1), and the choice is uniform over open slots whatever their order.
            open_[i] = open_[-1]
            open_.pop()


# The event contract's bound on conversation ids (``schemas/event-v1.schema.json``).
MAX_CONVERSATION_ID_CHARS: Final = 256


def _load(path: Path) -> list[dict[str, Any]]:
    records = []
    try:
        for rec in read_conversations(path, stats=ReadStats(), strict=True):
            if len(rec.conversation_id) > MAX_CONVERSATION_ID_CHARS:
                raise SampleError(
                    f"{path}: line {rec.line}: conversation_id is longer than "
                    f"{MAX_CONVERSATION_ID_CHARS} characters (the event contract's limit)"
                )
            records.append(record_json(rec))
    except DatasetError as exc:
        raise SampleError(str(exc)) from exc
    return records


def load_jsonl_gz(path: str | Path) -> list[dict[str, Any]]:
    """Read a (gzipped) JSONL conversations file; raise :class:`SampleError` naming the bad line."""
    return _load(Path(path))


def load_sample() -> list[dict[str, Any]]:
    """The bundled demo sample (see ``sidecar/tools/demo/data/ATTRIBUTION.md``)."""
    package, name = SAMPLE_RESOURCE
    with resources.as_file(resources.files(package).joinpath(name)) as path:
        return _load(path)


def encode(event: Mapping[str, Any]) -> tuple[bytes, bytes]:
    """Kafka key and value of an event: the conversation id, compact UTF-8 JSON."""
    key = str(event["conversation_id"]).encode("utf-8")
    value = json.dumps(event, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    return key, value


# At most this many sends await delivery at once: bounds memory while keeping the producer's
# batches full (aiokafka's own buffer is bounded by max_batch_size per partition).
_MAX_IN_FLIGHT: Final = 2000
# Sleeping for less than this is dominated by timer resolution and loop overhead; a pacer that is
# ahead by less simply continues, and catches up in the next sleep.
_MIN_SLEEP_SECONDS: Final = 0.002


async def produce(
    bootstrap: str,
    topic: str,
    events: Iterable[Mapping[str, Any]],
    *,
    rate: float | None,
    progress: ProgressFn | None = None,
    stop: asyncio.Event | None = None,
    stamp_now: bool = False,
) -> int:
    """Send events (key = conversation id, compact JSON value, ``acks=all``) at ``rate`` events/s.

    ``rate=None`` sends as fast as the producer accepts. ``progress(n)`` is called with the number
    of events handed to the producer so far. ``stop`` ends the replay early; ``stamp_now`` replaces
    each event's ``ts`` with the wall-clock time at sending. Returns the number of events whose
    delivery the brokers acknowledged; raises on a delivery failure.
    """
    if rate is not None and not (math.isfinite(rate) and rate > 0):
        raise ValueError(f"rate must be a positive number of events per second, not {rate}")
    producer = AIOKafkaProducer(
        **plaintext_client_kwargs(bootstrap, client_id="sidecar-demo-producer"), acks="all", linger_ms=5
    )
    await producer.start()
    sent = 0
    in_flight: set[asyncio.Future[Any]] = set()
    try:
        t0 = time.monotonic()
        for original in events:
            if stop is not None and stop.is_set():
                break
            if rate is not None:
                ahead = t0 + sent / rate - time.monotonic()
                if ahead > _MIN_SLEEP_SECONDS:
                    await asyncio.sleep(ahead)
            event = {**original, "ts": time.time()} if stamp_now else original
            key, value = encode(event)
            in_flight.add(await producer.send(topic, value=value, key=key))
            sent += 1
            if len(in_flight) >= _MAX_IN_FLIGHT:
                done, in_flight = await asyncio.wait(in_flight, return_when=asyncio.FIRST_COMPLETED)
                for fut in done:
                    fut.result()
            if progress is not None:
                progress(sent)
        if in_flight:
            await asyncio.gather(*in_flight)
    finally:
        await producer.stop()
    return sent


__all__ = [
    "EVENT_ID_NAMESPACE",
    "Event",
    "SampleError",
    "agent_tag",
    "conversation_events",
    "encode",
    "event_id",
    "interleave",
    "load_jsonl_gz",
    "load_sample",
    "produce",
]
