"""Metrics of the streaming core (source, state, processor). Names follow docs/metrics.md.

The ones updated once or more per record use the lock-free families of :mod:`sidecar.telemetry.hot`
(the processor runs on the event-loop thread); the rest are prometheus_client's own.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from sidecar.telemetry.hot import CounterChild, HistogramChild, HotCounter, HotHistogram

LATENCY_BUCKETS = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)

# From a journal that fits in memory at once to one read in full under retries.
RECOVERY_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)


class StreamMetrics:
    """Everything the Kafka source and the partition processors export."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.events_consumed = HotCounter(
            "sidecar_events_consumed_total",
            "Kafka records taken from the source topic.",
            registry=registry,
        )
        self.events_replayed = HotCounter(
            "sidecar_events_replayed_total",
            "Records re-read after a restart or rebalance to rebuild state (no hooks fired).",
            registry=registry,
        )
        self.dead_lettered = Counter(
            "sidecar_events_dead_lettered_total",
            "Records sent to the dead-letter topic, by reason.",
            ["reason"],
            registry=registry,
        )
        self.events_skipped = Counter(
            "sidecar_events_skipped_total",
            "Records neither processed nor dead-lettered, by reason (conversation_finished_at_handover: an event "
            "of a conversation the results journal shows finished, re-read by a partition's new owner; harmless).",
            ["reason"],
            registry=registry,
        )
        self.events_skipped.labels("conversation_finished_at_handover")
        self.conversations_active = Gauge(
            "sidecar_conversations_active",
            "Open conversations held in memory.",
            registry=registry,
        )
        self.conversations_ended = Counter(
            "sidecar_conversations_finalised_total",
            "Conversations finalised, by reason (end_event, idle_ttl, max_lifetime, evicted).",
            ["reason"],
            registry=registry,
        )
        self.state_bytes = Gauge(
            "sidecar_state_memory_bytes",
            "Estimated bytes held by conversation state, all partitions (bounded by state.max_memory_bytes).",
            registry=registry,
        )
        self.commit_age = Gauge(
            "sidecar_commit_age_seconds",
            "Per owned partition: seconds it has held records past its committed offset without a successful "
            "commit moving that offset (0 when nothing is uncommitted); a failed commit does not reset it.",
            ["partition"],
            registry=registry,
        )
        self.oldest_conversation_age = Gauge(
            "sidecar_oldest_conversation_age_seconds",
            "Per owned partition: age of its oldest open conversation (from its first record's Kafka "
            "timestamp), 0 with none open.",
            ["partition"],
            registry=registry,
        )
        self.oldest_effect_age = Gauge(
            "sidecar_oldest_pending_effect_seconds",
            "How long the oldest effect still pinning a commit point has been pending.",
            registry=registry,
        )
        self.journal_skipped = Counter(
            "sidecar_journal_records_skipped_total",
            "Results-topic records ignored during recovery, by reason (invalid, unsigned, bad_signature).",
            ["reason"],
            registry=registry,
        )
        self.processing_seconds = HotHistogram(
            "sidecar_event_processing_seconds",
            "From a record's fetch to the end of its processing (decode, state, hook dispatch).",
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.hook_dispatch_seconds = HotHistogram(
            "sidecar_hook_dispatch_seconds",
            "From a record's fetch to the hook it triggers being called.",
            ["kind"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.hooks_fired = HotCounter(
            "sidecar_hooks_fired_total",
            "Hook calls dispatched, by kind.",
            ["kind"],
            registry=registry,
        )
        self.hooks_suppressed = HotCounter(
            "sidecar_hooks_suppressed_total",
            "Hook calls skipped because their outcome was already recorded before a restart.",
            ["kind"],
            registry=registry,
        )
        self.hook_errors = Counter(
            "sidecar_hook_errors_total",
            "Hook awaitables that raised; the error is recorded as outcome.",
            ["kind"],
            registry=registry,
        )
        self.dead_letter_failures = Counter(
            "sidecar_dead_letter_failures_total",
            "Rejected records whose dead-letter copy could not be written for a reason other than a Kafka "
            "outage (their position is logged as event.dead_letter_failed).",
            registry=registry,
        )
        self.sink_errors = Counter(
            "sidecar_stage_sink_errors_total",
            "Effects a post-score sink failed on unexpectedly (logged as stage.sink_failed); the effect went on.",
            ["sink"],
            registry=registry,
        )
        self.effects_pending = Gauge(
            "sidecar_effects_pending",
            "Hook calls and dead-letter writes not yet safely recorded.",
            registry=registry,
        )
        self.results_write_errors = Counter(
            "sidecar_results_write_errors_total",
            "Failed writes to the results or dead-letter topic, by kind: retryable and permanent (both retried), "
            "oversized (the outcome was replaced by an error marker).",
            ["kind"],
            registry=registry,
        )
        self.release_unflushed = Counter(
            "sidecar_release_unflushed_total",
            "Partitions given up (revoke, shutdown) while journal writes were still unacknowledged: "
            "an effect may then be recorded twice.",
            registry=registry,
        )
        self.members_fenced = Counter(
            "sidecar_member_fenced_total",
            "Times this member stopped writing for its partitions because it may have lost them, by "
            "reason (loop_stalled, generation_lost, commit_refused); the next owner redoes what was pending.",
            ["reason"],
            registry=registry,
        )
        for reason in ("loop_stalled", "generation_lost", "commit_refused"):
            self.members_fenced.labels(reason)
        self.commits = Counter(
            "sidecar_commits_total",
            "Offset commit requests, by result (ok, failed).",
            ["result"],
            registry=registry,
        )
        # Both series exist from the start: a counter born at its first failure, already at 1, is
        # invisible to increase(), and the failing-commits alert would miss it.
        for result in ("ok", "failed"):
            self.commits.labels(result)
        self.consumer_lag = Gauge(
            "sidecar_consumer_lag_records",
            "Per owned partition: the high-water mark minus the offset of the next record to process "
            "(records fetched but not yet processed count as lag; the committed offset may trail further).",
            ["partition"],
            registry=registry,
        )
        self.partitions_assigned = Gauge(
            "sidecar_partitions_assigned",
            "Source partitions owned by this replica.",
            registry=registry,
        )
        self.partitions_paused = Gauge(
            "sidecar_partitions_paused",
            "Source partitions paused for backpressure.",
            registry=registry,
        )
        self.recoveries = Counter(
            "sidecar_partition_recoveries_total",
            "Partitions rebuilt from Kafka after assignment.",
            registry=registry,
        )
        self.recovery_errors = Counter(
            "sidecar_partition_recovery_errors_total",
            "Transient Kafka errors while loading a partition's recovery plan (retried).",
            registry=registry,
        )
        self.recovery_seconds = Histogram(
            "sidecar_partition_recovery_seconds",
            "Time to load an assigned partition's recovery plan (committed offset, journal, finished "
            "conversations), retries included; the partition replays and then consumes after it.",
            buckets=RECOVERY_BUCKETS,
            registry=registry,
        )
        self.recovery_journal_records = Counter(
            "sidecar_partition_recovery_journal_records_total",
            "Results records read back from the journal while loading recovery plans.",
            registry=registry,
        )
        self.recoveries_without_metadata = Counter(
            "sidecar_partition_recoveries_without_metadata_total",
            "Recoveries from a committed offset without the sidecar's commit metadata (brokers that drop "
            "it, or a commit made by another tool): the journal partition was read from its beginning.",
            registry=registry,
        )
        self.kafka_capability = Gauge(
            "sidecar_kafka_capability",
            "What the brokers answered at start-up, one series per capability and state (present, missing, "
            "unknown); 1 marks the state found.",
            ["capability", "state"],
            registry=registry,
        )
        self.processing_guarantee = Gauge(
            "sidecar_processing_guarantee",
            "1 for the processing guarantee the sidecar runs with (kafka.processing_guarantee).",
            ["guarantee"],
            registry=registry,
        )

    # The families with a ``partition`` label: every one of them loses its series when the
    # partition is given up, so a rebalance leaves no stale value behind on the old owner.
    PER_PARTITION = ("consumer_lag", "commit_age", "oldest_conversation_age")

    def forget_partition(self, partition: int) -> None:
        """Remove every per-partition series of ``partition`` (revoked or released); idempotent."""
        for name in self.PER_PARTITION:
            family: Gauge = getattr(self, name)
            family.remove(str(partition))  # a no-op for a series never set


class StreamMetricsCache:
    """Resolved label children of :class:`StreamMetrics` for the per-record hot path.

    ``Counter.labels()`` costs a lock and a dict lookup per call; at tens of thousands of records
    per second that is a measurable share of the processing time, so children are resolved once.
    """

    def __init__(self, metrics: StreamMetrics) -> None:
        self._m = metrics
        self.consumed = metrics.events_consumed.labels()
        self.replayed = metrics.events_replayed.labels()
        self.processing = metrics.processing_seconds.labels()
        self.hook_errors = metrics.hook_errors
        self.dead_letter_failures = metrics.dead_letter_failures
        self._children: dict[tuple[str, str], Any] = {}

    def _child(self, family: str, label: str) -> Any:
        key = (family, label)
        child = self._children.get(key)
        if child is None:
            child = getattr(self._m, family).labels(label)
            self._children[key] = child
        return child

    def fired(self, kind: str) -> CounterChild:
        return self._child("hooks_fired", kind)  # type: ignore[no-any-return]

    def suppressed(self, kind: str) -> CounterChild:
        return self._child("hooks_suppressed", kind)  # type: ignore[no-any-return]

    def dispatch(self, kind: str) -> HistogramChild:
        return self._child("hook_dispatch_seconds", kind)  # type: ignore[no-any-return]

    def ended(self, reason: str) -> Counter:
        return self._child("conversations_ended", reason)  # type: ignore[no-any-return]

    def dead(self, reason: str) -> Counter:
        return self._child("dead_lettered", reason)  # type: ignore[no-any-return]
