"""``adapters maintain``'s choice of due agents from the replicas' /metrics, and the argument errors of
``adapters promote|rollback|routes|maintain`` (no Kafka, no vLLM: every case stops before either)."""

from __future__ import annotations

from pathlib import Path

import pytest

from adapters.cli import main
from adapters.errors import DataError
from adapters.promotion.maintain import Due, due_agents

HEADER = """\
# HELP sidecar_completion_adapter_trusted 1 if the agent's completion adapter is trusted.
# TYPE sidecar_completion_adapter_trusted gauge
{trusted}
# HELP sidecar_adapter_drift Distance of the agent's recent final verdicts from its baseline.
# TYPE sidecar_adapter_drift gauge
{drift}
# HELP sidecar_completion_probability P(end).
# TYPE sidecar_completion_probability histogram
sidecar_completion_probability_count{{agent="quiet"}} 0.0
sidecar_completion_probability_sum{{agent="quiet"}} 0.0
"""


def _exposition(trusted: dict[str, float], drift: dict[tuple[str, str], float]) -> str:
    return HEADER.format(
        trusted="\n".join(f'sidecar_completion_adapter_trusted{{agent="{a}"}} {v}' for a, v in trusted.items()),
        drift="\n".join(f'sidecar_adapter_drift{{agent="{a}",signal="{s}"}} {v}' for (a, s), v in drift.items()),
    )


def _due(*texts: str, max_drift: float = 0.3) -> dict[str, tuple[str, ...]]:
    return {d.agent: d.reasons for d in due_agents(texts, max_drift=max_drift)}


# -- due_agents ----------------------------------------------------------------------------------


def test_nothing_is_due_on_a_healthy_fleet() -> None:
    healthy = _exposition({"shop": 1.0, "desk": 1.0}, {("shop", "p_end"): 0.1, ("desk", "completion_rate"): 0.05})
    assert due_agents([healthy, healthy, healthy], max_drift=0.3) == []
    assert due_agents([], max_drift=0.3) == []
    assert due_agents([""], max_drift=0.3) == []


def test_an_untrusted_agent_on_any_replica_is_due() -> None:
    a = _exposition({"shop": 1.0, "desk": 1.0}, {})
    b = _exposition({"shop": 0.0, "desk": 1.0}, {})
    assert due_agents([a, b, a], max_drift=0.3) == [Due("shop", ("untrusted",))]


def test_the_worst_drift_across_replicas_counts() -> None:
    replicas = [
        _exposition({"shop": 1.0}, {("shop", "p_end"): 0.1, ("shop", "completion_rate"): 0.2}),
        _exposition({"shop": 1.0}, {("shop", "p_end"): 0.45, ("shop", "completion_rate"): 0.1}),
        _exposition({"shop": 1.0}, {("shop", "p_end"): 0.2}),
    ]
    assert _due(*replicas) == {"shop": ("drift:p_end",)}
    assert _due(*replicas, max_drift=0.5) == {}
    assert _due(*replicas, max_drift=0.15) == {"shop": ("drift:completion_rate", "drift:p_end")}


def test_reasons_are_combined_sorted_and_agents_listed_in_order() -> None:
    a = _exposition({"zeta": 0.0, "alpha": 1.0}, {("zeta", "untrusted_share"): 0.9, ("alpha", "p_end"): 0.31})
    b = _exposition({"zeta": 0.0, "mid": 0.0}, {("zeta", "p_end"): 0.7})
    due = due_agents([a, b], max_drift=0.3)
    assert [d.agent for d in due] == ["alpha", "mid", "zeta"]
    assert due[0].reasons == ("drift:p_end",)
    assert due[1].reasons == ("untrusted",)
    assert due[2].reasons == ("drift:p_end", "drift:untrusted_share", "untrusted")


def test_shared_labels_are_never_due() -> None:
    text = _exposition(
        {"default": 0.0, "other": 0.0, "shop": 1.0},
        {("default", "p_end"): 1.0, ("other", "completion_rate"): 0.99, ("other", "p_end"): 0.8},
    )
    assert due_agents([text, text], max_drift=0.3) == []


def test_drift_exactly_at_the_threshold_is_not_due() -> None:
    at = _exposition({"shop": 1.0}, {("shop", "p_end"): 0.3, ("shop", "completion_rate"): 0.3})
    assert _due(at, max_drift=0.3) == {}
    above = _exposition({"shop": 1.0}, {("shop", "p_end"): 0.30000001})
    assert _due(above, max_drift=0.3) == {"shop": ("drift:p_end",)}
    assert _due(at, max_drift=1.0) == {}


