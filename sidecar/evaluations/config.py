"""Evaluation results out: where each verdict goes besides the results topic (all off by default).

``otlp`` sends ``gen_ai.evaluation.result`` log records over OTLP/HTTP (protobuf) to a collector
or any OTLP logs endpoint; ``langfuse`` posts scores, ``phoenix`` posts span or session
annotations. Each is a post-score sink with the same exactly-once pinning as the alert sinks. Env
vars follow the root tree, e.g. ``SIDECAR_EVALUATIONS__LANGFUSE__SECRET_KEY``.
"""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator

from sidecar.alerting.config import RetryConfig

_frozen = ConfigDict(frozen=True, extra="forbid")
_HTTP_URL = re.compile(r"https?://[^\s]+")


class DeliveryConfig(BaseModel):
    """How records wait and travel: one bounded queue and one request in flight per sink."""

    model_config = _frozen

    max_batch_records: int = Field(
        512,
        ge=1,
        le=10_000,
        description="Records per batch at most: one OTLP request, one Phoenix request per endpoint, or that "
        "many Langfuse requests in a row.",
    )
    max_queue_records: int = Field(
        4096,
        ge=1,
        le=1_000_000,
        description="Records waiting at most; beyond it effects wait (the stage pins them: backpressure).",
    )
    flush_seconds: float = Field(
        0.5, ge=0, le=60, description="How long a partial batch waits for more records before it is sent."
    )
    timeout_seconds: float = Field(10.0, gt=0, le=300, description="A request not answered by then is retried.")
    retry: RetryConfig = Field(default_factory=RetryConfig)


def _check_url(name: str, enabled: bool, url: str) -> None:
    if enabled and not _HTTP_URL.fullmatch(url):
        raise ValueError(f"evaluations.{name} needs an http(s) URL when enabled")


class OtlpEvaluationsConfig(BaseModel):
    """``gen_ai.evaluation.result`` log records over OTLP/HTTP, protobuf (``POST {endpoint}``)."""

    model_config = _frozen

    enabled: bool = Field(False, description="Send gen_ai.evaluation.result log records over OTLP/HTTP.")
    endpoint: str = Field(
        "http://127.0.0.1:4318/v1/logs", description="The full OTLP/HTTP logs URL (a collector's :4318/v1/logs)."
    )
    headers: dict[str, SecretStr] = Field(
        default_factory=dict, description="Extra request headers (e.g. authorization), masked when printed."
    )
    service_name: str = Field("llm-agent-sidecar", min_length=1, max_length=128, description="Resource service.name.")
    delivery: DeliveryConfig = Field(default_factory=DeliveryConfig)

    @model_validator(mode="after")
    def _url(self) -> OtlpEvaluationsConfig:
        _check_url("otlp.endpoint", self.enabled, self.endpoint)
        return self


class LangfuseEvaluationsConfig(BaseModel):
    """Langfuse scores (``POST {url}/api/public/scores``, basic auth with the project's keys)."""

    model_config = _frozen

    enabled: bool = Field(False, description="Post each verdict as a Langfuse score.")
    url: str = Field("https://cloud.langfuse.com", description="Langfuse's root URL.")
    public_key: SecretStr | None = Field(None, description="The project's public key (basic auth user).")
    secret_key: SecretStr | None = Field(None, description="The project's secret key (basic auth password).")
    environment: str | None = Field(None, max_length=40, description="Langfuse environment of the scores.")
    delivery: DeliveryConfig = Field(default_factory=DeliveryConfig)

    @model_validator(mode="after")
    def _complete(self) -> LangfuseEvaluationsConfig:
        _check_url("langfuse.url", self.enabled, self.url)
        if self.enabled and (self.public_key is None or self.secret_key is None):
            raise ValueError("evaluations.langfuse needs public_key and secret_key when enabled")
        return self


class PhoenixEvaluationsConfig(BaseModel):
    """Phoenix annotations (``POST {url}/v1/span_annotations`` and ``/v1/session_annotations``)."""

    model_config = _frozen

    enabled: bool = Field(False, description="Post each verdict as a Phoenix span or session annotation.")
    url: str = Field("http://127.0.0.1:6006", description="Phoenix's root URL.")
    api_key: SecretStr | None = Field(None, description="Sent as a bearer token when set.")
    delivery: DeliveryConfig = Field(default_factory=DeliveryConfig)

    @model_validator(mode="after")
    def _url(self) -> PhoenixEvaluationsConfig:
        _check_url("phoenix.url", self.enabled, self.url)
        return self


class EvaluationsConfig(BaseModel):
    """Verdicts as evaluation results for OpenTelemetry backends, Langfuse and Phoenix."""

    model_config = _frozen

    include_text: bool = Field(
        False, description="Put the remaining tasks (model text) in goal_completion explanations."
    )
    otlp: OtlpEvaluationsConfig = Field(default_factory=OtlpEvaluationsConfig)
    langfuse: LangfuseEvaluationsConfig = Field(default_factory=LangfuseEvaluationsConfig)
    phoenix: PhoenixEvaluationsConfig = Field(default_factory=PhoenixEvaluationsConfig)

    @property
    def enabled(self) -> bool:
        return self.otlp.enabled or self.langfuse.enabled or self.phoenix.enabled
