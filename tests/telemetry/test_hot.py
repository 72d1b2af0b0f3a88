"""The lock-free hot-path families render exactly as prometheus_client's own, in both formats."""

from __future__ import annotations

import re
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics

from sidecar.telemetry.hot import HotCounter, HotHistogram

BUCKETS = (0.001, 0.01, 0.1, 1.0)
# Values on, between, below and above the bounds; each bucket's edge is inclusive (le).
VALUES = [0.0, 0.0005, 0.001, 0.002, 0.01, 0.5, 1.0, 7.0, 1e9]


def _fill(counter: Any, histogram: Any, labelled: bool) -> None:
    for i, v in enumerate(VALUES):
        kind = "a" if i % 2 else "b"
        c = counter.labels(kind) if labelled else counter
        h = histogram.labels(kind) if labelled else histogram
        c.inc()
        c.inc(v)
        h.observe(v)


def _without_created(text: str) -> str:
    return re.sub(r"(?m)^.*_created.*\n", "", text)


@pytest.mark.parametrize("labelled", [True, False])
@pytest.mark.parametrize("encode", [generate_latest, generate_openmetrics])
def test_same_exposition_as_prometheus_client(labelled: bool, encode: Any) -> None:
    labels = ["kind"] if labelled else []
    ref, hot = CollectorRegistry(), CollectorRegistry()
    _fill(
        Counter("x_events_total", "Events.", labels, registry=ref),
        Histogram("x_latency_seconds", "Latency.", labels, buckets=BUCKETS, registry=ref),
        labelled,
    )
    _fill(
        HotCounter("x_events_total", "Events.", labels, registry=hot),
        HotHistogram("x_latency_seconds", "Latency.", labels, buckets=BUCKETS, registry=hot),
        labelled,
    )
    want = encode(ref).decode()
    got = encode(hot).decode()
    assert _without_created(got) == _without_created(want)
    # _created is there too (its value is a time, so only the lines are compared)
    assert [ln.split(" ")[0] for ln in got.splitlines() if "_created" in ln] == [
        ln.split(" ")[0] for ln in want.splitlines() if "_created" in ln
    ]


def test_sample_values_are_readable_by_name() -> None:
    reg = CollectorRegistry()
    h = HotHistogram("y_seconds", "Y.", ["kind"], buckets=BUCKETS, registry=reg)
    h.labels("k").observe(0.01)
    h.labels("k").observe(0.02)
    assert reg.get_sample_value("y_seconds_bucket", {"kind": "k", "le": "0.01"}) == 1
    assert reg.get_sample_value("y_seconds_bucket", {"kind": "k", "le": "+Inf"}) == 2
    assert reg.get_sample_value("y_seconds_count", {"kind": "k"}) == 2
    assert reg.get_sample_value("y_seconds_sum", {"kind": "k"}) == pytest.approx(0.03)


def test_misuse_is_refused() -> None:
    reg = CollectorRegistry()
    c = HotCounter("z_total", "Z.", ["kind"], registry=reg)
    with pytest.raises(ValueError, match="labels"):
        c.inc()
    with pytest.raises(ValueError, match="labels"):
        c.labels("a", "b")
    with pytest.raises(ValueError, match="non-negative"):
        c.labels("a").inc(-1)
    with pytest.raises(ValueError, match="labels"):
        HotHistogram("w_seconds", "W.", ["kind"], buckets=BUCKETS, registry=reg).observe(1.0)
    with pytest.raises(ValueError, match="distinct"):
        HotHistogram("v_seconds", "V.", buckets=(1.0, 1.0), registry=reg)
    with pytest.raises(ValueError, match="Duplicated"):
        HotCounter("z_total", "again", registry=reg)  # the registry refuses a second family of a name
