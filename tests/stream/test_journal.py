"""Journal records and commit metadata come back from Kafka: untrusted input. Whatever the bytes,
parsing never raises; with signing keys, only records this sidecar signed are acted on."""

from __future__ import annotations

import json
from typing import Any

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from sidecar.source.journal import CommitPoint, Recovery, parse_metadata
from sidecar.source.journal_entry import JournalSigner, entry_from_mapping, read_entry
from sidecar.source.result_record import ResultRecord
from sidecar.source.writers import MAX_RESULT_BYTES, WriteHealth, encode_result
from sidecar.telemetry.stream_metrics import StreamMetrics


def record(**over: Any) -> dict[str, Any]:
    base = {
        "v": 1,
        "group": "g",
        "topic": "t",
        "partition": 2,
        "position": 10,
        "trigger": "record",
        "kind": "turn_closed",
        "conversation_id": "c",
        "turn": 1,
        "outcome": {"ok": True},
    }
    return {**base, **over}


def test_valid_record_reads_back() -> None:
    entry, reason = read_entry(json.dumps(record()).encode(), JournalSigner([]))
    assert reason is None and entry is not None
    assert (entry.conversation_id, entry.turn, entry.kind, entry.position) == ("c", 1, "turn_closed", 10)


def test_hostile_records_are_skipped_with_a_reason_not_raised() -> None:
    signer = JournalSigner([])
    hostile = [
        b"",
        b"\xff\xfe",
        b"1e999",
        b"[" * 100_000 + b"]" * 100_000,
        b'{"v":1,' + b'"a":[' * 5000,
        json.dumps(record(turn=1e300)).encode(),
        b'{"v":1,"turn":1e999}',
        json.dumps(record(position=-1)).encode(),
        json.dumps(record(position=2**64)).encode(),
        json.dumps(record(kind="delete_everything")).encode(),
        json.dumps(record(turn=True)).encode(),
        json.dumps(record(conversation_id="x" * 10_000)).encode(),
        json.dumps(record()).encode()[:-1] + b',"outcome2":' + b"[" * 100_000 + b"]" * 100_000 + b"}",
    ]
    for value in hostile:
        entry, reason = read_entry(value, signer)
        assert entry is None and reason == "invalid", value[:60]


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=512))
def test_arbitrary_bytes_never_raise(value: bytes) -> None:
    read_entry(value, JournalSigner([b"k"]))


def test_signing_keys_make_forgeries_inert_and_rotation_works() -> None:
    old, new = JournalSigner([b"old"]), JournalSigner([b"new", b"old"])
    signed_record = msgspec.convert(record(), ResultRecord)
    old.sign(signed_record)
    signed = msgspec.to_builtins(signed_record)
    assert read_entry(json.dumps(signed).encode(), new)[1] is None  # verified by the second key
    forged = record()
    assert read_entry(json.dumps(forged).encode(), new)[1] == "unsigned"
    tampered = {**signed, "turn": 2}
    assert read_entry(json.dumps(tampered).encode(), new)[1] == "bad_signature"
    moved = {**signed, "position": 0, "trigger": "timer"}
    assert read_entry(json.dumps(moved).encode(), new)[1] == "bad_signature"
    outcome_changed = {**signed, "outcome": {"anything": 1}}  # recovery never reads the outcome
    assert read_entry(json.dumps(outcome_changed).encode(), new)[1] is None


def test_recovery_plan_ignores_records_that_do_not_validate() -> None:
    plan = Recovery.from_journal(
        start_offset=0,
        replay_until=5,
        journal_from=0,
        journal_end=3,
        records=[
            record(position=7),
            record(turn="1"),
            {"kind": "user_message"},
            record(kind="user_message", turn=2, position=3),
        ],
    )
    assert plan.keys == {("c", 1, "turn_closed")}
    assert plan.last_position == 7


def test_commit_metadata_round_trips_and_rejects_damage() -> None:
    cp = CommitPoint(offset=5, processed_until=9, journal_from=40, finished_from=2)
    meta = parse_metadata(cp.metadata)
    assert meta is not None and (meta.processed_until, meta.journal_from, meta.finished_from) == (9, 40, 2)
    assert "f" not in json.loads(CommitPoint(5, 9, 40, finished_from=7).metadata)  # nothing to scan
    for bad in [
        "",
        "x",
        "[]",
        '{"v":2,"p":1,"j":1}',
        '{"v":1,"p":-1,"j":1}',
        '{"v":1,"p":true,"j":1}',
        '{"v":1,"p":1e999,"j":1}',
        '{"v":1,"p":1,"j":1,"f":"x"}',
        "[" * 10_000,
        "x" * 10_000,
    ]:
        parsed = parse_metadata(bad)
        assert parsed is None or parsed.finished_from is None


def test_an_outcome_too_large_to_write_becomes_an_error_marker() -> None:
    """Regression: a record the broker refuses was resent forever, pinning its partition."""
    metrics = StreamMetrics(CollectorRegistry())
    small = encode_result(msgspec.convert(record(), ResultRecord), metrics)
    assert json.loads(small)["outcome"] == {"ok": True}
    big = encode_result(msgspec.convert(record(outcome={"text": "x" * (MAX_RESULT_BYTES + 10)}), ResultRecord), metrics)
    assert len(big) < 1024
    parsed = json.loads(big)
    assert parsed["outcome"]["error"] == "result_too_large" and parsed["conversation_id"] == "c"
    entry = entry_from_mapping(parsed)
    assert entry is not None and entry.kind == "turn_closed"  # still a valid journal entry


def test_write_health_fails_at_once_on_permanent_errors_and_late_on_transient() -> None:
    from aiokafka.errors import KafkaConnectionError, TopicAuthorizationFailedError

    h = WriteHealth()
    assert h.status()[0]
    h.failed(KafkaConnectionError(), permanent=False)
    assert h.status()[0]  # a broker restart is not yet a reason to be unready
    h.failed(TopicAuthorizationFailedError(), permanent=True)
    ok, detail = h.status()
    assert not ok and "TopicAuthorizationFailedError" in detail
    h.ok()
    assert h.status() == (True, "ok")


def test_the_reader_checks_every_field_of_the_record_type() -> None:
    """Reader and writer share one type: a field recovery does not act on must still have its type
    (a record with ``"agent": 5`` was not written by a sidecar and is skipped), and may be absent."""
    signer = JournalSigner([])
    assert read_entry(json.dumps(record()).encode(), signer)[1] is None
    for bad in [{"outcome": "x"}, {"agent": 5}, {"messages": "3"}, {"close_reason": "bogus"}]:
        assert read_entry(json.dumps(record(**bad)).encode(), signer) == (None, "invalid"), bad
