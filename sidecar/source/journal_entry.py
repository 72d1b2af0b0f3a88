"""Journal records read back from the results topic: validated, optionally signed.

A restart trusts the results topic to say which effects already happened. Anything that can write
to that topic could otherwise silence hooks (a forged outcome suppresses the real one) or end
conversations (a forged timer transition), and one malformed record (``1e999``, 100,000 nested
brackets) must not make recovery raise on every start. So every record is parsed in one bounded
pass (pydantic-core: numbers checked against their types and ranges, nesting depth limited) and,
when ``kafka.journal_signing_keys`` is set, must carry an HMAC-SHA256 signature over the fields
recovery acts on. A record that fails either check is skipped, counted by reason, and never acted
on. The outcome itself is not signed: recovery never reads it.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError

from sidecar.contract import HookKind

SIGNATURE_FIELD = "sig"
_SEP = "\x1f"


class JournalEntry(BaseModel):
    """The fields of a results record that recovery acts on."""

    model_config = ConfigDict(extra="ignore", frozen=True, strict=True)

    v: Literal[1]
    group: Annotated[str, StringConstraints(max_length=255)] = ""
    topic: Annotated[str, StringConstraints(max_length=249)] = ""
    partition: Annotated[int, Field(ge=0, le=2**31 - 1)]
    position: Annotated[int, Field(ge=0, le=2**63 - 1)]
    trigger: Literal["record", "timer"]
    kind: HookKind
    conversation_id: Annotated[str, StringConstraints(min_length=1, max_length=256)]
    turn: Annotated[int, Field(ge=0, le=1_000_000_000)]
    sig: Annotated[str, StringConstraints(max_length=128)] | None = None

    @classmethod
    def from_mapping(cls, record: Mapping[str, Any]) -> JournalEntry | None:
        try:
            return cls.model_validate(record)
        except ValidationError:
            return None


def signed_fields(record: Mapping[str, Any]) -> bytes:
    """The canonical bytes a signature covers (what recovery acts on, in a fixed order)."""
    parts = (
        record.get("v"), record.get("group"), record.get("topic"), record.get("partition"),
        record.get("position"), record.get("trigger"), record.get("kind"), record.get("conversation_id"),
        record.get("turn"),
    )
    return _SEP.join(str(p) for p in parts).encode("utf-8", "surrogatepass")


class JournalSigner:
    """Signs records with the first key; verifies against any of them (key rotation)."""

    def __init__(self, keys: Sequence[bytes]) -> None:
        self._keys = [k for k in keys if k]

    @property
    def enabled(self) -> bool:
        return bool(self._keys)

    def _mac(self, key: bytes, record: Mapping[str, Any]) -> str:
        return hmac.new(key, signed_fields(record), hashlib.sha256).hexdigest()

    def sign(self, record: dict[str, Any]) -> None:
        if self._keys:
            record[SIGNATURE_FIELD] = self._mac(self._keys[0], record)

    def verify(self, entry: JournalEntry) -> bool:
        if not self._keys:
            return True
        if entry.sig is None:
            return False
        fields = entry.model_dump()
        return any(hmac.compare_digest(self._mac(k, fields), entry.sig) for k in self._keys)


def read_entry(value: bytes | None, signer: JournalSigner) -> tuple[JournalEntry | None, str | None]:
    """``(entry, None)`` for a valid, trusted record; ``(None, reason)`` otherwise.

    Reasons: ``invalid`` (not JSON, wrong types or ranges, too deep), ``unsigned``,
    ``bad_signature``. Never raises, whatever the bytes.
    """
    if not value:
        return None, "invalid"
    try:
        entry = JournalEntry.model_validate_json(value)
    except ValidationError:
        return None, "invalid"
    except ValueError:  # pydantic-core's own limits (e.g. a number too large to represent)
        return None, "invalid"
    if signer.enabled:
        if entry.sig is None:
            return None, "unsigned"
        if not signer.verify(entry):
            return None, "bad_signature"
    return entry, None
