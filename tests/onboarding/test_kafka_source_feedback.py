"""The adapters' Kafka reader leaves people's feedback out of transcripts and does not count it as
malformed."""

from __future__ import annotations

import json
from dataclasses import dataclass

from adapters.data.kafka_source import KafkaSource


@dataclass
class _Rec:
    key: bytes
    value: bytes


def _rec(ev: dict[str, object]) -> _Rec:
    return _Rec(str(ev["conversation_id"]).encode(), json.dumps(ev).encode())


def test_feedback_records_are_neither_messages_nor_malformed() -> None:
    source = KafkaSource("k", {}, "t", None)
    pending: dict[str, object] = {}
    msgs = [("user", "book a table"), ("assistant", "done")]
    records = [
        _rec({"conversation_id": "c", "event_id": f"e{i}", "seq": i, "ts": 1, "type": "message",
              "message": {"role": role, "content": text}})
        for i, (role, text) in enumerate(msgs)
    ]  # fmt: skip
    records.insert(1, _rec({"conversation_id": "c", "event_id": "f", "ts": 1, "type": "feedback",
                            "feedback": {"target": "turn", "rating": "up", "turn": 1}}))  # fmt: skip
    records.append(_rec({"conversation_id": "c", "event_id": "end", "seq": 2, "ts": 1, "type": "conversation_end"}))
    for r in records:
        source._take(pending, r)  # type: ignore[arg-type]
    built = source._build("c", pending["c"])  # type: ignore[arg-type]
    assert built is not None and [m.role for m in built.messages] == ["user", "assistant"]
    assert source.stats.malformed == 0
