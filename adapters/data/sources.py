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
  :mod:`adapters.data.kafka_source`.
- the fleet's training topic (``training_store.backend: kafka``):
  ``kafka-training://HOST:PORT[,HOST:PORT]/TOPIC``, or ``kafka-training:`` with the sidecar's
  config file (its brokers, security and training topic); one conversation per key, the newest
  ``newest`` per agent; see :mod:`adapters.data.training_topic`.

``NAME=SPEC`` names a source explicitly; otherwise the name is the file's stem or the directory's
name. No list of known names exists anywhere: any name is a data set.

Files are read with :mod:`sidecar.transcript.dataset` and its limits policy: a line over 8 MiB
is skipped without being held in memory; a source that yields more than ``max_total_bytes``
(after decompression: a gzip bomb counts what it inflates to) is an error, not a silent cut; past
``max_records`` conversations reading stops with a warning. Malformed lines are counted and
skipped, and a source with no usable conversation is an error that says why.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import structlog

from adapters.data.conversations import BadRecordError, Conversation, from_record, stats_json
from adapters.errors import DataError
from adapters.serving.manifest import file_sha256
from sidecar.transcript.dataset import MAX_TOTAL_BYTES, DatasetError, ReadLimits, ReadStats
from sidecar.transcript.dataset import read_conversations as read_records

log = structlog.get_logger()

SUFFIXES = (".jsonl", ".jsonl.gz")
NAME_PATTERN = re.compile(r"[A-Za-z0-9_.:-]{1,64}")


__all__ = [
    "FileSource",
    "ReadLimits",
    "ReadStats",
    "Source",
    "check_name",
    "discover",
    "explain",
    "open_source",
    "read_jsonl",
    "source_limits",
    "stats_json",
]


def source_limits(max_total_bytes: int, max_records: int | None = None) -> ReadLimits:
    """The reader's limits for one source, ``--max-input-bytes`` being its byte cap."""
    return ReadLimits(max_total_bytes=max_total_bytes, max_records=max_records, flag="--max-input-bytes")


def explain(stats: ReadStats, name: str, without_user: int) -> str:
    """Why ``name`` gave no usable conversation, in one line."""
    reasons = ", ".join(f"{k}: {v}" for k, v in sorted(stats.skipped.items()))
    return (
        f"data set {name!r} has no usable conversation: {stats.lines} lines read, {stats.malformed} "
        f"malformed{f' ({reasons})' if reasons else ''}, {without_user} without a user message"
    )


class Source(Protocol):
    """Conversations from somewhere. ``conversations()`` may be called once; ``stats`` is filled
    as it is consumed; ``describe()`` is what a manifest records (no secrets, no message text)."""

    name: str
    stats: ReadStats

    def conversations(self) -> Iterator[Conversation]: ...

    def describe(self) -> dict[str, Any]: ...


def is_data_file(path: Path) -> bool:
    return path.name.endswith(SUFFIXES)


def read_jsonl(path: Path, stats: ReadStats, limits: ReadLimits | None = None) -> Iterator[Conversation]:
    """Conversations of one (gzipped) JSONL file; malformed lines are counted and skipped."""
    try:
        for rec in read_records(path, stats=stats, limits=limits):
            try:
                conv = from_record(rec)
            except BadRecordError as bad:
                stats.drop(rec.line, bad.reason)
                continue
            yield conv
    except DatasetError as exc:
        raise DataError(str(exc)) from exc
    if stats.malformed:
        log.info(
            "adapters.data.skipped",
            path=path.name,
            bad_records=stats.malformed,
            reasons=dict(sorted(stats.skipped.items())),
            first=stats.problems,
        )


def read_conversations(path: Path) -> Iterator[Conversation]:
    """Stream conversations from a (gzipped) JSONL file; malformed lines are counted and skipped."""
    yield from read_jsonl(path, ReadStats())


@dataclass
class FileSource:
    """JSONL files (one, or every data file of a directory)."""

    name: str
    paths: tuple[Path, ...]
    location: str
    limits: ReadLimits = field(default_factory=ReadLimits)
    stats: ReadStats = field(default_factory=ReadStats)

    def conversations(self) -> Iterator[Conversation]:
        cap = self.limits.max_records
        for path in self.paths:
            yield from read_jsonl(path, self.stats, self.limits)
            if cap is not None and self.stats.records >= cap:
                log.warning("adapters.source.capped", source=self.name, max_conversations=cap)
                return

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "kind": "jsonl",
            "location": self.location,
            "files": {p.name: file_sha256(p) for p in self.paths},
            **stats_json(self.stats),
        }


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
            raise DataError(
                f"{directory} holds one directory per agent ({hint}): name one with --agent "
                "or point at the agent's directory"
            )
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


def open_source(
    spec: str,
    *,
    datasets_dir: Path | None = None,
    agent: str | None = None,
    limits: ReadLimits | None = None,
    sidecar_config: Path | None = None,
    newest: int | None = None,
) -> Source:
    """The source a spec names (see the module docstring); raises :class:`DataError` if none.

    ``newest``: a source that can hold only its newest conversations per agent while reading (the
    training topic) keeps that many; the others ignore it."""
    limits = limits or source_limits(MAX_TOTAL_BYTES)
    explicit, target = _split_name(spec.strip())
    if not target:
        raise DataError("empty source spec")
    if target.startswith("kafka-training:"):
        from adapters.data.training_topic import TrainingTopicSource

        return TrainingTopicSource.from_spec(
            check_name(explicit or agent or "kafka-training"),
            target,
            agent=agent,
            limits=limits,
            sidecar_config=sidecar_config,
            newest=newest,
        )
    if target.startswith("kafka:"):
        from adapters.data.kafka_source import KafkaSource

        return KafkaSource.from_spec(
            check_name(explicit or agent or "kafka"), target, agent=agent, limits=limits, sidecar_config=sidecar_config
        )
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
    raise DataError(
        f"no conversations at {target!r}{where}: give a JSONL file, a directory of them, "
        "a training store, kafka://HOST:PORT/TOPIC or kafka-training://HOST:PORT/TOPIC"
    )


def discover(datasets_dir: Path) -> list[str]:
    """Every data set under ``datasets_dir``: sub-directories holding JSONL files, and JSONL files."""
    if not datasets_dir.is_dir():
        raise DataError(f"{datasets_dir} is not a directory")
    names = [p.name for p in sorted(datasets_dir.iterdir()) if p.is_dir() and _dir_files(p)]
    names += [_default_name(p) for p in _dir_files(datasets_dir)]
    if not names:
        raise DataError(f"{datasets_dir} holds no data set (no directory of *.jsonl[.gz] files, no such file)")
    return names
