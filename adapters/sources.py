"""Where conversations come from: JSONL files and directories, the sidecar's training store, Kafka.

A *source spec* names conversations in the datasets' JSONL schema (``conversation_id``, ``turns``
of ``{role, content, tool_calls?, name?}``, optional ``source`` and ``meta``):

- a file: ``path/to/file.jsonl`` or ``.jsonl.gz``;
- a directory: every ``*.jsonl`` / ``*.jsonl.gz`` file directly in it, in name order. The sidecar's
  training store (``training_store.directory``) holds one such directory per agent, so
  ``STORE`` plus an agent name, or ``STORE/<agent>``, reads what the sidecar collected;
- a name under ``--datasets-dir``: ``DIR/<name>/`` or ``DIR/<name>.jsonl[.gz]``;
- a Kafka topic of contract-v1 events: ``kafka://HOST:PORT[,HOST:PORT]/TOPIC``, or ``kafka:``
  with the sidecar's own config file (its brokers, security and source topic); see
  :mod:`adapters.kafka_source`.

``NAME=SPEC`` names a source explicitly; otherwise the name is the file's stem or the directory's
name. No list of known names exists anywhere: any name is a data set.

Reading is bounded. A line over 8 MiB is skipped without being held in memory; a source that
yields more than ``max_bytes`` (after decompression: a gzip bomb counts what it inflates to) is an
error, not a silent cut; past ``max_conversations`` reading stops with a warning. Malformed lines
are counted and skipped, and a source with no usable conversation is an error that says why.
"""

from __future__ import annotations

import gzip
import json
import re
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Protocol

import structlog

from adapters.data import MAX_LINE_BYTES, BadRecordError, Conversation, ReadLimits, ReadStats, parse_record
from adapters.errors import DataError
from adapters.manifest import file_sha256

log = structlog.get_logger()

SUFFIXES = (".jsonl", ".jsonl.gz")
NAME_PATTERN = re.compile(r"[A-Za-z0-9_.:-]{1,64}")
_CHUNK = 1 << 20


class Source(Protocol):
    """Conversations from somewhere. ``conversations()`` may be called once; ``stats`` is filled
    as it is consumed; ``describe()`` is what a manifest records (no secrets, no message text)."""

    name: str
    stats: ReadStats

    def conversations(self) -> Iterator[Conversation]: ...

    def describe(self) -> dict[str, Any]: ...


def is_data_file(path: Path) -> bool:
    return path.name.endswith(SUFFIXES)


def _iter_lines(fh: IO[bytes], stats: ReadStats, limits: ReadLimits, where: str) -> Iterator[bytes | None]:
    """Lines of ``fh``; ``None`` for one over ``MAX_LINE_BYTES`` (skipped without holding it)."""
    while True:
        raw = fh.readline(MAX_LINE_BYTES + 1)
        if not raw:
            return
        stats.bytes += len(raw)
        oversized = len(raw) > MAX_LINE_BYTES
        while oversized and not raw.endswith(b"\n"):
            raw = fh.readline(_CHUNK)
            if not raw:
                break
            stats.bytes += len(raw)
            if stats.bytes > limits.max_bytes:
                break
        if stats.bytes > limits.max_bytes:
            raise DataError(
                f"{where}: more than {limits.max_bytes} bytes (after decompression); pass a smaller file "
                "or raise --max-input-bytes"
            )
        stats.lines += 1
        yield None if oversized else raw


def read_jsonl(path: Path, stats: ReadStats, limits: ReadLimits) -> Iterator[Conversation]:
    """Conversations of one (gzipped) JSONL file; malformed lines are logged, counted and skipped."""
    stats.files += 1
    try:
        fh: IO[bytes] = (
            gzip.open(path, "rb") if path.name.endswith(".gz") else path.open("rb")  # type: ignore[assignment]  # noqa: SIM115
        )
    except OSError as exc:
        raise DataError(f"cannot read {path}: {exc.strerror or exc}") from exc
    with fh:
        try:
            for lineno, raw in enumerate(_iter_lines(fh, stats, limits, str(path)), start=1):
                if raw is None:
                    stats.bad("line too long")
                    log.warning("adapters.data.bad_record", path=path.name, line=lineno, reason="line too long")
                    continue
                if not raw.strip():
                    continue
                try:
                    conv = parse_record(json.loads(raw.decode("utf-8")))
                except (BadRecordError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
                    stats.bad(str(exc) if isinstance(exc, BadRecordError) else type(exc).__name__)
                    log.warning("adapters.data.bad_record", path=path.name, line=lineno, reason=str(exc)[:200])
                    continue
                stats.conversations += 1
                yield conv
        except (gzip.BadGzipFile, EOFError, zlib.error) as exc:
            raise DataError(f"{path} is not a valid gzip file ({type(exc).__name__})") from exc
    if stats.malformed:
        log.info("adapters.data.skipped", path=path.name, bad_records=stats.malformed)


def read_conversations(path: Path) -> Iterator[Conversation]:
    """Stream conversations from a (gzipped) JSONL file; malformed lines are logged and skipped."""
    yield from read_jsonl(path, ReadStats(), ReadLimits())


@dataclass
class FileSource:
    """JSONL files (one, or every data file of a directory)."""

    name: str
    paths: tuple[Path, ...]
    location: str
    limits: ReadLimits = field(default_factory=ReadLimits)
    stats: ReadStats = field(default_factory=ReadStats)

    def conversations(self) -> Iterator[Conversation]:
        cap = self.limits.max_conversations
        for path in self.paths:
            for conv in read_jsonl(path, self.stats, self.limits):
                yield conv
                if cap is not None and self.stats.conversations >= cap:
                    log.warning("adapters.source.capped", source=self.name, max_conversations=cap)
                    return

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "kind": "jsonl", "location": self.location,
                "files": {p.name: file_sha256(p) for p in self.paths}, **self.stats.as_json()}


