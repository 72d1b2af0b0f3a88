"""LlmEndpointConfig and the sections built on it: malformed and hostile values are refused."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from sidecar.clustering.config import ClusteringLLMConfig
from sidecar.config import SidecarConfig
from sidecar.llm.config import ChatEndpointConfig, LlmEndpointConfig
from sidecar.scoring.config import VllmEndpointConfig

SECTIONS: list[type[LlmEndpointConfig]] = [
    LlmEndpointConfig,
    ChatEndpointConfig,
    VllmEndpointConfig,
    ClusteringLLMConfig,
]


@pytest.mark.parametrize("section", SECTIONS)
@pytest.mark.parametrize(
    "url",
    [
        "",
        "127.0.0.1:8000/v1",
        "ftp://llm.test/v1",
        "file:///etc/passwd",
        "javascript:alert(1)",
        "http://",
        "http:///v1",
        "http://llm.test/v1\r\nX-Injected: 1",
        "http://llm.test/v1\n",
        "http://llm .test/v1",
        "http://llm.test/\x00v1",
        "http://[::1/v1",
        "http://llm.test:99999/v1",
        "http://llm.test:port/v1",
    ],
)
def test_malformed_or_hostile_base_urls_are_refused(section: type[LlmEndpointConfig], url: str) -> None:
    with pytest.raises(ValidationError, match="base_url"):
        section(base_url=url)


@pytest.mark.parametrize(
    "url", ["http://127.0.0.1:8000/v1", "https://vllm.internal/v1", "http://[::1]:8000/v1", "https://u:p@h.test/v1"]
)
def test_well_formed_base_urls_are_kept_as_given(url: str) -> None:
    assert ChatEndpointConfig(base_url=url).base_url == url


@pytest.mark.parametrize("section", SECTIONS)
@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("request_timeout_seconds", 0),
        ("request_timeout_seconds", -1),
        ("request_timeout_seconds", float("nan")),
        ("request_timeout_seconds", float("inf")),
        ("connect_timeout_seconds", float("inf")),
        ("connect_timeout_seconds", 0),
        ("retry_initial_backoff_seconds", float("nan")),
        ("retry_max_backoff_seconds", float("inf")),
        ("retry_max_elapsed_seconds", -5),
        ("breaker_reset_seconds", float("inf")),
        ("max_attempts", 0),
        ("max_attempts", 10**9),
        ("max_concurrency", 0),
        ("max_concurrency", 10**9),
        ("breaker_failure_threshold", -1),
        ("max_attempts", "three"),
        ("request_timeout_seconds", "soon"),
    ],
)
def test_bad_numbers_are_refused(section: type[LlmEndpointConfig], field: str, value: Any) -> None:
    with pytest.raises(ValidationError):
        section(**{field: value})


@pytest.mark.parametrize("section", SECTIONS)
def test_unknown_keys_are_refused_and_the_config_is_frozen(section: type[LlmEndpointConfig]) -> None:
    with pytest.raises(ValidationError, match="extra"):
        section(max_retries=5)  # type: ignore[call-arg]
    cfg = section()
    with pytest.raises(ValidationError):
        cfg.base_url = "http://elsewhere/v1"  # type: ignore[misc]


@pytest.mark.parametrize("section", SECTIONS)
def test_the_key_is_masked_when_printed(section: type[LlmEndpointConfig]) -> None:
    cfg = section(api_key="hunter2-secret")  # type: ignore[arg-type]
    assert "hunter2-secret" not in repr(cfg) and "hunter2-secret" not in str(cfg)
    assert "hunter2-secret" not in cfg.model_dump_json()
    assert cfg.api_key.get_secret_value() == "hunter2-secret"


def test_each_section_keeps_its_defaults() -> None:
    v, c, k = VllmEndpointConfig(), ChatEndpointConfig(), ClusteringLLMConfig()
    assert (v.max_attempts, v.retry_initial_backoff_seconds, v.retry_max_elapsed_seconds, v.max_concurrency,
            v.breaker_reset_seconds, v.connect_timeout_seconds) == (4, 0.2, 120.0, 8, 5.0, 5.0)  # fmt: skip
    assert (c.max_attempts, c.retry_initial_backoff_seconds, c.retry_max_elapsed_seconds, c.max_concurrency,
            c.breaker_reset_seconds, c.connect_timeout) == (3, 0.5, 60.0, 4, 10.0, 60.0)  # fmt: skip
    assert (k.max_attempts, k.breaker_failure_threshold, k.max_tokens) == (1, 0, 256)
    with pytest.raises(ValidationError):
        ChatEndpointConfig(breaker_failure_threshold=0)  # only clustering may turn its breaker off
    assert VllmEndpointConfig(max_concurrency=1024).max_concurrency == 1024
    with pytest.raises(ValidationError):
        ChatEndpointConfig(max_concurrency=1024)


def _paths(model: type[BaseModel], prefix: str = "") -> set[str]:
    out: set[str] = set()
    for name, field in model.model_fields.items():
        ann = field.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            out |= _paths(ann, f"{prefix}{name}.")
        else:
            out.add(f"{prefix}{name}")
    return out


def test_every_existing_key_and_env_var_still_works(monkeypatch: pytest.MonkeyPatch) -> None:
    before = {
        "scoring.vllm": {"base_url", "api_key", "base_model", "connect_timeout_seconds", "request_timeout_seconds",
                         "max_attempts", "retry_initial_backoff_seconds", "retry_max_backoff_seconds",
                         "retry_max_elapsed_seconds", "outage_poll_max_seconds", "isolate_prompt_logprobs",
                         "exact_logprobs", "max_concurrency", "breaker_failure_threshold", "breaker_reset_seconds",
                         "health_check_interval_seconds"},
        "judge.llm": {"base_url", "model", "api_key", "request_timeout_seconds", "max_tokens", "temperature", "top_p",
                      "structured_output", "max_concurrency", "max_attempts", "retry_initial_backoff_seconds",
                      "retry_max_backoff_seconds", "retry_max_elapsed_seconds", "breaker_failure_threshold",
                      "breaker_reset_seconds"},
        "clustering.llm": {"base_url", "model", "api_key", "request_timeout_seconds", "max_tokens", "temperature",
                           "guided_json", "max_concurrency", "application_context", "max_transcript_chars"},
    }  # fmt: skip
    paths = _paths(SidecarConfig)
    for section, keys in before.items():
        assert {f"{section}.{k}" for k in keys} <= paths
    monkeypatch.setenv("SIDECAR_SCORING__VLLM__MAX_ATTEMPTS", "7")
    monkeypatch.setenv("SIDECAR_JUDGE__LLM__BASE_URL", "http://judge.test/v1")
    monkeypatch.setenv("SIDECAR_CLUSTERING__LLM__API_KEY", "k3y")
    cfg = SidecarConfig()
    assert cfg.scoring.vllm.max_attempts == 7
    assert cfg.judge.llm.base_url == "http://judge.test/v1"
    assert cfg.clustering.llm.api_key.get_secret_value() == "k3y"
