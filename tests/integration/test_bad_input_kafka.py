"""Hostile events through a running sidecar on librdkafka's mock cluster: each lands in the
dead-letter topic with its own reason, and the sidecar keeps consuming and committing.

Tool-call arguments nested just under the JSON parser's depth limit once raised a RecursionError
out of the decoder (at a few depths, which ones depending on the stack), which ended the sidecar,
and would again after every restart: the record was never committed past. Every depth from 900
to 1,000 is sent."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from tests.integration.kafka_support import produce_raw, read_topic, result_keys
from tests.integration.test_kafka_source import Running, config, end, msg

CAP = 2  # state.max_messages_per_conversation (its minimum)
DEPTHS = range(900, 1001)


def with_fields(record: tuple[bytes, bytes], **fields: object) -> tuple[bytes, bytes]:
    return record[0], json.dumps({**json.loads(record[1]), **fields}).encode()


def deep_arguments(cid: str, depth: int) -> tuple[bytes, bytes]:
    ev = json.loads(msg(cid, 0, "assistant")[1])
    ev["message"]["tool_calls"] = [{"name": "f", "arguments": {"placeholder": 0}}]
    text = json.dumps(ev).replace('{"placeholder": 0}', '{"a": ' * depth + "1" + "}" * depth)
    return cid.encode(), text.encode()


async def test_hostile_events_are_dead_lettered_and_the_sidecar_goes_on(
    kafka: str, tmp_path: Path, running: list[Running]
) -> None:
    topic = "hostile"
    hostile = [
        *(deep_arguments(f"deep{depth}", depth) for depth in DEPTHS),
        with_fields(msg("ts1", 0, "user"), ts="yesterday"),
        with_fields(msg("ts2", 0, "user"), ts=1.7e12),  # milliseconds as seconds
        with_fields(msg("ts3", 0, "user"), ts=True),
        with_fields(msg("nl", 0, "user"), agent="shop\n"),
    ]
    # A conversation over the cap: every message past it is too long (not a gap); its end ends it.
    long = [msg("long", i, "user" if i % 2 == 0 else "assistant") for i in range(CAP + 3)] + [end("long", CAP + 3)]
    good = [msg("a", 0, "user"), msg("a", 1, "assistant"), end("a", 2)]
    await produce_raw(kafka, topic, [*hostile, *long, *good])
    r = Running(config(tmp_path, kafka, topic, state={"max_messages_per_conversation": CAP}))
    running.append(r)
    await r.wait_for("sidecar_hooks_fired_total", 2, kind="conversation_ended")
    await r.wait_for("sidecar_events_dead_lettered_total", 3, reason="invalid_timestamp")
    await r.wait_for("sidecar_events_dead_lettered_total", 3, reason="conversation_too_long")
    await r.wait_for("sidecar_events_dead_lettered_total", 1, reason="schema")
    await r.wait_for("sidecar_commits_total", 1, result="ok")
    assert not r.task.done()
    await r.close()

    dlq = await read_topic(kafka, f"{topic}.dlq")
    reasons = Counter(dict(x.headers)["dlq.reason"].decode() for x in dlq)
    # Too deep for the parser: invalid_json; else refused for the arguments' depth (schema).
    assert reasons["schema"] + reasons["invalid_json"] == len(DEPTHS) + 1  # and the agent "shop\n"
    assert reasons["invalid_timestamp"] == 3 and reasons["conversation_too_long"] == 3
    assert sum(reasons.values()) == len(hostile) + 3
    assert r.metric("sidecar_events_dead_lettered_total", reason="seq_gap") == 0
    ended = {k[0] for k in result_keys(await read_topic(kafka, f"{topic}.results")) if k[2] == "conversation_ended"}
    assert ended == {"a", "long"}
