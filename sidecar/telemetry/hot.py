"""Counters and histograms for the per-record hot path, without prometheus_client's per-update lock.

prometheus_client guards every update with a ``threading.Lock``: about 0.5 us per ``Counter.inc``
and 1 us per ``Histogram.observe`` here, and the streaming core makes four of them per record. The
hot path runs on the event-loop thread only, and ``/metrics`` is rendered on that same loop, so
the lock protects nothing there. These families keep plain numbers and render exactly as
prometheus_client's counters and histograms do (same names, labels, ``le`` values, ``_created``).

Update them from the event-loop thread only; anything updated from other threads keeps using
prometheus_client's own types.
"""

from __future__ import annotations

import bisect
import math
import time
from collections.abc import Iterable, Sequence
from typing import Generic, TypeVar

from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString


class CounterChild:
    __slots__ = ("created", "value")

    def __init__(self) -> None:
        self.value = 0.0
        self.created = time.time()

    def inc(self, amount: float = 1.0) -> None:
        if amount < 0:
            raise ValueError("counters can only be incremented by non-negative amounts")
        self.value += amount


class HistogramChild:
    __slots__ = ("_bounds", "counts", "created", "sum")

    def __init__(self, bounds: Sequence[float]) -> None:
        self._bounds = bounds
        self.counts = [0] * len(bounds)
        self.sum = 0.0
        self.created = time.time()

    def observe(self, amount: float) -> None:
        # First bucket whose upper bound is >= amount (the last bound is +Inf).
        self.counts[bisect.bisect_left(self._bounds, amount)] += 1
        self.sum += amount


C = TypeVar("C", CounterChild, HistogramChild)


class _Family(Collector, Generic[C]):
    """A labelled family registered as a collector; children are created by ``labels()``, and a
    family without labels has its one child from the start (``solo``)."""

    def __init__(
        self, name: str, documentation: str, labelnames: Iterable[str], registry: CollectorRegistry | None
    ) -> None:
        self._name = name
        self._documentation = documentation
        self._labelnames = tuple(labelnames)
        self._children: dict[tuple[str, ...], C] = {}
        self._solo: C | None = self._new_child() if not self._labelnames else None
        if self._solo is not None:
            self._children[()] = self._solo
        if registry is not None:
            registry.register(self)

    def _new_child(self) -> C:
        raise NotImplementedError

    def labels(self, *values: str) -> C:
        key = tuple(str(v) for v in values)
        if len(key) != len(self._labelnames):
            raise ValueError(f"{self._name} takes labels {self._labelnames}, got {key}")
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = self._new_child()
        return child

    def _only_child(self, method: str) -> C:
        if self._solo is None:
            raise ValueError(f"{self._name} has labels {self._labelnames}: use labels(...).{method}()")
        return self._solo

    def describe(self) -> list[Metric]:
        return [self._family()]

    def _family(self) -> Metric:
        raise NotImplementedError


class HotCounter(_Family[CounterChild]):
    """A counter family; ``name`` without ``_total``, as with prometheus_client."""

    def __init__(
        self, name: str, documentation: str, labelnames: Iterable[str] = (), registry: CollectorRegistry | None = None
    ) -> None:
        super().__init__(name.removesuffix("_total"), documentation, labelnames, registry)

    def _new_child(self) -> CounterChild:
        return CounterChild()

    def inc(self, amount: float = 1.0) -> None:
        self._only_child("inc").inc(amount)

    def _family(self) -> CounterMetricFamily:
        return CounterMetricFamily(self._name, self._documentation, labels=self._labelnames)

    def collect(self) -> list[Metric]:
        family = self._family()
        for values, child in list(self._children.items()):
            family.add_metric(list(values), child.value, created=child.created)
        return [family]


class HotHistogram(_Family[HistogramChild]):
    """A histogram family with fixed bucket upper bounds (``+Inf`` is added)."""

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Iterable[str] = (),
        *,
        buckets: Sequence[float],
        registry: CollectorRegistry | None = None,
    ) -> None:
        bounds = sorted(float(b) for b in buckets)
        if not bounds or any(math.isnan(b) for b in bounds) or len(set(bounds)) != len(bounds):
            raise ValueError(f"{name}: buckets must be distinct numbers")
        if bounds[-1] != math.inf:
            bounds.append(math.inf)
        self._bounds = tuple(bounds)
        self._le = [floatToGoString(b) for b in bounds]  # type: ignore[no-untyped-call]
        super().__init__(name, documentation, labelnames, registry)

    def _new_child(self) -> HistogramChild:
        return HistogramChild(self._bounds)

    def observe(self, amount: float) -> None:
        self._only_child("observe").observe(amount)

    def _family(self) -> HistogramMetricFamily:
        return HistogramMetricFamily(self._name, self._documentation, labels=self._labelnames)

    def collect(self) -> list[Metric]:
        family = self._family()
        for values, child in list(self._children.items()):
            cumulative, buckets = 0, []
            for le, count in zip(self._le, child.counts, strict=True):
                cumulative += count
                buckets.append((le, float(cumulative)))
            family.add_metric(list(values), buckets, child.sum)
            labels = dict(zip(self._labelnames, values, strict=True))
            family.samples.append(Sample(f"{self._name}_created", labels, child.created))
        return [family]
