"""Live adapter routing: which adapter scores an agent's completion, the same on every replica.

The routing in the config file (``scoring.agents``) is where a fleet starts. ``adapters promote``
and ``adapters rollback`` (docs/adapter-loop.md) change it at run time by writing one row per agent
to a compacted topic (``scoring.routing.topic``, default ``<kafka.topic>.adapter-routes``). Every
replica follows that topic (:class:`~sidecar.fleet.table.CompactedTable`) and applies a row as it
arrives: the agent's adapter, completion rule, P(end) threshold, recorded validation and drift
baseline replace the configured ones, without a restart or a config edit. A replica is not ready
until it has read the rows that existed when it started, so it never scores with a superseded route.

A row is untrusted input: :func:`decode_route` checks every field and raises
:class:`~sidecar.fleet.table.InvalidRow`; invalid rows are counted by the table and ignored.
Rows are fenced (:func:`~sidecar.fleet.table.fenced`): the writer's generation, then its version,
must grow, so a job that read an old state and writes late cannot undo a newer decision.

Each row also carries the last decision taken for the agent (``promoted``, ``refused``,
``rolled_back``, ``released``) and up to :data:`MAX_HISTORY` earlier routes, which is what a rollback restores.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, Final, Literal

import structlog
from prometheus_client import CollectorRegistry, Counter, Gauge
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from sidecar.fleet.table import Change, CompactedTable, InvalidRow, TableMetrics, fenced
from sidecar.fleet.topics import ensure_compacted_topic
from sidecar.lifecycle import Health
from sidecar.scoring.config import AgentConfig, DriftBaselineConfig, RoutingConfig
from sidecar.source.config import KafkaConfig
from sidecar.supervision import Supervised, spawn

log = structlog.get_logger(__name__)

SCHEMA: Final = 1
MAX_HISTORY: Final = 8
MAX_ROUTE_BYTES: Final = 64 * 1024
MAX_AGENTS: Final = 10_000
_NAME = r"^[A-Za-z0-9_.:-]{1,64}$"
_frozen = ConfigDict(frozen=True, extra="forbid", strict=True)

# ``released``: an operator lifted a rollback's hold (``adapters release``); the route stays.
Decision = Literal["promoted", "refused", "rolled_back", "released"]


class Route(BaseModel):
    """What scores one agent's completion (the routing part of ``scoring.agents.<name>``)."""

    model_config = _frozen

    adapter: str | None = Field(None, pattern=_NAME, description="Served LoRA adapter name; none: instruct prompt.")
    completion_rule: Literal["greedy", "threshold"] = "greedy"
    p_end_threshold: float | None = Field(None, gt=0, lt=1, allow_inf_nan=False)
    validation_f1: float | None = Field(None, ge=0, le=1, allow_inf_nan=False)
    baseline: DriftBaselineConfig | None = None
    adapter_dir: str | None = Field(
        None, max_length=4096, description="Where the job reads the adapter (to re-validate it later)."
    )
    since: float = Field(0.0, ge=0, allow_inf_nan=False, description="Unix time the route took effect.")

    @model_validator(mode="after")
    def _threshold_rule_is_complete(self) -> Route:
        if self.completion_rule == "threshold" and (self.p_end_threshold is None or self.adapter is None):
            raise ValueError("completion_rule: threshold needs an adapter and p_end_threshold")
        return self

    def over(self, agent: AgentConfig) -> AgentConfig:
        """``agent``'s settings with this route's routing (budgets and sampling stay)."""
        return AgentConfig.model_validate(
            {
                **agent.model_dump(),
                "adapter": self.adapter,
                "completion_rule": self.completion_rule,
                "p_end_threshold": self.p_end_threshold,
                "validation_f1": self.validation_f1,
                "baseline": self.baseline.model_dump() if self.baseline else None,
                "adapter_manifest": None,
            }
        )

    def scores_like(self, other: Route) -> bool:
        """Whether both routes score the same way: adapter, rule, threshold and drift baseline (the
        recorded validation, directory and start time aside)."""
        keys = ("adapter", "completion_rule", "p_end_threshold", "baseline")
        return all(getattr(self, k) == getattr(other, k) for k in keys)

    @classmethod
    def of(cls, agent: AgentConfig) -> Route:
        """The routing part of configured settings (what a first promotion records as the previous route);
        the adapter's directory is its ``adapter_manifest``'s."""
        manifest = agent.adapter_manifest
        where = None if manifest is None else manifest.parent if manifest.name == "manifest.json" else manifest
        return cls(
            adapter=agent.adapter,
            completion_rule=agent.completion_rule,
            p_end_threshold=agent.p_end_threshold,
            validation_f1=agent.validation_f1,
            baseline=agent.baseline,
            adapter_dir=None if where is None or agent.adapter is None else str(where),
        )


