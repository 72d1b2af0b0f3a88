"""Journal records read back from the results topic: validated, optionally signed.

A restart trusts the results topic to say which effects already happened. Anything that can write
to that topic could otherwise silence hooks (a forged outcome suppresses the real one) or end
conversations (a forged timer transition), and one malformed record (``1e999``, 100,000 nested
brackets) must not make recovery raise on every start. So every record is decoded in one bounded
pass into the type the writer wrote, :class:`~sidecar.source.result_record.ResultRecord` (msgspec:
every field checked against its type and range, nesting depth limited) and, when
``kafka.journal_signing_keys`` is set, must carry an HMAC-SHA256 signature over the fields
recovery acts on. A record that fails either check is skipped, counted by reason, and never acted
on. The outcome itself is not signed: recovery never reads it.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping, Sequence
from typing import Any

import msgspec

from sidecar.source.result_record import ResultRecord

_SEP = "\x1f"
_DECODER = msgspec.json.Decoder(ResultRecord)


def signed_fields(record: ResultRecord) -> bytes:
    """The canonical bytes a signature covers (what recovery acts on, in a fixed order)."""
    parts = (
        record.v,
        record.group,
        record.topic,
        record.partition,
        record.position,
        record.trigger,
        record.kind,
        record.conversation_id,
        record.turn,
    )
    return _SEP.join(str(p) for p in parts).encode("utf-8", "surrogatepass")


class JournalSigner:
    """Signs records with the first key; verifies against any of them (key rotation)."""

    def __init__(self, keys: Sequence[bytes]) -> None:
        self._keys = [k for k in keys if k]

    @property
    def enabled(self) -> bool:
        return bool(self._keys)

    def _mac(self, key: bytes, record: ResultRecord) -> str:
        return hmac.new(key, signed_fields(record), hashlib.sha256).hexdigest()

    def sign(self, record: ResultRecord) -> None:
        if self._keys:
            record.sig = self._mac(self._keys[0], record)

    def verify(self, entry: ResultRecord) -> bool:
        if not self._keys:
            return True
        sig = entry.sig
        if not isinstance(sig, str):
            return False
        return any(hmac.compare_digest(self._mac(k, entry), sig) for k in self._keys)


def entry_from_mapping(record: Mapping[str, Any]) -> ResultRecord | None:
    """A record already parsed into a mapping, checked as :func:`read_entry` checks bytes; None if invalid."""
    try:
        return msgspec.convert(record, ResultRecord)
    except (msgspec.ValidationError, RecursionError):
        return None


def read_entry(value: bytes | None, signer: JournalSigner) -> tuple[ResultRecord | None, str | None]:
    """``(entry, None)`` for a valid, trusted record; ``(None, reason)`` otherwise.

    Reasons: ``invalid`` (not JSON, wrong types or ranges, too deep), ``unsigned``,
    ``bad_signature``. Never raises, whatever the bytes.
    """
    if not value:
        return None, "invalid"
    try:
        entry = _DECODER.decode(value)
    except (msgspec.DecodeError, RecursionError):  # DecodeError includes ValidationError
        return None, "invalid"
    if signer.enabled:
        if not isinstance(entry.sig, str):
            return None, "unsigned"
        if not signer.verify(entry):
            return None, "bad_signature"
    return entry, None
