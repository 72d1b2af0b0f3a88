"""Conversation data on the network: served without credentials only on a loopback address.

The operator routes (``/escalations``, ``/trees/{id}``, ``/clusters``) show what was derived from
conversations. A listener that serves them on an address other than loopback (``127.0.0.1``,
``::1``, ``localhost``) without basic-auth users or bearer tokens would hand them to anyone who
reaches the port, which with the defaults (``0.0.0.0``, plain HTTP) is everyone on the network. Such
a listener does not serve them unless ``http.operator.allow_unauthenticated`` says so in so many
words (something else guards the port: a NetworkPolicy, a mesh, an authenticating proxy). Either
way the start logs one warning saying what happened and how to change it, and ``/readyz`` lists the
listener under the ``conversation-data`` check (never failing readiness).

Goal names on ``/metrics`` follow the same rule on the scrape listener: the ``name`` label of
``sidecar_goal_info`` is generated from conversation summaries. Without credentials on a
non-loopback address, and unless ``http.scrape.allow_unauthenticated`` (or, when the operator routes
share the port, ``http.operator.allow_unauthenticated``) says so, ``/metrics`` serves the series with
an empty ``name`` (:class:`RedactedRegistry`; in Prometheus an empty label is no label, so
dashboards show the goal ids), with the same one warning and ``/readyz`` line.
"""

from __future__ import annotations

import copy
import ipaddress
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final, Literal

import structlog
from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import Metric
from prometheus_client.samples import Sample

from sidecar.lifecycle import Health
from sidecar.telemetry.config import Binding, HttpConfig

log = structlog.get_logger()

CHECK: Final = "conversation-data"
# Metric families whose label values are derived from conversations, and those labels.
CONVERSATION_LABELS: Final[Mapping[str, tuple[str, ...]]] = {"sidecar_goal_info": ("name",)}


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a name: it may resolve to anything


@dataclass(frozen=True, slots=True)
class Exposure:
    """A listener that would serve conversation data without credentials on a non-loopback address."""

    listener: str
    host: str
    port: int
    served: bool
    what: Literal["routes", "goal_names"] = "routes"

    def warn(self) -> None:
        where = f"{self.host}:{self.port}"
        if self.what == "goal_names":
            self._warn_goal_names(where)
        elif self.served:
            log.warning(
                "http.conversation_data_unauthenticated",
                listener=self.listener,
                address=where,
                detail="the operator routes are served without credentials (http.operator.allow_unauthenticated)",
            )
        else:
            log.warning(
                "http.conversation_data_withheld",
                listener=self.listener,
                address=where,
                detail="the operator routes are not served: set a web_config_file with basic_auth_users or "
                "bearer_token_sha256 for the listener that serves them, bind it to 127.0.0.1, or set "
                "http.operator.allow_unauthenticated: true if something else guards the port",
            )

    def _warn_goal_names(self, where: str) -> None:
        if self.served:
            log.warning(
                "http.goal_names_unauthenticated",
                listener=self.listener,
                address=where,
                detail="goal names (sidecar_goal_info) are served on /metrics without credentials "
                "(http.scrape.allow_unauthenticated or http.operator.allow_unauthenticated)",
            )
        else:
            log.warning(
                "http.goal_names_withheld",
                listener=self.listener,
                address=where,
                detail="/metrics serves sidecar_goal_info without goal names: set a web_config_file with "
                "basic_auth_users or bearer_token_sha256 for the scrape listener, bind it to 127.0.0.1, or set "
                "http.scrape.allow_unauthenticated: true if something else guards the port",
            )

    def describe(self) -> str:
        where = f"{self.listener} ({self.host}:{self.port}): "
        if self.what == "goal_names":
            return where + (
                "goal names on /metrics served WITHOUT authentication"
                if self.served
                else "goal names on /metrics withheld (no authentication)"
            )
        return where + ("served WITHOUT authentication" if self.served else "withheld (no authentication)")


def exposure(
    listener: str,
    host: str,
    port: int,
    *,
    protected: bool,
    allow: bool,
    what: Literal["routes", "goal_names"] = "routes",
) -> Exposure | None:
    """What to do with the conversation data of a listener; None when it is protected or loopback."""
    if protected or is_loopback(host):
        return None
    return Exposure(listener, host, port, served=allow, what=what)


def goal_names_exposure(config: HttpConfig, binding: Binding, *, protected: bool) -> Exposure | None:
    """The goal names on ``/metrics`` of a listener that serves the scrape routes; None when served
    without a second thought (credentials, loopback) or when the listener does not serve ``/metrics``."""
    if not binding.scrape_routes:
        return None
    shared_and_open = binding.operator_routes and config.operator.allow_unauthenticated
    allow = config.scrape.allow_unauthenticated or shared_and_open
    return exposure(binding.name, binding.host, binding.port, protected=protected, allow=allow, what="goal_names")


def serves_conversation_labels(registry: CollectorRegistry) -> bool:
    """Whether the registry holds a metric family with conversation-derived label values."""
    return any(family.name in CONVERSATION_LABELS for family in registry.collect())


class RedactedRegistry(CollectorRegistry):
    """A view of ``registry`` for exposition in which the :data:`CONVERSATION_LABELS` are empty."""

    def __init__(self, registry: CollectorRegistry) -> None:
        super().__init__(auto_describe=False)
        self._inner = registry

    def collect(self) -> Iterable[Metric]:
        for family in self._inner.collect():
            labels = CONVERSATION_LABELS.get(family.name)
            if not labels:
                yield family
                continue
            redacted = copy.copy(family)
            redacted.samples = [
                Sample(s.name, {k: "" if k in labels else v for k, v in s.labels.items()}, *s[2:])
                for s in family.samples
            ]
            yield redacted


class ExposureReport:
    """The ``conversation-data`` line of ``/readyz``: listed, never gating readiness."""

    def __init__(self, exposures: Sequence[Exposure]) -> None:
        self._exposures = tuple(exposures)

    def health(self) -> Health:
        return Health(CHECK, True, "; ".join(e.describe() for e in self._exposures))
