"""One validated config tree: YAML + SIDECAR_ env vars, clear errors, secrets never printed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from sidecar.cli import main
from sidecar.config import MASK, dump_yaml, load_config
from sidecar.errors import ConfigError


def write(tmp_path: Path, text: str | bytes) -> Path:
    p = tmp_path / "c.yaml"
    if isinstance(text, bytes):
        p.write_bytes(text)
    else:
        p.write_text(text)
    return p


def test_defaults_are_valid() -> None:
    cfg = load_config(None)
    assert cfg.kafka.topic == "agent.conversations"
    assert cfg.state.idle_ttl_seconds > cfg.state.turn_debounce_seconds


def test_yaml_and_env_merge_env_wins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    p = write(tmp_path, "kafka:\n  topic: from-yaml\n  group_id: g1\nstate:\n  idle_ttl_seconds: 60\n")
    monkeypatch.setenv("SIDECAR_KAFKA__GROUP_ID", "from-env")
    cfg = load_config(p)
    assert cfg.kafka.topic == "from-yaml"
    assert cfg.kafka.group_id == "from-env"
    assert cfg.state.idle_ttl_seconds == 60


def test_config_file_from_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SIDECAR_CONFIG_FILE", str(write(tmp_path, "kafka:\n  topic: t9\n")))
    assert load_config(None).kafka.topic == "t9"


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("kafka:\n  topik: x\n", "kafka.topik"),  # typo: extra=forbid
        ("kafka:\n  commit_interval_seconds: -1\n", "kafka.commit_interval_seconds"),
        ("state:\n  idle_ttl_seconds: forever\n", "state.idle_ttl_seconds"),
        ("http:\n  port: 70000\n", "http.port"),
        ("kafka:\n  security_protocol: SASL_SSL\n", "sasl_mechanism"),
        ("kafka:\n  topic: a\n  results_topic: a\n", "three different topics"),
        ("kafka:\n  heartbeat_interval_ms: 40000\n", "heartbeat_interval_ms"),
        ("- just\n- a list\n", "mapping at top level"),
        ("kafka: [unclosed\n", "not valid YAML"),
        ("kafka: !!python/object/apply:os.system ['echo pwned']\n", "not valid YAML"),
        (
            "scoring:\n  prompt_truncation: stride\n  max_prompt_tokens: 256\n  prompt_stride_tokens: 256\n",
            "prompt_stride_tokens must be smaller",
        ),
        ("scoring:\n  prompt_truncation: sliding\n", "scoring.prompt_truncation"),
    ],
)
def test_bad_config_gives_clear_error(tmp_path: Path, text: str, needle: str) -> None:
    with pytest.raises(ConfigError, match=None) as info:
        load_config(write(tmp_path, text))
    assert needle in str(info.value)


def test_error_names_the_env_var(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, "state:\n  turn_debounce_seconds: 0\n"))
    assert "SIDECAR_STATE__TURN_DEBOUNCE_SECONDS" in str(info.value)


def test_non_utf8_and_oversized_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="UTF-8"):
        load_config(write(tmp_path, b"kafka:\n  topic: \xff\xfe\n"))
    with pytest.raises(ConfigError, match="limit"):
        load_config(write(tmp_path, "# " + "x" * 2_000_000))
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "missing.yaml")


def test_yaml_bomb_is_bounded(tmp_path: Path) -> None:
    # Nested aliases: small file, huge expansion. Refused as invalid config, without blowing up.
    bomb = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{chr(98 + i)}: &{chr(98 + i)} [*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}]\n"
        for i in range(8)
    )
    with pytest.raises(ConfigError):
        load_config(write(tmp_path, bomb))


def test_secrets_are_masked_in_show(tmp_path: Path) -> None:
    p = write(
        tmp_path,
        yaml.safe_dump(
            {
                "kafka": {
                    "security_protocol": "SASL_SSL",
                    "sasl_mechanism": "PLAIN",
                    "sasl_username": "svc",
                    "sasl_password": "hunter2-very-secret",
                }
            }
        ),
    )
    cfg = load_config(p)
    out = dump_yaml(cfg)
    assert "hunter2" not in out
    assert MASK in out
    assert "hunter2" not in repr(cfg)


def test_cli_config_show_and_check(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p = write(tmp_path, "kafka:\n  topic: shown\n  sasl_password: topsecret\n")
    assert main(["config", "show", "--config", str(p)]) == 0
    out = capsys.readouterr().out
    assert "topic: shown" in out
    assert "topsecret" not in out
    assert main(["config", "check", "--config", str(p)]) == 0
    bad = write(tmp_path, "kafka:\n  nope: 1\n")
    assert main(["config", "check", "--config", str(bad)]) == 2
    assert "kafka.nope" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [[], ["frobnicate"], ["config"], ["config", "show", "--bogus"], ["run", "--config"]])
def test_cli_usage_errors_exit_2(argv: list[str]) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "sidecar", *argv], check=False, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 2
    assert "usage:" in proc.stderr


def test_credentials_inside_urls_are_masked_in_show(tmp_path: Path) -> None:
    p = write(
        tmp_path,
        yaml.safe_dump(
            {
                "scoring": {"vllm": {"base_url": "https://svc:pa55word@vllm.internal:8000/v1"}},
                "clustering": {"embedding": {"base_url": "http://emb.internal/v1?api_key=abc123&x=1"}},
            }
        ),
    )
    out = dump_yaml(load_config(p))
    assert "pa55word" not in out and "svc:" not in out
    assert "abc123" not in out
    assert f"https://{MASK}@vllm.internal:8000/v1" in out
    assert "x=1" in out  # only the credential is masked


@pytest.mark.parametrize(
    "text",
    [
        "kafka:\n  sasl_password: 'hunter2-secret\n  topic: t\n",  # unterminated quote
        "kafka:\n  sasl_password: hunter2-secret\n   topic: [\n",  # bad indentation, open flow
        "kafka: {sasl_password: hunter2-secret, topic: t\n",
    ],
)
def test_yaml_syntax_errors_name_the_place_but_never_echo_the_line(tmp_path: Path, text: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, text))
    message = str(info.value)
    assert "not valid YAML" in message
    assert "line " in message
    assert "hunter2" not in message
    assert info.value.__cause__ is None  # the YAML error (which quotes the line) is not chained
