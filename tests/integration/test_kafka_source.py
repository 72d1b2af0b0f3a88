"""The Kafka source against librdkafka's mock cluster: consume, dead-letter with reasons in
headers, commit low-watermark + metadata, resume after a clean restart, pause under backpressure."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from prometheus_client import CollectorRegistry

from sidecar.app import run_app
from sidecar.config import SidecarConfig, load_config
from sidecar.contract import Outcome, TurnContext
from sidecar.source.journal import parse_metadata
from sidecar.state.hooks import RecordingHooks
from sidecar.tools.ports import free_port
from tests.integration.kafka_support import produce_raw, produce_with_header_key, read_topic, result_keys, write_config


def config(tmp_path: Path, bs: str, topic: str, **sections: Any) -> SidecarConfig:
    return load_config(write_config(tmp_path / f"{topic}.yaml", bs, topic, **sections))


def msg(cid: str, seq: int, role: str, content: str = "hi") -> tuple[bytes, bytes]:
    ev = {
        "conversation_id": cid,
        "event_id": f"{cid}-{seq}",
        "seq": seq,
        "ts": 1.0,
        "type": "message",
        "message": {"role": role, "content": content},
        "agent": "shop",
    }
    return cid.encode(), json.dumps(ev).encode()


def end(cid: str, seq: int) -> tuple[bytes, bytes]:
    ev = {"conversation_id": cid, "event_id": f"{cid}-{seq}", "seq": seq, "ts": 1.0, "type": "conversation_end"}
    return cid.encode(), json.dumps(ev).encode()


class Running:
    def __init__(self, cfg: SidecarConfig, hooks: Any = None) -> None:
        self.cfg = cfg
        self.stop = asyncio.Event()
        self.ready = asyncio.Event()
        self.registry = CollectorRegistry()
        self.task = asyncio.create_task(
            run_app(cfg, hooks=hooks, ready=self.ready, stop=self.stop, registry=self.registry)
        )

    def metric(self, name: str, **labels: str) -> float:
        return self.registry.get_sample_value(name, labels) or 0.0

    async def wait_for(self, name: str, value: float, limit_seconds: float = 60, **labels: str) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + limit_seconds
        while self.metric(name, **labels) < value:
            if loop.time() > deadline:
                raise AssertionError(f"{name}{labels} stayed at {self.metric(name, **labels)} < {value}")
            if self.task.done():
                self.task.result()
            await asyncio.sleep(0.1)

    async def close(self) -> None:
        self.stop.set()
        await asyncio.wait_for(self.task, 60)


async def committed(bs: str, group: str, topic: str) -> dict[int, tuple[int, str]]:
    c = AIOKafkaConsumer(bootstrap_servers=bs, group_id=group, enable_auto_commit=False)
    await c.start()
    try:
        tps = [TopicPartition(topic, p) for p in range(4)]
        got = await c._coordinator.fetch_committed_offsets(tps)
        return {tp.partition: (om.offset, om.metadata) for tp, om in got.items() if om.offset >= 0}
    finally:
        await c.stop()


async def test_consume_dead_letter_and_commit(kafka: str, tmp_path: Path, running: list[Running]) -> None:
    topic = "src1"
    good = [msg("a", 0, "user"), msg("a", 1, "assistant"), msg("a", 2, "user"), end("a", 3)]
    bad = [
        (b"b", b"\xff"),
        (b"b", b"{oops"),
        (b"nokey-mismatch", msg("b", 0, "user")[1]),
        msg("c", 4, "user"),
        (b"d", b"x" * 70_000),
    ]
    await produce_raw(kafka, topic, good + bad + [msg("a", 0, "user")])  # the last one: after the end
    r = Running(config(tmp_path, kafka, topic, kafka={"max_record_bytes": 65_536}))
    running.append(r)
    await r.wait_for("sidecar_hooks_fired_total", 1, kind="conversation_ended")
    for reason in ("oversized", "invalid_utf8", "invalid_json", "key_mismatch", "seq_gap", "conversation_finished"):
        await r.wait_for("sidecar_events_dead_lettered_total", 1, reason=reason)
    await r.wait_for("sidecar_commits_total", 1, result="ok")
    await r.close()

    keys = sorted(result_keys(await read_topic(kafka, f"{topic}.results")))
    assert keys == [
        ("a", 0, "conversation_ended"),
        ("a", 1, "turn_closed"),
        ("a", 1, "user_message"),
        ("a", 2, "turn_closed"),
        ("a", 2, "user_message"),
    ]
    dlq = await read_topic(kafka, f"{topic}.dlq")
    reasons = sorted(dict(x.headers)["dlq.reason"].decode() for x in dlq)
    assert reasons == sorted(
        ["invalid_utf8", "invalid_json", "key_mismatch", "seq_gap", "oversized", "conversation_finished"]
    )
    for x in dlq:
        h = dict(x.headers)
        assert h["dlq.source.topic"] == topic.encode()
        assert int(h["dlq.source.offset"]) >= 0
    assert r.metric("sidecar_events_consumed_total") == len(good) + len(bad) + 1
    commits = await committed(kafka, f"g-{topic}", topic)
    assert commits, "nothing committed"
    for offset, meta in commits.values():
        parsed = parse_metadata(meta)
        assert parsed is not None and parsed.processed_until == offset  # nothing open: low-watermark == processed


async def test_clean_restart_resumes_open_conversation(kafka: str, tmp_path: Path, running: list[Running]) -> None:
    topic = "src2"
    await produce_raw(kafka, topic, [msg("x", 0, "user"), msg("x", 1, "assistant")])
    cfg = config(tmp_path, kafka, topic, state={"turn_debounce_seconds": 300})
    r1 = Running(cfg)
    running.append(r1)
    await r1.wait_for("sidecar_hooks_fired_total", 1, kind="user_message")
    await r1.wait_for("sidecar_commits_total", 1, result="ok")
    await r1.close()
    commits = await committed(kafka, f"g-{topic}", topic)
    with_data = [(offset, parse_metadata(meta)) for offset, meta in commits.values() if meta and '"p":0' not in meta]
    assert len(with_data) == 1
    offset, parsed = with_data[0]
    assert offset == 0  # the conversation is still open: commit its first offset...
    assert parsed is not None and parsed.processed_until == 2  # ...and say both records were processed

    await produce_raw(kafka, topic, [msg("x", 2, "user"), end("x", 3)])
    r2 = Running(cfg)
    running.append(r2)
    await r2.wait_for("sidecar_hooks_fired_total", 1, kind="conversation_ended")
    assert r2.metric("sidecar_events_replayed_total") == 2  # the open conversation was rebuilt
    assert r2.metric("sidecar_hooks_suppressed_total", kind="user_message") == 1
    await r2.close()
    keys = sorted(result_keys(await read_topic(kafka, f"{topic}.results")))
    assert keys == [
        ("x", 0, "conversation_ended"),
        ("x", 1, "turn_closed"),
        ("x", 1, "user_message"),
        ("x", 2, "turn_closed"),
        ("x", 2, "user_message"),
    ]


class GatedHooks(RecordingHooks):
    def __init__(self) -> None:
        super().__init__()
        self.gate = asyncio.Event()

    async def _slow(self) -> Outcome:
        await self.gate.wait()
        return {"ok": True}

    def on_user_message(self, ctx: TurnContext) -> Any:
        return self._slow()


async def test_slow_hooks_pause_partitions_then_catch_up(kafka: str, tmp_path: Path, running: list[Running]) -> None:
    topic = "src3"
    await produce_raw(kafka, topic, [msg(f"c{i}", 0, "user") for i in range(400)])
    cfg = config(
        tmp_path,
        kafka,
        topic,
        kafka={"max_pending_effects_per_partition": 4, "fetch_max_records": 5, "partition_queue_batches": 1},
    )
    hooks = GatedHooks()
    r = Running(cfg, hooks)
    running.append(r)
    await r.wait_for("sidecar_partitions_paused", 4)  # every partition stopped fetching
    # per partition: max_pending effects in flight; the next record waits for room before it is applied
    await r.wait_for("sidecar_events_consumed_total", 4 * 4)
    await asyncio.sleep(1.5)
    consumed = r.metric("sidecar_events_consumed_total")
    assert consumed == 4 * 4
    assert r.metric("sidecar_events_consumed_total") == consumed  # paused: nothing more is taken
    hooks.gate.set()
    await r.wait_for("sidecar_hooks_fired_total", 400, kind="user_message")
    await r.wait_for("sidecar_events_consumed_total", 400)
    await r.close()
    assert r.metric("sidecar_partitions_paused") == 0
    assert len(await read_topic(kafka, f"{topic}.results")) == 400


async def test_readyz_and_metrics_over_http(kafka: str, tmp_path: Path, running: list[Running]) -> None:
    import aiohttp

    topic = "src4"
    port = free_port()
    await produce_raw(kafka, topic, [msg("h", 0, "user")])
    r = Running(config(tmp_path, kafka, topic, http={"port": port}))
    running.append(r)
    async with aiohttp.ClientSession() as http:
        await r.ready.wait()
        deadline = asyncio.get_running_loop().time() + 60
        status, body = 0, {}
        while asyncio.get_running_loop().time() < deadline:
            async with http.get(f"http://127.0.0.1:{port}/readyz") as resp:
                status, body = resp.status, await resp.json()
            if status == 200:
                break
            await asyncio.sleep(0.2)
        assert status == 200, body
        assert "partitions=4" in json.dumps(body)
        await r.wait_for("sidecar_hooks_fired_total", 1, kind="user_message")
        async with http.get(f"http://127.0.0.1:{port}/metrics") as resp:
            text = await resp.text()
        assert "sidecar_events_consumed_total 1.0" in text
        assert "conversation_id" not in text  # bounded labels only
        await r.close()
        with pytest.raises(aiohttp.ClientConnectionError):
            async with http.get(f"http://127.0.0.1:{port}/readyz"):
                pass


async def test_transient_errors_during_recovery_are_retried(
    kafka: str, tmp_path: Path, running: list[Running], monkeypatch: pytest.MonkeyPatch
) -> None:
    from aiokafka.errors import KafkaConnectionError

    import sidecar.source.worker as source_worker
    from sidecar.source.recovery import load_recovery as real

    failures = {"left": 3}

    async def flaky(*args: Any, **kwargs: Any) -> Any:
        if failures["left"] > 0:
            failures["left"] -= 1
            raise KafkaConnectionError("broker went away")
        return await real(*args, **kwargs)

    monkeypatch.setattr("sidecar.source.worker.load_recovery", flaky)
    monkeypatch.setattr(source_worker, "RECOVERY_BACKOFF_INITIAL_SECONDS", 0.05)
    topic = "src5"
    await produce_raw(kafka, topic, [msg("r", 0, "user")])
    r = Running(config(tmp_path, kafka, topic))
    running.append(r)
    await r.wait_for("sidecar_hooks_fired_total", 1, kind="user_message")
    await r.wait_for("sidecar_partition_recoveries_total", 4)  # every partition got through
    assert r.metric("sidecar_partition_recovery_errors_total") == 3


async def test_record_the_client_cannot_parse_is_dead_lettered_not_fatal(
    kafka: str, tmp_path: Path, running: list[Running]
) -> None:
    """Regression: a header key that is not UTF-8 made getmany() raise on every start, so the
    sidecar exited in a loop; records parsed before it in the same fetch were lost on the way."""
    topic = "src6"
    await produce_raw(kafka, topic, [msg("u", 0, "user"), msg("u", 1, "assistant")])
    await asyncio.to_thread(produce_with_header_key, kafka, topic, b"u", msg("u", 2, "user")[1], b"\xff\xfe")
    await produce_raw(kafka, topic, [msg("u", 2, "user"), end("u", 3)])
    r = Running(config(tmp_path, kafka, topic))
    running.append(r)
    await r.wait_for("sidecar_events_dead_lettered_total", 1, reason="unreadable_record")
    await r.wait_for("sidecar_hooks_fired_total", 1, kind="conversation_ended")
    await r.close()
    keys = sorted(result_keys(await read_topic(kafka, f"{topic}.results")))
    assert keys == [
        ("u", 0, "conversation_ended"),
        ("u", 1, "turn_closed"),
        ("u", 1, "user_message"),
        ("u", 2, "turn_closed"),
        ("u", 2, "user_message"),
    ]
    dlq = [dict(x.headers) for x in await read_topic(kafka, f"{topic}.dlq")]
    assert [h["dlq.reason"] for h in dlq] == [b"unreadable_record"]
    assert dlq[0]["dlq.source.offset"] == b"2"


async def test_resent_finished_conversation_after_restart_is_refused(
    kafka: str, tmp_path: Path, running: list[Running]
) -> None:
    """Regression: the memory of finished conversations was not rebuilt on recovery, so a producer
    re-sending a finished conversation after a restart got its outcomes recorded twice."""
    topic = "src7"
    done = [msg("f", 0, "user"), msg("f", 1, "assistant"), end("f", 2)]
    await produce_raw(kafka, topic, [*done, msg("open", 0, "user")])  # "open" keeps the commit point below "f"
    cfg = config(tmp_path, kafka, topic, state={"turn_debounce_seconds": 300})
    r1 = Running(cfg)
    running.append(r1)
    await r1.wait_for("sidecar_hooks_fired_total", 1, kind="conversation_ended")
    await r1.wait_for("sidecar_commits_total", 2, result="ok")
    await r1.close()
    commits = await committed(kafka, f"g-{topic}", topic)
    metas = [parse_metadata(m) for _, m in commits.values()]
    assert any(m is not None and m.finished_from is not None for m in metas), commits

    await produce_raw(kafka, topic, done)  # the whole conversation again, same event ids
    r2 = Running(cfg)
    running.append(r2)
    await r2.wait_for("sidecar_events_dead_lettered_total", 3, reason="conversation_finished")
    await r2.close()
    keys = sorted(result_keys(await read_topic(kafka, f"{topic}.results")))
    assert keys == [
        ("f", 0, "conversation_ended"),
        ("f", 1, "turn_closed"),
        ("f", 1, "user_message"),
        ("open", 1, "user_message"),
    ]


async def test_forged_and_malformed_journal_records_cannot_crash_or_silence_recovery(
    kafka: str, tmp_path: Path, running: list[Running]
) -> None:
    """Regression: one results-topic record holding 1e999 or 100,000 nested brackets made recovery
    raise on every start; a forged record could suppress a hook. With a signing key, neither acts."""
    topic = "src8"
    group = f"g-{topic}"
    forged = {
        "v": 1,
        "group": group,
        "topic": topic,
        "conversation_id": "j",
        "trigger": "record",
        "kind": "user_message",
        "turn": 1,
        "position": 10**9,
    }
    junk = [b'{"v":1,"kind":"user_message","turn":1e999,"position":0}', b"[" * 100_000, b"\xff"]
    junk += [json.dumps({**forged, "partition": p}).encode() for p in range(4)]
    await produce_raw(kafka, f"{topic}.results", [(b"x", v) for v in junk])
    await produce_raw(kafka, topic, [msg("j", 0, "user")])
    r = Running(config(tmp_path, kafka, topic, kafka={"journal_signing_keys": ["k1"]}))
    running.append(r)
    await r.wait_for("sidecar_hooks_fired_total", 1, kind="user_message")  # not suppressed by the forgery
    await r.wait_for("sidecar_partition_recoveries_total", 4)
    skipped = {
        reason: r.metric("sidecar_journal_records_skipped_total", reason=reason)
        for reason in ("invalid", "unsigned", "bad_signature")
    }
    await r.close()
    # every partition's recovery read the junk of its own results partition (the mock spreads keyed
    # records by hash, so count across all): three malformed and four unsigned forgeries in total
    assert skipped["invalid"] >= 1 and skipped["unsigned"] >= 1, skipped
