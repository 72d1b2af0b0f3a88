"""configure_logging: JSON lines, context, text scrubbing, secrets, stdlib routing."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator
from typing import Any

import pytest
import structlog
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import SecretStr

from sidecar.telemetry.config import LoggingConfig
from sidecar.telemetry.logging import MASK, TEXT_FIELDS, configure_logging


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    structlog.contextvars.clear_contextvars()
    structlog.reset_defaults()
    for h in list(root.handlers):
        if h not in handlers:
            root.removeHandler(h)
    root.setLevel(level)


def _lines(stream: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stream.getvalue().split("\n") if line.strip()]


def test_json_line_has_timestamp_level_event_and_fields_in_order() -> None:
    out = io.StringIO()
    configure_logging(LoggingConfig(), stream=out)
    structlog.get_logger().info("score.completed", turn=3, latency_seconds=0.25)
    [line] = _lines(out)
    assert list(line)[:3] == ["timestamp", "level", "event"]
    assert line["event"] == "score.completed"
    assert line["level"] == "info"
    assert line["turn"] == 3
    assert line["latency_seconds"] == 0.25
    assert line["timestamp"].endswith("Z")
    assert "T" in line["timestamp"]


def test_level_filters_structlog_events() -> None:
    out = io.StringIO()
    configure_logging(LoggingConfig(level="warning"), stream=out)
    log = structlog.get_logger()
    log.info("dropped.info")
    log.debug("dropped.debug")
    log.warning("kept.warning")
    assert [x["event"] for x in _lines(out)] == ["kept.warning"]


def test_contextvars_are_merged() -> None:
    out = io.StringIO()
    configure_logging(LoggingConfig(), stream=out)
    structlog.contextvars.bind_contextvars(conversation_id="c-1", partition=2)
    structlog.get_logger().info("turn.closed")
    structlog.contextvars.clear_contextvars()
    structlog.get_logger().info("after.clear")
    first, second = _lines(out)
    assert first["conversation_id"] == "c-1"
    assert first["partition"] == 2
    assert "conversation_id" not in second


@pytest.mark.parametrize("field", sorted(TEXT_FIELDS))
def test_text_fields_are_dropped_at_top_level_and_nested(field: str) -> None:
    out = io.StringIO()
    configure_logging(LoggingConfig(), stream=out)
    secret_text = "my card number is 4111 1111 1111 1111"
    structlog.get_logger().info(
        "event.decoded",
        **{field: secret_text},
        nested={"role": "user", field: secret_text, "deeper": [{field: secret_text, "ok": 1}]},
    )
    raw = out.getvalue()
    assert secret_text not in raw
    [line] = _lines(out)
    assert field not in line
    assert line["nested"]["role"] == "user"
    assert line["nested"]["deeper"] == [{"ok": 1}]


def test_secrets_are_masked_everywhere() -> None:
    out = io.StringIO()
    configure_logging(LoggingConfig(), stream=out)
    structlog.get_logger().warning(
        "sink.configured", password=SecretStr("hunter2"), cfg={"auth": (SecretStr("tok-123"),)}
    )
    assert "hunter2" not in out.getvalue()
    assert "tok-123" not in out.getvalue()
    [line] = _lines(out)
    assert line["password"] == MASK
    assert line["cfg"] == {"auth": [MASK]}


def test_deeply_nested_and_self_referencing_values_do_not_hang() -> None:
    out = io.StringIO()
    configure_logging(LoggingConfig(), stream=out)
    loop: dict[str, Any] = {}
    loop["self"] = loop
    structlog.get_logger().info("odd.value", loop=loop, obj=object())
    [line] = _lines(out)
    assert line["event"] == "odd.value"
    assert "object object" in line["obj"]


def test_stdlib_logging_routed_at_warning_and_above() -> None:
    out = io.StringIO()
    configure_logging(LoggingConfig(level="debug"), stream=out)
    lib = logging.getLogger("aiokafka.consumer")
    lib.info("rebalance step %d", 1)
    lib.warning("Heartbeat failed for group %s", "g1")
    [line] = _lines(out)
    assert line["event"] == "aiokafka.consumer"
    assert line["msg"] == "Heartbeat failed for group g1"
    assert line["level"] == "warning"
    assert list(line)[:3] == ["timestamp", "level", "event"]


def test_stdlib_exception_is_rendered_structured() -> None:
    out = io.StringIO()
    configure_logging(LoggingConfig(), stream=out)
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        logging.getLogger("aiohttp.server").exception("handler failed")
    [line] = _lines(out)
    assert line["level"] == "error"
    assert line["exception"][0]["exc_type"] == "RuntimeError"


def test_structlog_exception_is_rendered_structured() -> None:
    out = io.StringIO()
    configure_logging(LoggingConfig(), stream=out)
    try:
        raise ValueError("bad")
    except ValueError:
        structlog.get_logger().exception("score.failed")
    [line] = _lines(out)
    assert line["exception"][0]["exc_type"] == "ValueError"


def test_reconfiguring_replaces_handler_and_follows_new_stream() -> None:
    first, second = io.StringIO(), io.StringIO()
    configure_logging(LoggingConfig(), stream=first)
    log = structlog.get_logger()  # obtained before the second configuration
    configure_logging(LoggingConfig(), stream=second)
    log.info("after.reconfigure")
    logging.getLogger("lib").error("once")
    assert first.getvalue() == ""
    events = [x["event"] for x in _lines(second)]
    assert events == ["after.reconfigure", "lib"]


def test_tty_gets_console_renderer_and_auto_json_otherwise() -> None:
    tty = _Tty()
    configure_logging(LoggingConfig(), stream=tty)
    structlog.get_logger().info("console.event", n=1)
    text = tty.getvalue()
    assert "console.event" in text
    with pytest.raises(json.JSONDecodeError):
        json.loads(text.splitlines()[0])

    forced = _Tty()
    configure_logging(LoggingConfig(format="json"), stream=forced)
    structlog.get_logger().info("json.event")
    assert json.loads(forced.getvalue())["event"] == "json.event"


def test_console_format_also_scrubs_text() -> None:
    out = io.StringIO()
    configure_logging(LoggingConfig(format="console"), stream=out)
    structlog.get_logger().info("console.event", content="private words", prompt="more private")
    assert "console.event" in out.getvalue()
    assert "private" not in out.getvalue()


def test_non_ascii_and_control_characters_stay_one_json_line() -> None:
    out = io.StringIO()
    configure_logging(LoggingConfig(), stream=out)
    structlog.get_logger().info("odd.chars", reason="bad\nline\u2028\x00é")
    lines = out.getvalue().rstrip("\n").split("\n")
    assert len(lines) == 1
    assert json.loads(lines[0])["reason"] == "bad\nline\u2028\x00é"


SENTINEL = "SENSITIVE-USER-TEXT"
_keys = st.sampled_from([*sorted(TEXT_FIELDS), "role", "turn", "meta", "items"])
_values: st.SearchStrategy[Any] = st.recursive(
    st.one_of(st.integers(), st.just("plain"), st.none()),
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(_keys, inner, max_size=4),
    ),
    max_leaves=40,
)


def _plant(value: Any) -> Any:
    """Put the sentinel under every text-field key of a generated structure."""
    if isinstance(value, dict):
        return {k: (SENTINEL if k in TEXT_FIELDS else _plant(v)) for k, v in value.items()}
    if isinstance(value, list):
        return [_plant(v) for v in value]
    return value


@settings(max_examples=100, deadline=None)
@given(fields=st.dictionaries(_keys, _values, max_size=5))
def test_no_text_field_value_ever_reaches_the_output(fields: dict[str, Any]) -> None:
    out = io.StringIO()
    configure_logging(LoggingConfig(), stream=out)
    structlog.get_logger().info("fuzz.event", **_plant(fields))
    assert SENTINEL not in out.getvalue()
    assert json.loads(out.getvalue())["event"] == "fuzz.event"


def _fail_holding_secrets(user_words: str, api_key: SecretStr) -> None:
    # Locals built at run time: source lines shown in a traceback cannot contain them.
    raise RuntimeError("scoring failed")


@pytest.mark.parametrize("fmt", ["json", "console"])
@pytest.mark.parametrize("via", ["structlog", "stdlib"])
def test_tracebacks_never_show_local_variables(fmt: str, via: str) -> None:
    out = io.StringIO()
    configure_logging(LoggingConfig(format=fmt), stream=out)
    try:
        _fail_holding_secrets(f"my card is {4000 + 111} " * 4, SecretStr("sk-" + "live" + "-abc"))
    except RuntimeError:
        if via == "structlog":
            structlog.get_logger().exception("score.failed")
        else:
            logging.getLogger("aiohttp.server").exception("handler failed")
    text = out.getvalue()
    assert "RuntimeError" in text
    assert "_fail_holding_secrets" in text  # the frames are there
    assert "4111" not in text
    assert "sk-live" not in text and "live-abc" not in text
    assert "4111 " not in text
