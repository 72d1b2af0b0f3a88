"""HTTP endpoint and logging configuration."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class HttpConfig(BaseModel):
    """The /metrics, /healthz and /readyz server."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    host: str = Field("0.0.0.0", description="Bind address.")  # noqa: S104 - a sidecar must be scrapeable
    port: int = Field(9108, ge=0, le=65535, description="0 picks a free port.")
    max_request_bytes: int = Field(65_536, ge=1024, le=16 * 1_048_576)


class LoggingConfig(BaseModel):
    """structlog output."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    level: Literal["debug", "info", "warning", "error"] = "info"
    format: Literal["auto", "json", "console"] = Field(
        "auto", description="auto: JSON unless stderr is a terminal."
    )
