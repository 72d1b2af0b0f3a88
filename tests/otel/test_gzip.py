"""gzip bodies: every member read (``cat a.gz b.gz``), bytes after the last refused, bombs bounded."""

from __future__ import annotations

import gzip

import pytest

from sidecar.otel.decode import gunzip
from sidecar.otel.errors import OtelRefused


def test_every_member_is_decompressed() -> None:
    body = gzip.compress(b"first ") + gzip.compress(b"") + gzip.compress(b"second")
    assert gunzip(body, max_bytes=1 << 20) == b"first second"


@pytest.mark.parametrize("tail", [b"x", b"\0" * 8, b"\x1f", b"garbage after the stream"])
def test_bytes_after_the_last_member_are_refused(tail: bytes) -> None:
    with pytest.raises(OtelRefused) as exc:
        gunzip(gzip.compress(b"abc") + tail, max_bytes=1 << 20)
    assert exc.value.reason == "invalid_gzip"


def test_a_truncated_second_member_is_refused() -> None:
    with pytest.raises(OtelRefused) as exc:
        gunzip(gzip.compress(b"abc") + gzip.compress(b"def")[:-6], max_bytes=1 << 20)
    assert exc.value.reason == "invalid_gzip"


def test_the_limit_counts_all_members() -> None:
    member = gzip.compress(b"\0" * (600 << 10))
    assert len(gunzip(member, max_bytes=1 << 20)) == 600 << 10
    with pytest.raises(OtelRefused) as exc:
        gunzip(member + member, max_bytes=1 << 20)
    assert exc.value.reason == "oversized"


def test_a_bomb_in_a_later_member_stops_at_the_limit() -> None:
    bomb = gzip.compress(b"ok") + gzip.compress(b"\0" * (50 << 20))
    with pytest.raises(OtelRefused) as exc:
        gunzip(bomb, max_bytes=1 << 20)
    assert exc.value.reason == "oversized"
