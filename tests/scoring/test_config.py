"""The scoring section of the configuration tree."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from sidecar.config import dump_yaml, load_config
from sidecar.errors import ConfigError
from sidecar.scoring.config import ScoringConfig, TreeConfig


def test_defaults_are_valid_and_disabled() -> None:
    cfg = ScoringConfig()
    assert not cfg.enabled
    assert cfg.completion.end_tag == "<|end_of_conversation|>"
    assert cfg.vllm.max_attempts >= 1
    assert not cfg.completion.include_text_in_outcome
    assert not cfg.tree.include_text_in_outcome


def test_enabled_needs_a_tokenizer_dir() -> None:
    with pytest.raises(ValidationError, match="model_dir"):
        ScoringConfig(enabled=True)


@pytest.mark.parametrize(
    "bad",
    [
        {"tree": {"alpha": 0}},
        {"tree": {"alpha": 1.5}},
        {"vllm": {"max_concurrency": 0}},
        {"agents": {"a": {"completion_sample_rate": 2}}},
        {"unknown_key": 1},
    ],
)
def test_invalid_values_are_refused(bad: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        ScoringConfig(**bad)


def test_top_k_formula() -> None:
    assert TreeConfig(alpha=0.1).top_k(20) == 10
    assert TreeConfig(alpha=0.05).top_k(20) == 20
    assert TreeConfig(alpha=0.03).top_k(20) == 20
    assert TreeConfig(alpha=0.3).top_k(20) == 4


def test_agent_routing_falls_back_to_default() -> None:
    cfg = ScoringConfig(agents={"booking": {"adapter": "completion-booking"}})
    assert cfg.agent("booking").adapter == "completion-booking"
    assert cfg.agent("other").adapter is None
    assert cfg.agent(None).adapter is None


def test_env_and_secret_masking(monkeypatch: pytest.MonkeyPatch, tmp_path: object) -> None:
    monkeypatch.setenv("SIDECAR_SCORING__VLLM__BASE_URL", "http://vllm:8000/v1")
    monkeypatch.setenv("SIDECAR_SCORING__VLLM__API_KEY", "s3cret-token")
    monkeypatch.setenv("SIDECAR_SCORING__TREE__ALPHA", "0.2")
    cfg = load_config()
    assert cfg.scoring.vllm.base_url == "http://vllm:8000/v1"
    assert cfg.scoring.vllm.api_key.get_secret_value() == "s3cret-token"
    assert cfg.scoring.tree.alpha == 0.2
    assert "s3cret-token" not in dump_yaml(cfg)


def test_env_typo_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SIDECAR_SCORING__TREE__ALPHA", "lots")
    with pytest.raises(ConfigError):
        load_config()
