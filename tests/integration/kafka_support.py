"""Helpers for tests against librdkafka's mock cluster: run the sidecar as a real process,
produce events, read topics back."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from sidecar.source.journal_entry import JournalSigner, read_entry
from sidecar.tools.demo.replay import conversation_events, load_sample

REPO = Path(__file__).resolve().parents[2]


def shared_dir() -> Path:
    return Path(os.environ.get("SIDECAR_SHARED_DIR", REPO.parent / "shared"))


def write_config(path: Path, bootstrap: str, topic: str, **sections: Mapping[str, Any]) -> Path:
    cfg: dict[str, Any] = {
        "kafka": {
            "bootstrap_servers": bootstrap,
            "topic": topic,
            "group_id": f"g-{topic}",
            "dead_letter_topic": f"{topic}.dlq",
            "results_topic": f"{topic}.results",
            "commit_interval_seconds": 0.5,
            "session_timeout_ms": 6000,
            "heartbeat_interval_ms": 1000,
        },
        "http": {"host": "127.0.0.1", "port": 0},
        "logging": {"format": "json", "level": "info"},
    }
    for name, values in sections.items():
        cfg.setdefault(name, {}).update(values)
    path.write_text(yaml.safe_dump(cfg))
    return path


def http_get(url: str, timeout: float = 5.0) -> tuple[int, str]:
    """Status and body of a GET (an HTTP error status is an answer, not an exception)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return int(resp.status), resp.read().decode()
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read().decode()


class SidecarProcess:
    """``sidecar run`` (or another entry point taking ``--config``) in a child process."""

    def __init__(self, config: Path, log_path: Path, argv: list[str] | None = None) -> None:
        self.config = config
        self.log_path = log_path
        self.argv = argv or ["-m", "sidecar", "run"]
        self.proc: subprocess.Popen[bytes] | None = None
        self._log_start = 0

    def start(self) -> None:
        log = self.log_path.open("ab")
        self._log_start = log.tell()
        self.proc = subprocess.Popen(
            [sys.executable, *self.argv, "--config", str(self.config)],
            stdout=log,
            stderr=log,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            cwd=REPO,
        )
        log.close()

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def terminate(self, timeout: float = 30) -> int:
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                return self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                return -9
        return int(self.proc.returncode)

    def said_anything(self) -> bool:
        """Whether the current process has written to its log (restarts append to one file)."""
        return self.log_path.stat().st_size > self._log_start

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


async def produce_raw(bootstrap: str, topic: str, records: Iterable[tuple[bytes | None, bytes]]) -> int:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5)
    await producer.start()
    n = 0
    try:
        futs = []
        for key, value in records:
            futs.append(await producer.send(topic, value=value, key=key))
            n += 1
        await asyncio.gather(*futs)
    finally:
        await producer.stop()
    return n


async def read_topic(bootstrap: str, topic: str, *, idle_seconds: float = 2.0) -> list[Any]:
    """Every record currently in ``topic`` (all partitions), read without a group."""
    c = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False, auto_offset_reset="earliest"
    )
    await c.start()
    try:
        parts = c.partitions_for_topic(topic) or set()
        if not parts:
            await c._client.force_metadata_update()
            parts = c.partitions_for_topic(topic) or set()
        tps = [TopicPartition(topic, p) for p in sorted(parts)]
        if not tps:
            return []
        c.assign(tps)
        await c.seek_to_beginning(*tps)
        end = await c.end_offsets(tps)
        out: list[Any] = []
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            positions = [await c.position(tp) for tp in tps]
            if all(pos >= end[tp] for pos, tp in zip(positions, tps, strict=True)):
                break
            batch = await c.getmany(timeout_ms=int(idle_seconds * 1000), max_records=10_000)
            for recs in batch.values():
                out.extend(recs)
        return out
    finally:
        await c.stop()


def result_keys(records: Iterable[Any], signer: JournalSigner | None = None) -> list[tuple[str, int, str]]:
    """(conversation, turn, kind) of every results record; with ``signer``, only those it signed."""
    keys = []
    for r in records:
        if signer is not None:
            entry, _ = read_entry(r.value, signer)
            if entry is None:
                continue
        v = json.loads(r.value)
        turn = 0 if v["kind"] == "conversation_ended" else v["turn"]
        keys.append((v["conversation_id"], turn, v["kind"]))
    return keys


def sample_conversations(copies: int, prefix: str, limit: int | None = None) -> list[list[dict[str, Any]]]:
    """The bundled demo sample's conversations as v1 events, ``copies`` times under fresh ids.

    The suite needs no data beyond the repository: the sample (STAR, MultiWOZ, tau-bench; see
    sidecar/tools/demo/data/ATTRIBUTION.md) replayed under new conversation ids is new traffic."""
    records = load_sample()[:limit]
    return [
        conversation_events(r, conversation_id=f"{prefix}{c}-{i}") for c in range(copies) for i, r in enumerate(records)
    ]


def ground_truth(convs: Iterable[list[dict[str, Any]]]) -> Counter[tuple[str, int, str]]:
    """One outcome per (conversation, turn, kind) that the events of ``convs`` cause."""
    expected: Counter[tuple[str, int, str]] = Counter()
    for events in convs:
        cid = events[0]["conversation_id"]
        turns = sum(1 for e in events if e["type"] == "message" and e["message"]["role"] == "user")
        for t in range(1, turns + 1):
            expected[(cid, t, "user_message")] += 1
            expected[(cid, t, "turn_closed")] += 1
        expected[(cid, 0, "conversation_ended")] += 1
    return expected


def produce_with_header_key(bootstrap: str, topic: str, key: bytes, value: bytes, header_key: bytes) -> None:
    """Write one record whose header key is the raw bytes given (e.g. not UTF-8).

    Kafka clients only accept text header keys, but nothing stops another client from writing any
    bytes there. The pure-Python record builder encodes the key with ``.encode("utf-8")``, so a
    ``str`` whose ``encode`` returns the raw bytes gets them onto the wire unchanged."""
    code = (
        "import asyncio, sys\n"
        "from aiokafka import AIOKafkaProducer\n"
        "class RawKey(str):\n"
        "    def encode(self, *a, **k):\n"
        "        return bytes.fromhex(sys.argv[5])\n"
        "async def main():\n"
        "    p = AIOKafkaProducer(bootstrap_servers=sys.argv[1], acks='all')\n"
        "    await p.start()\n"
        "    try:\n"
        "        await p.send_and_wait(sys.argv[2], value=bytes.fromhex(sys.argv[4]),\n"
        "                              key=bytes.fromhex(sys.argv[3]), headers=[(RawKey('k'), b'v')])\n"
        "    finally:\n"
        "        await p.stop()\n"
        "asyncio.run(main())\n"
    )
    subprocess.run(
        [sys.executable, "-c", code, bootstrap, topic, key.hex(), value.hex(), header_key.hex()],
        check=True,
        env={**os.environ, "AIOKAFKA_NO_EXTENSIONS": "1"},
        timeout=60,
    )
