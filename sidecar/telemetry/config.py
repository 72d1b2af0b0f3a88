"""HTTP endpoint and logging configuration."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class HttpConfig(BaseModel):
    """The /metrics, /healthz and /readyz server."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    host: str = Field(
        "0.0.0.0",  # noqa: S104 - in a pod Prometheus scrapes from another host
        description="Bind address. 0.0.0.0 suits a pod (scraped from another host); the demo binds 127.0.0.1.",
    )
    port: int = Field(9108, ge=0, le=65535, description="0 picks a free port.")
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
    max_connections: int = Field(
        64, ge=1, le=65_536, description="Open connections beyond this get 503 and are closed at once."
    )


class LoggingConfig(BaseModel):
    """structlog output."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    level: Literal["debug", "info", "warning", "error"] = "info"
    format: Literal["auto", "json", "console"] = Field("auto", description="auto: JSON unless stderr is a terminal.")
