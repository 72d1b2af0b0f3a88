"""structlog set-up: one output for the sidecar's own events and for stdlib loggers.

Every log line carries an ISO-8601 UTC ``timestamp``, a ``level`` and a stable dotted ``event``
name (``score.completed``), then fields. Context bound with
``structlog.contextvars.bind_contextvars`` (``conversation_id``, ``partition``...) is merged into
every line logged in that context. Lines are JSON when the stream is not a terminal (or when
``format`` is ``json``) and coloured key=value text on a terminal.

Logs never carry message text: a processor drops any field named like message text (at any depth
of nested mappings) and masks secrets, as a second line of defence behind the callers' own care.
Libraries that log through :mod:`logging` (aiokafka, aiohttp) are routed into the same output at
``WARNING`` and above, with the logger's name as the event.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Mapping
from typing import Any, Final, TextIO

import structlog
from pydantic import SecretBytes, SecretStr
from structlog.tracebacks import ExceptionDictTransformer
from structlog.typing import EventDict, Processor, WrappedLogger

from sidecar.telemetry.config import LoggingConfig

# Field names that would carry conversation text. Dropped wherever they appear in an event.
TEXT_FIELDS: Final[frozenset[str]] = frozenset({"content", "text", "message_text", "prompt", "completion"})
MASK: Final = "**********"
# Nested structures deeper than this are replaced rather than walked: a log call must stay cheap
# and must not recurse without bound on a self-referencing structure.
_MAX_DEPTH: Final = 6

_LEVELS: Final[dict[str, int]] = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}
# Keys that lead every line, in this order; the rest keep the order they were given in.
_LEADING_KEYS: Final = ("timestamp", "level", "event")


def _scrub(value: Any, depth: int) -> Any:
    if isinstance(value, SecretStr | SecretBytes):
        return MASK
    if isinstance(value, Mapping):
        if depth >= _MAX_DEPTH:
            return "[nested too deep]"
        return {k: _scrub(v, depth + 1) for k, v in value.items() if not (isinstance(k, str) and k in TEXT_FIELDS)}
    if isinstance(value, list | tuple):
        if depth >= _MAX_DEPTH:
            return "[nested too deep]"
        return [_scrub(v, depth + 1) for v in value]
    return value


def scrub_text_and_secrets(_logger: WrappedLogger, _method: str, event_dict: EventDict) -> EventDict:
    """Drop text-carrying fields (top level and nested) and mask ``SecretStr``/``SecretBytes``."""
    for key in [k for k in event_dict if k in TEXT_FIELDS]:
        del event_dict[key]
    for key, value in event_dict.items():
        if isinstance(value, SecretStr | SecretBytes | Mapping | list | tuple):
            event_dict[key] = _scrub(value, 1)
    return event_dict


def _order_keys(_logger: WrappedLogger, _method: str, event_dict: EventDict) -> EventDict:
    ordered: dict[str, Any] = {k: event_dict[k] for k in _LEADING_KEYS if k in event_dict}
    ordered.update((k, v) for k, v in event_dict.items() if k not in ordered)
    return ordered


def _foreign_event_name(_logger: WrappedLogger, _method: str, event_dict: EventDict) -> EventDict:
    """A stdlib record: its logger name becomes the event, its formatted text the ``msg`` field."""
    record = event_dict.get("_record")
    if isinstance(record, logging.LogRecord):
        event_dict["msg"] = event_dict.get("event")
        event_dict["event"] = record.name
    return event_dict


def _wants_json(config: LoggingConfig, stream: TextIO) -> bool:
    if config.format == "json":
        return True
    if config.format == "console":
        return False
    isatty = getattr(stream, "isatty", None)
    try:
        return not (callable(isatty) and isatty())
    except ValueError:  # a closed stream
        return True


# Tracebacks name frames and code lines, never local variables: structlog's defaults print every
# frame's locals, and a frame holding a conversation or a client with credentials would leak them
# past the scrubber (which sees only the event's own fields).
_DICT_TRACEBACKS: Final = structlog.processors.ExceptionRenderer(ExceptionDictTransformer(show_locals=False))


def _shared_processors() -> list[Processor]:
    return [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        scrub_text_and_secrets,
    ]


class CurrentStderr:
    """Writes to whatever ``sys.stderr`` is at write time.

    Binding the stream object at configuration time breaks when something swaps ``sys.stderr``
    afterwards (a live progress display, a test runner's capture that is later closed).
    """

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()

    def isatty(self) -> bool:
        return sys.stderr.isatty()


class _SidecarHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Marks the handler this module installed, so reconfiguring replaces it instead of adding one."""


def configure_logging(config: LoggingConfig, stream: TextIO | None = None) -> None:
    """Configure structlog and the stdlib root logger to write to ``stream`` (default: stderr).

    Safe to call again (tests, the CLI after loading config): the previous configuration is
    replaced, and loggers obtained earlier with ``structlog.get_logger()`` follow the new one.
    """
    out: TextIO = CurrentStderr() if stream is None else stream  # type: ignore[assignment]
    as_json = _wants_json(config, out)
    renderer: Processor
    if as_json:
        # structlog's fallback serialises an unexpected type as its repr instead of losing the line.
        renderer = structlog.processors.JSONRenderer(serializer=json.dumps, ensure_ascii=False)
        exc_processors: list[Processor] = [_DICT_TRACEBACKS]
    else:
        colors = bool(getattr(out, "isatty", lambda: False)())
        renderer = structlog.dev.ConsoleRenderer(
            colors=colors, exception_formatter=structlog.dev.RichTracebackFormatter(show_locals=False)
        )
        exc_processors = []
    level = _LEVELS[config.level]

    structlog.configure(
        processors=[
            *_shared_processors(),
            structlog.processors.StackInfoRenderer(),
            *exc_processors,
            _order_keys,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=structlog.WriteLoggerFactory(file=out),
        # Not cached: module-level loggers must follow a later configure_logging() call.
        cache_logger_on_first_use=False,
    )

    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=[_foreign_event_name, *_shared_processors(), *exc_processors],
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, _order_keys, renderer],
    )
    handler = _SidecarHandler(out)
    handler.setFormatter(formatter)
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, _SidecarHandler)]:
        root.removeHandler(old)
        old.close()
    root.addHandler(handler)
    # Third-party libraries are chatty at INFO (aiokafka logs every rebalance step): WARNING+ only.
    root.setLevel(max(level, logging.WARNING))


__all__ = ["MASK", "TEXT_FIELDS", "configure_logging", "scrub_text_and_secrets"]