class DecisionRecord(BaseModel):
    """The last decision taken for the agent, whatever it was."""

    model_config = _frozen

    kind: Decision
    at: float = Field(ge=0, allow_inf_nan=False)
    candidate: str | None = Field(None, pattern=_NAME)
    candidate_f1: float | None = Field(None, ge=0, le=1, allow_inf_nan=False)
    serving_f1: float | None = Field(None, ge=0, le=1, allow_inf_nan=False)
    reason: str = Field("", max_length=2000)


class RouteRow(BaseModel):
    """One row of the routing topic, under the key ``agent``."""

    model_config = _frozen

    schema_version: Literal[1] = 1
    agent: str = Field(pattern=_NAME)
    generation: int = Field(0, ge=0, le=2**62)
    version: int = Field(ge=1, le=2**62)
    route: Route
    decision: DecisionRecord
    history: tuple[Route, ...] = Field((), max_length=MAX_HISTORY)


def decode_route(value: bytes) -> RouteRow:
    """A row from the topic, or :class:`InvalidRow` saying what is wrong."""
    if len(value) > MAX_ROUTE_BYTES:
        raise InvalidRow(f"route row of {len(value)} bytes > {MAX_ROUTE_BYTES}")
    try:
        return RouteRow.model_validate_json(value)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "row"
        raise InvalidRow(f"invalid route row: {where}: {first['msg']} ({exc.error_count()} errors)") from None
    except (ValueError, RecursionError) as exc:
        raise InvalidRow(f"invalid route row ({type(exc).__name__})") from None


def encode_route(row: RouteRow) -> bytes:
    return row.model_dump_json(exclude_none=False).encode("utf-8")


def accept_route(current: RouteRow | None, new: RouteRow) -> bool:
    """Fenced, and a row only ever lands under its own agent's key (checked by the table's caller)."""
    return fenced(current, new)


class RouteMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.version = Gauge(
            "sidecar_adapter_route_version",
            "Version of the live routing row applied for the agent (0: the configured route).",
            ["agent"],
            registry=registry,
        )
        self.changes = Counter(
            "sidecar_adapter_route_changes_total",
            "Routing rows applied, by the decision they carry (promoted, refused, rolled_back, released). A restart "
            "reads each agent's latest row again.",
            ["agent", "decision"],
            registry=registry,
        )
        self.decided = Gauge(
            "sidecar_adapter_route_decision_timestamp_seconds",
            "When the latest decision of each kind was taken for the agent (Unix time).",
            ["agent", "decision"],
            registry=registry,
        )