def _dir_files(directory: Path) -> list[Path]:
    return sorted(p for p in directory.iterdir() if p.is_file() and is_data_file(p))


def _from_directory(name: str, directory: Path, agent: str | None, limits: ReadLimits) -> FileSource:
    files = _dir_files(directory)
    if agent is not None and (directory / agent).is_dir():
        return _from_directory(name, directory / agent, None, limits)
    if not files:
        subdirs = sorted(p.name for p in directory.iterdir() if p.is_dir() and _dir_files(p))
        if subdirs:
            hint = ", ".join(subdirs[:10])
            raise DataError(f"{directory} holds one directory per agent ({hint}): name one with --agent "
                            "or point at the agent's directory")
        raise DataError(f"{directory} holds no *.jsonl or *.jsonl.gz file")
    return FileSource(name, tuple(files), str(directory), limits)


def _split_name(spec: str) -> tuple[str | None, str]:
    head, sep, tail = spec.partition("=")
    if sep and head and "/" not in head and not head.startswith("kafka"):
        return head, tail
    return None, spec


def _default_name(path: Path) -> str:
    name = path.name
    for suffix in (".gz", ".jsonl", ".json"):
        name = name.removesuffix(suffix)
    if name in ("dev", "train", "data", "conversations") and path.parent.name:
        return path.parent.name
    return name or "data"


def check_name(name: str) -> str:
    """A data set or agent name that is safe as a directory name (the event contract's agent pattern)."""
    if not NAME_PATTERN.fullmatch(name) or name.startswith("."):
        raise DataError(f"invalid name {name!r}: use 1-64 of A-Z a-z 0-9 _ . : - (not starting with a dot)")
    return name


def open_source(spec: str, *, datasets_dir: Path | None = None, agent: str | None = None,
                limits: ReadLimits | None = None, sidecar_config: Path | None = None) -> Source:
    """The source a spec names (see the module docstring); raises :class:`DataError` if none."""
    limits = limits or ReadLimits()
    explicit, target = _split_name(spec.strip())
    if not target:
        raise DataError("empty source spec")
    if target.startswith("kafka:"):
        from adapters.kafka_source import KafkaSource

        return KafkaSource.from_spec(check_name(explicit or agent or "kafka"), target, agent=agent, limits=limits,
                                     sidecar_config=sidecar_config)
    path = Path(target)
    candidates = [path]
    if datasets_dir is not None and not path.is_absolute():
        candidates = [datasets_dir / target, *(datasets_dir / (target + s) for s in SUFFIXES), path]
    for candidate in candidates:
        if candidate.is_dir():
            return _from_directory(check_name(explicit or agent or candidate.name), candidate, agent, limits)
        if candidate.is_file():
            name = check_name(explicit or _default_name(candidate))
            return FileSource(name, (candidate,), str(candidate), limits)
    where = f" (looked in {datasets_dir})" if datasets_dir is not None else ""
    raise DataError(f"no conversations at {target!r}{where}: give a JSONL file, a directory of them, "
                    "a training store, or kafka://HOST:PORT/TOPIC")


def discover(datasets_dir: Path) -> list[str]:
    """Every data set under ``datasets_dir``: sub-directories holding JSONL files, and JSONL files."""
    if not datasets_dir.is_dir():
        raise DataError(f"{datasets_dir} is not a directory")
    names = [p.name for p in sorted(datasets_dir.iterdir()) if p.is_dir() and _dir_files(p)]
    names += [_default_name(p) for p in _dir_files(datasets_dir)]
    if not names:
        raise DataError(f"{datasets_dir} holds no data set (no directory of *.jsonl[.gz] files, no such file)")
    return names
