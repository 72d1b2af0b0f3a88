"""Prometheus metrics of goal clustering (closed label sets: kind, trigger, result)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

LLM_KINDS = ("summarize", "describe", "merge")


class ClusteringMetrics:
    """Every clustering metric, created on the registry the caller owns."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.llm_calls = Counter(
            "sidecar_clustering_llm_calls_total",
            "Chat requests made by goal clustering, by prompt kind.",
            ["kind"],
            registry=registry,
        )
        self.llm_invalid_answers = Counter(
            "sidecar_clustering_llm_invalid_answers_total",
            "Answers that were not valid JSON of the asked schema; a safe default was used.",
            ["kind"],
            registry=registry,
        )
        self.llm_errors = Counter(
            "sidecar_clustering_llm_errors_total",
            "Chat requests that failed (timeout, connection, HTTP error), by prompt kind.",
            ["kind"],
            registry=registry,
        )
        self.runs = Counter(
            "sidecar_clustering_runs_total",
            "Re-clustering runs by trigger (initial, schedule, drift, manual) and result (ok, error, skipped, "
            "not_leader: with clustering.fleet, only the fleet's leader runs, and a run whose replica stopped "
            "leading before its model was written steps down).",
            ["trigger", "result"],
            registry=registry,
        )
        self.run_duration = Histogram(
            "sidecar_clustering_run_duration_seconds",
            "Wall time of one successful re-clustering run.",
            buckets=(0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800),
            registry=registry,
        )
        self.clusters = Gauge("sidecar_clustering_clusters", "Goal clusters currently live.", registry=registry)
        self.cluster_size = Gauge(
            "sidecar_clustering_goal_conversations",
            "Reservoir conversations per goal (stable cluster id; top N, other) at the last re-clustering.",
            ["goal"],
            registry=registry,
        )
        self.goal_info = Gauge(
            "sidecar_goal_info",
            "1 per live goal: its stable id (the goal label of every other metric) and its published name.",
            ["goal", "name"],
            registry=registry,
        )
        self.reservoir = Gauge(
            "sidecar_clustering_reservoir_conversations",
            "Conversation summaries held for the next re-clustering.",
            registry=registry,
        )
        self.assignments = Counter(
            "sidecar_clustering_assignments_total",
            "Ended conversations assigned to a goal (result: assigned, unclustered, error).",
            ["result"],
            registry=registry,
        )
        self.assignment_distance = Gauge(
            "sidecar_clustering_assignment_distance",
            "Running mean Euclidean distance of new conversations to their cluster centroid.",
            registry=registry,
        )


class FleetGoalMetrics:
    """``sidecar_goal_fleet_*``: the inputs and models of ``clustering.fleet``."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.inputs = Counter(
            "sidecar_goal_fleet_inputs_total",
            "Goal inputs (summary + embedding) by outcome: written, dropped (queue full), write_error, read, invalid.",
            ["outcome"],
            registry=registry,
        )
        self.models = Counter(
            "sidecar_goal_fleet_models_total",
            "Fleet goal models by outcome: published (by this replica as leader), publish_error, applied, "
            "not_leader (a run finished after this replica stopped leading).",
            ["outcome"],
            registry=registry,
        )