class LiveRoutes:
    """The routing rows this replica applies over ``scoring.agents``.

    ``agent(name)`` is what every scoring decision reads. Listeners are told of every route that
    takes effect (``settings`` None: back to the configured route); a row that keeps the route but
    records a fresh validation F1 for it (a refusal re-scores the serving adapter) only updates the
    agent's ``validation_f1``, and tells the ``on_revalidated`` listeners (trust follows the figure;
    the drift window goes on, against the same baseline)."""

    def __init__(
        self,
        configured: Callable[[str | None], AgentConfig],
        registry: CollectorRegistry,
        label_of: Callable[[str | None], str],
    ) -> None:
        self._configured = configured
        self._label_of = label_of
        self._overrides: dict[str, AgentConfig] = {}
        self._rows: dict[str, RouteRow] = {}
        self._listeners: list[Callable[[str, AgentConfig | None], None]] = []
        self._revalidated: list[Callable[[str, AgentConfig], None]] = []
        self.metrics = RouteMetrics(registry)

    def agent(self, name: str | None) -> AgentConfig:
        if name is not None and name in self._overrides:
            return self._overrides[name]
        return self._configured(name)

    def row(self, name: str) -> RouteRow | None:
        return self._rows.get(name)

    def listen(
        self,
        callback: Callable[[str, AgentConfig | None], None],
        on_revalidated: Callable[[str, AgentConfig], None] | None = None,
    ) -> None:
        self._listeners.append(callback)
        if on_revalidated is not None:
            self._revalidated.append(on_revalidated)

    def apply(self, change: Change[RouteRow]) -> None:
        """A table change: the row's route replaces the agent's (a tombstone restores the configured one)."""
        name, row = change.key, change.value
        label = self._label_of(name)
        if row is None:
            self._rows.pop(name, None)
            if self._overrides.pop(name, None) is not None:
                self.metrics.version.labels(label).set(0)
                log.info("score.route_removed", agent=name)
                self._tell(name, None)
            return
        if row.agent != name:
            log.warning("score.route_key_mismatch", key=name, agent=row.agent)
            return
        previous = self._rows.get(name)
        self._rows[name] = row
        self.metrics.version.labels(label).set(row.version)
        self.metrics.changes.labels(label, row.decision.kind).inc()
        self.metrics.decided.labels(label, row.decision.kind).set(row.decision.at)
        # What scores the agent now: the row it holds, else its configured route (a first row that
        # is a refusal keeps the configured route, so it changes nothing either).
        before = previous.route if previous is not None else Route.of(self._configured(name))
        if before.scores_like(row.route):
            current = self.agent(name)
            f1 = row.route.validation_f1
            log.info(
                "score.route_unchanged",
                agent=name,
                decision=row.decision.kind,
                reason=row.decision.reason,
                version=row.version,
                validation_f1=f1,
            )
            if f1 is not None and f1 != current.validation_f1:
                settings = current.model_copy(update={"validation_f1": f1})
                self._overrides[name] = settings
                for revalidated in self._revalidated:
                    revalidated(name, settings)
            return
        settings = row.route.over(self._configured(name))
        self._overrides[name] = settings
        log.info(
            "score.route_applied",
            agent=name,
            adapter=row.route.adapter,
            rule=row.route.completion_rule,
            version=row.version,
            decision=row.decision.kind,
        )
        self._tell(name, settings)

    def _tell(self, name: str, settings: AgentConfig | None) -> None:
        for callback in self._listeners:
            callback(name, settings)


def routes_table(topic: str, kafka: KafkaConfig, registry: CollectorRegistry) -> CompactedTable[RouteRow]:
    """The routing topic's table (fenced rows, one per agent)."""
    return CompactedTable(
        "adapter-routes",
        topic,
        kafka,
        decode_route,
        TableMetrics.on(registry),
        accept=accept_route,
        max_rows=MAX_AGENTS,
        max_record_bytes=MAX_ROUTE_BYTES,
    )


def summary(row: RouteRow) -> dict[str, Any]:
    """A row as a person reads it (``adapters routes``)."""
    doc: dict[str, Any] = json.loads(encode_route(row))
    doc["history"] = [h.get("adapter") for h in doc["history"]]
    return doc


class RoutingFollower:
    """The component that keeps :class:`LiveRoutes` in step with the routing topic."""

    name = "adapter_routes"

    def __init__(
        self, config: RoutingConfig, kafka: KafkaConfig, routes: LiveRoutes, registry: CollectorRegistry
    ) -> None:
        self._config = config
        self._kafka = kafka
        self.topic = config.topic_name(kafka.topic)
        self.table = routes_table(self.topic, kafka, registry)
        self.table.subscribe(routes.apply)
        self._task: Supervised | None = None

    async def start(self) -> None:
        if self._task is None:
            self._task = spawn("adapter-routes-topic", self._run, until_cancelled=False)

    async def _run(self) -> None:
        if self._config.create_topic:
            await ensure_compacted_topic(self._kafka, self.topic, replication_factor=self._config.replication_factor)
        await self.table.start()

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            await task.stop()
        await self.table.stop()

    def health(self) -> Health:
        return self.table.health()
