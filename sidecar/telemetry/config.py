"""HTTP endpoint and logging configuration."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Self

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

_SHA256_HEX = re.compile(r"^[0-9a-f]{64}$")
MAX_BEARER_TOKENS = 64


class ListenerConfig(BaseModel):
    """One listener of the HTTP server: where it binds, and who may use it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    enabled: bool = Field(True, description="Serve this listener's routes at all.")
    host: str | None = Field(
        None, description="Bind address; none: http.host. For the operator listener, only with its own port."
    )
    port: int | None = Field(
        None,
        ge=0,
        le=65535,
        description="scrape: none means http.port. operator: none serves the operator routes on the scrape "
        "listener (one port, as before), a port gives them a listener of their own. 0 picks a free port.",
    )
    web_config_file: Path | None = Field(
        None,
        description="A web-config file in the Prometheus exporter-toolkit format (tls_server_config, "
        "basic_auth_users, http_server_config.headers); docs/security.md. None: plain HTTP, no authentication.",
    )
    allow_unauthenticated: bool = Field(
        False,
        description="Serve conversation-derived data without credentials on an address other than loopback "
        "(something else guards the port: a NetworkPolicy, a mesh, a proxy). operator: the conversation-derived "
        "routes; scrape: the goal names on /metrics (sidecar_goal_info's name label). Without it, a listener "
        "with neither basic_auth_users nor bearer_token_sha256 serves them on 127.0.0.1, ::1 or localhost only "
        "(/metrics then with empty goal names); docs/security.md.",
    )
    bearer_token_sha256: tuple[str, ...] = Field(
        (),
        description="Bearer tokens accepted besides the web-config file's users, each as the lowercase hex "
        "SHA-256 of the token (printf %s TOKEN | sha256sum).",
    )

    @field_validator("bearer_token_sha256")
    @classmethod
    def _digests(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if len(value) > MAX_BEARER_TOKENS:
            raise ValueError(f"at most {MAX_BEARER_TOKENS} tokens")
        for item in value:
            if not _SHA256_HEX.fullmatch(item):
                raise ValueError("each entry is a SHA-256 digest: 64 lowercase hex digits (never the token itself)")
        return value


@dataclass(frozen=True, slots=True)
class Binding:
    """One socket to open: its name (``scrape`` or ``operator``), address, routes and protection."""

    name: Literal["scrape", "operator"]
    host: str
    port: int
    scrape_routes: bool
    operator_routes: bool
    web_config_file: Path | None
    bearer_token_sha256: tuple[str, ...]


class HttpConfig(BaseModel):
    """The HTTP server: the scrape listener (/metrics, /healthz, /readyz) and the operator listener
    (/clusters, /escalations, /trees/{id}, /pages.css), one port or two."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    host: str = Field(
        "0.0.0.0",  # noqa: S104 - in a pod Prometheus scrapes from another host
        description="Bind address. 0.0.0.0 suits a pod (scraped from another host); the demo binds 127.0.0.1.",
    )
    port: int = Field(9108, ge=0, le=65535, description="The scrape listener's port; 0 picks a free port.")
    scrape: ListenerConfig = Field(default_factory=ListenerConfig)
    operator: ListenerConfig = Field(default_factory=ListenerConfig)
    health_without_auth: bool = Field(
        True,
        description="/healthz and /readyz answer without credentials even when the scrape listener demands "
        "them (the kubelet's probes send none). TLS still applies.",
    )
    auth_max_failures: int = Field(
        10,
        ge=1,
        le=10_000,
        description="Failed authentications a client address may make per auth_failure_window_seconds; "
        "beyond it the address gets 429 with Retry-After until the window ends.",
    )
    auth_failure_window_seconds: float = Field(60.0, gt=0, le=3600)
    max_request_bytes: int = Field(65_536, ge=1024, le=16 * 1_048_576)
    request_timeout_seconds: float = Field(
        10.0,
        gt=0,
        le=300,
        description="A request body still arriving after this long gets 408 and a closed connection.",
    )
    readiness: Literal["process", "dependencies"] = Field(
        "process",
        description="process: /readyz fails only for the sidecar's own pipeline (Kafka source polling, "
        "partitions recovered, results written) and for a background task that died (the tasks check "
        "names it); vLLM, alert sinks and clustering are listed in the body "
        "but do not gate (an outage of theirs pauses work, it must not stall every rollout). dependencies: "
        "every check gates.",
    )
    keepalive_timeout_seconds: float = Field(
        15.0,
        gt=0,
        le=300,
        description="A connection waiting for a request (idle between requests, or its headers not finished) "
        "is closed after this long: the idle keep-alive and the header read time, one timer.",
    )
    max_connections: int = Field(
        64,
        ge=1,
        le=65_536,
        description="Open connections per listener. When all are open, the oldest idle one (no request in "
        "progress) is closed to make room; when every one has a request in progress, one more gets 503 (over "
        "TLS: is closed) at once.",
    )
    max_requests_in_flight: int | None = Field(
        None,
        ge=1,
        le=65_535,
        description="Requests in progress per listener, /healthz and /readyz not counted; one more gets 503 "
        "with Retry-After: 1 before its body is read. Must be below max_connections, so that requests in "
        "progress never hold every connection and the probes always get one. None: half of max_connections.",
    )

    @model_validator(mode="after")
    def _listeners(self) -> Self:
        if self.max_requests_in_flight is not None and self.max_requests_in_flight >= self.max_connections:
            raise ValueError(
                f"http.max_requests_in_flight ({self.max_requests_in_flight}) must be below http.max_connections "
                f"({self.max_connections}): the connections left over are what /healthz and /readyz answer on"
            )
        self.bindings()
        return self

    @property
    def requests_in_flight_limit(self) -> int:
        """``max_requests_in_flight``, or half of ``max_connections`` (at least 1) when unset."""
        if self.max_requests_in_flight is not None:
            return self.max_requests_in_flight
        return max(1, self.max_connections // 2)

    def bindings(self) -> list[Binding]:
        """The sockets to open, scrape first; ValueError saying what to change when they conflict."""
        scrape, operator = self.scrape, self.operator
        out: list[Binding] = []
        scrape_at = (scrape.host or self.host, self.port if scrape.port is None else scrape.port)
        shared = operator.enabled and operator.port is None
        if operator.port is None and (operator.host or operator.web_config_file or operator.bearer_token_sha256):
            raise ValueError(
                "http.operator.host, web_config_file and bearer_token_sha256 need http.operator.port: without it "
                "the operator routes share the scrape listener, protected by http.scrape's settings"
            )
        if shared and not scrape.enabled:
            raise ValueError(
                "http.scrape.enabled is false but the operator routes share its listener: set http.operator.port "
                "to serve them on their own, or http.operator.enabled: false"
            )
        if scrape.enabled:
            out.append(Binding("scrape", *scrape_at, True, shared, scrape.web_config_file, scrape.bearer_token_sha256))
        if operator.enabled and operator.port is not None:
            at = (operator.host or self.host, operator.port)
            if scrape.enabled and at[1] != 0 and at[1] == scrape_at[1]:
                raise ValueError(
                    f"http.operator.port {at[1]} is the scrape listener's port: leave http.operator.port unset "
                    "to share it, or pick another"
                )
            out.append(Binding("operator", *at, False, True, operator.web_config_file, operator.bearer_token_sha256))
        return out


class LoggingConfig(BaseModel):
    """structlog output."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    level: Literal["debug", "info", "warning", "error"] = "info"
    format: Literal["auto", "json", "console"] = Field("auto", description="auto: JSON unless stderr is a terminal.")
