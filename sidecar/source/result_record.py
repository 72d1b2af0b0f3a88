"""``ResultRecord``: one hook outcome as the results topic holds it, written and read as one type.

The processor builds it, the results writer completes it (``group``, ``topic``, ``sig``) and
encodes it; recovery decodes the same type from the topic. The wire format is this struct's JSON,
fields in declaration order, ``sig`` absent when records are not signed (pinned byte for byte by
``tests/stream/test_results_wire.py``).

The constraints are those recovery needs to trust a record it reads back (the topic is untrusted
input, see :mod:`sidecar.source.journal_entry`); msgspec checks them when decoding, never when
the processor builds a record. Fields recovery does not act on have defaults, so a record that
lacks them still reads back (``provenance``, added later, is simply absent from older records).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import UNSET, Meta, UnsetType

from sidecar.contract import CloseReason, EndReason, HookKind, Provenance

RESULT_VERSION: Literal[1] = 1

TriggeredBy = Literal["record", "timer"]
JournalKind = HookKind | Literal["feedback"]
"""A hook's kind, or ``feedback``: a person's feedback applied (:mod:`sidecar.stage.feedback`)."""
_Name = Annotated[str, Meta(max_length=256)]


class ResultProvenance(msgspec.Struct, kw_only=True):
    """Who judged the outcome (:class:`~sidecar.contract.Provenance`): absent on records of hooks
    that judged nothing and on records written before provenance existed."""

    evaluator: _Name
    evaluator_version: _Name
    base_model: _Name
    adapter: _Name | None = None
    adapter_version: _Name | None = None
    rule: _Name
    threshold: float | None = None

    @classmethod
    def of(cls, p: Provenance) -> ResultProvenance:
        return cls(
            evaluator=p.evaluator,
            evaluator_version=p.evaluator_version,
            base_model=p.base_model,
            adapter=p.adapter,
            adapter_version=p.adapter_version,
            rule=p.rule,
            threshold=p.threshold,
        )


class ResultRecord(msgspec.Struct, kw_only=True):
    """One effect: which hook call of which conversation, triggered where, and its outcome."""

    v: Literal[1]
    partition: Annotated[int, Meta(ge=0, le=2**31 - 1)]
    """The source partition."""
    position: Annotated[int, Meta(ge=0, le=2**63 - 1)]
    """The source offset the effect was triggered at (a timer: the partition's next offset)."""
    trigger: TriggeredBy
    kind: JournalKind
    conversation_id: Annotated[str, Meta(min_length=1, max_length=256)]
    turn: Annotated[int, Meta(ge=0, le=1_000_000_000)]
    close_reason: CloseReason | None = None
    end_reason: EndReason | None = None
    agent: str | None = None
    tenant: str | None = None
    messages: int = 0
    """How many messages the hook saw."""
    outcome: dict[str, Any] = {}
    """The hook's :data:`~sidecar.contract.Outcome` (a JSON object)."""
    provenance: ResultProvenance | UnsetType = UNSET
    """Who judged (evaluator, version, base model, adapter, rule, threshold); absent when nothing was judged."""
    group: Annotated[str, Meta(max_length=255)] = ""
    """The consumer group and the source topic, set by the writer: one results topic may serve several."""
    topic: Annotated[str, Meta(max_length=249)] = ""
    sig: Annotated[str, Meta(max_length=128)] | UnsetType | None = UNSET
    """HMAC-SHA256 over the fields recovery acts on, when signing keys are configured."""