def test_only_the_two_families_count() -> None:
    text = """\
# TYPE sidecar_scoring_errors_total counter
sidecar_scoring_errors_total{agent="shop",kind="completion",reason="http_404"} 0.0
# TYPE sidecar_adapter_drift_window_verdicts gauge
sidecar_adapter_drift_window_verdicts{agent="shop"} 0.0
# TYPE sidecar_adapter_route_version gauge
sidecar_adapter_route_version{agent="shop"} 0.0
# TYPE sidecar_completion_adapter_trusted gauge
sidecar_completion_adapter_trusted 0.0
"""
    assert due_agents([text], max_drift=0.3) == []  # a trusted gauge without an agent label names no one


def test_a_trusted_gauge_that_is_neither_0_nor_1_is_not_untrusted() -> None:
    assert _due(_exposition({"shop": 0.5}, {})) == {}
    assert _due(_exposition({"shop": float("nan")}, {("shop", "p_end"): float("nan")})) == {}


def test_exposition_timestamps_and_escaped_labels_parse() -> None:
    text = (
        "# TYPE sidecar_completion_adapter_trusted gauge\n"
        'sidecar_completion_adapter_trusted{agent="a:b.c-d_e",pod="x\\"y"} 0 1700000000000\n'
    )
    assert _due(text) == {"a:b.c-d_e": ("untrusted",)}


@pytest.mark.parametrize(
    "garbage",
    [
        "this is not { a metric",
        'sidecar_adapter_drift{agent="shop",signal="p_end" 0.9',
        'sidecar_adapter_drift{agent="shop",signal="p_end"} high',
        "{}",
        "\x00\x01\x02",
        "<html><body>502 Bad Gateway</body></html>",
    ],
)
def test_text_that_does_not_parse_is_a_data_error(garbage: str) -> None:
    good = _exposition({"shop": 0.0}, {})
    with pytest.raises(DataError, match="does not parse"):
        due_agents([good, garbage], max_drift=0.3)


# -- argument errors -----------------------------------------------------------------------------


def _exit(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """Run the CLI, expect exit status 2 with nothing on stdout; the message on stderr."""
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    out, err = capsys.readouterr()
    assert out == ""
    return err


@pytest.fixture
def config(tmp_path: Path) -> Path:
    """A sidecar config that never gets used: every case fails before it is read or right after."""
    path = tmp_path / "sidecar.yaml"
    path.write_text("kafka:\n  bootstrap_servers: 127.0.0.1:1\n  topic: events\n", encoding="utf-8")
    return path


def _promote(tmp_path: Path, config: Path, *extra: str) -> list[str]:
    return ["promote", "--onboarding", str(tmp_path / "ob"), "--sidecar-config", str(config), *extra]


def _maintain(tmp_path: Path, config: Path, *extra: str) -> list[str]:
    return [
        "maintain",
        "--sidecar-config",
        str(config),
        "--metrics-url",
        "http://127.0.0.1:1/metrics",
        "--work",
        str(tmp_path / "work"),
        *extra,
    ]


def test_promote_without_agent(tmp_path: Path, config: Path, capsys: pytest.CaptureFixture[str]) -> None:
    err = _exit(_promote(tmp_path, config), capsys)
    assert "adapters promote: error" in err and "--agent" in err and "required" in err


@pytest.mark.parametrize("command", ["promote", "rollback", "release", "routes", "maintain"])
def test_every_command_needs_the_sidecar_config(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    argv = {
        "promote": ["promote", "--agent", "shop", "--onboarding", "ob"],
        "rollback": ["rollback", "--agent", "shop"],
        "release": ["release", "--agent", "shop"],
        "routes": ["routes"],
        "maintain": ["maintain", "--metrics-url", "http://x/metrics", "--work", "w"],
    }[command]
    err = _exit(argv, capsys)
    assert f"adapters {command}: error" in err and "--sidecar-config" in err


@pytest.mark.parametrize("name", ["../etc", "shop 2", "a" * 65, "", ".hidden", "shöp", "a/b"])
def test_a_bad_agent_name_is_refused(
    name: str, tmp_path: Path, config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    err = _exit(_promote(tmp_path, config, "--agent", name), capsys)
    assert "adapters promote: error" in err and "--agent" in err and "invalid name" in err
    err = _exit(["rollback", "--agent", name, "--sidecar-config", str(config)], capsys)
    assert "adapters rollback: error" in err and "invalid name" in err
    err = _exit(["release", "--agent", name, "--sidecar-config", str(config)], capsys)
    assert "adapters release: error" in err and "invalid name" in err
    err = _exit(_maintain(tmp_path, config, "--agent", "shop", "--agent", name), capsys)
    assert "adapters maintain: error" in err and "invalid name" in err


def test_an_agent_name_of_64_characters_parses(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Accepted by the parser, then stopped by the missing config file (exit 2 from the command itself).
    missing = tmp_path / "none.yaml"
    err = _exit(["rollback", "--agent", "a" * 64, "--sidecar-config", str(missing)], capsys)
    assert "invalid name" not in err and str(missing) in err


@pytest.mark.parametrize("margin", ["1.5", "1", "-1", "-1.5", "nan", "inf", "-inf", "abc"])
def test_a_margin_outside_minus_1_1_is_refused(
    margin: str, tmp_path: Path, config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    err = _exit(_promote(tmp_path, config, "--agent", "shop", "--margin", margin), capsys)
    assert "adapters promote: error" in err and "--margin" in err
    err = _exit(_maintain(tmp_path, config, "--margin", margin), capsys)
    assert "adapters maintain: error" in err and "--margin" in err


def test_a_margin_message_says_the_range(tmp_path: Path, config: Path, capsys: pytest.CaptureFixture[str]) -> None:
    err = _exit(_promote(tmp_path, config, "--agent", "shop", "--margin", "1.5"), capsys)
    assert "(-1, 1)" in err


@pytest.mark.parametrize("value", ["0", "-0.2", "1.01", "nan", "inf", "much"])
def test_a_max_drift_outside_0_1_is_refused(
    value: str, tmp_path: Path, config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    err = _exit(_maintain(tmp_path, config, "--max-drift", value), capsys)
    assert "adapters maintain: error" in err and "--max-drift" in err
    if value in ("0", "1.01"):
        assert "(0, 1]" in err


def test_maintain_needs_a_metrics_url_and_a_work_dir(
    tmp_path: Path, config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    err = _exit(["maintain", "--sidecar-config", str(config), "--work", str(tmp_path)], capsys)
    assert "--metrics-url" in err
    err = _exit(["maintain", "--sidecar-config", str(config), "--metrics-url", "http://x/metrics"], capsys)
    assert "--work" in err


@pytest.mark.parametrize("command", ["promote", "rollback", "release", "routes", "maintain"])
def test_a_missing_sidecar_config_file_exits_2_naming_it(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "nowhere" / "sidecar.yaml"
    argv = {
        "promote": _promote(tmp_path, missing, "--agent", "shop"),
        "rollback": ["rollback", "--agent", "shop", "--sidecar-config", str(missing)],
        "release": ["release", "--agent", "shop", "--sidecar-config", str(missing)],
        "routes": ["routes", "--sidecar-config", str(missing)],
        "maintain": _maintain(tmp_path, missing, "--dry-run"),
    }[command]
    err = _exit(argv, capsys)
    assert err.startswith(f"adapters {command}: error: --sidecar-config:"), err
    assert str(missing) in err
    assert "Traceback" not in err and err.count("\n") == 1


@pytest.mark.parametrize(
    ("yaml_text", "expected"),
    [
        ("scoring:\n  completion:\n    min_validation_f1: 2\n", "min_validation_f1"),
        ("scoring:\n  routing:\n    topic: 'bad topic!'\n", "topic"),
        ("scoring:\n  agents:\n    shop:\n      completion_rule: threshold\n", "threshold"),
        ("no_such_section: 1\n", "no_such_section"),
        ("kafka: [unclosed\n", "not valid YAML"),
        ("- a list\n", "mapping"),
    ],
)
def test_an_invalid_sidecar_config_exits_2(
    yaml_text: str, expected: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "sidecar.yaml"
    path.write_text(yaml_text, encoding="utf-8")
    err = _exit(_promote(tmp_path, path, "--agent", "shop"), capsys)
    assert err.startswith("adapters promote: error: --sidecar-config:"), err
    assert expected in err
    assert "Traceback" not in err


def test_an_agent_label_no_adapter_can_be_onboarded_under_is_never_due() -> None:
    # The event contract allows names such as "..": maintain would turn one into a path under WORK.
    text = _exposition({"..": 0.0, ".": 0.0, "shop": 0.0}, {("..", "p_end"): 0.9})
    assert _due(text) == {"shop": ("untrusted",)}
