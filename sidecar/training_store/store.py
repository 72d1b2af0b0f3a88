"""Size-bounded, rotated JSONL files per agent: ``<root>/<agent>/<unix ms>-<writer>-<n>.jsonl``.

Each writer (a sidecar process) appends to its own file, so replicas sharing a volume never
interleave lines; names sort by creation time, which is the order ``adapters`` reads them in. A
file past ``max_file_bytes`` is closed and a new one started; past ``max_bytes_per_agent`` the
oldest closed files of the agent's directory (any writer's) are deleted. A line is flushed as it is
written, so a reader sees whole lines, except at most the last one of a file being written, which
the reader skips as malformed. Not thread-safe: one writer thread drives it.
"""

from __future__ import annotations

import re
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

SUFFIX = ".jsonl"
_SAFE_DIR = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:-]{0,63}")


def agent_dir_name(agent: str) -> str:
    """The agent's directory name: the agent itself (the event contract restricts it) unless it could
    escape the root (``.``, ``..``, a leading dot), then a hex spelling of it."""
    return agent if _SAFE_DIR.fullmatch(agent) else "_" + agent.encode().hex()[:120]


@dataclass
class _Agent:
    directory: Path
    sizes: dict[str, int] = field(default_factory=dict)  # file name -> bytes, every writer's
    active: IO[bytes] | None = None
    active_name: str = ""


class RotatingJsonlStore:
    """Appends lines per agent within the bounds; returns what was deleted to stay inside them."""

    def __init__(self, root: Path, *, max_bytes_per_agent: int, max_file_bytes: int) -> None:
        self.root = root
        self.max_bytes = max_bytes_per_agent
        self.max_file_bytes = max_file_bytes
        self._writer = secrets.token_hex(4)
        self._files = 0
        self._agents: dict[str, _Agent] = {}

    def _agent(self, agent: str) -> _Agent:
        state = self._agents.get(agent)
        if state is None:
            directory = self.root / agent_dir_name(agent)
            directory.mkdir(parents=True, exist_ok=True)
            state = self._agents[agent] = _Agent(directory)
            self._rescan(state)
        return state

    def _rescan(self, state: _Agent) -> None:
        sizes = {}
        for p in state.directory.iterdir():
            if p.name.endswith(SUFFIX) and p.is_file():
                sizes[p.name] = p.stat().st_size
        state.sizes = sizes

    def _rotate(self, state: _Agent) -> None:
        if state.active is not None:
            state.active.close()
        self._rescan(state)  # other writers' files count against the same bound
        self._files += 1  # two rotations in one millisecond still get distinct, ordered names
        name = f"{time.time_ns() // 1_000_000:013d}-{self._writer}-{self._files:08d}{SUFFIX}"
        state.active = (state.directory / name).open("ab")
        state.active_name = name
        state.sizes[name] = 0

    def append(self, agent: str, line: bytes) -> int:
        """Append one line (ending in a newline); returns how many old files were deleted."""
        if len(line) > self.max_file_bytes:
            raise ValueError("line larger than max_file_bytes")
        state = self._agent(agent)
        if state.active is None or state.sizes.get(state.active_name, 0) + len(line) > self.max_file_bytes:
            self._rotate(state)
        assert state.active is not None
        state.active.write(line)
        state.active.flush()
        state.sizes[state.active_name] = state.sizes.get(state.active_name, 0) + len(line)
        return self._enforce(state)

    def _enforce(self, state: _Agent) -> int:
        deleted = 0
        for name in sorted(state.sizes):
            if sum(state.sizes.values()) <= self.max_bytes:
                break
            if name == state.active_name:
                continue
            (state.directory / name).unlink(missing_ok=True)
            del state.sizes[name]
            deleted += 1
        return deleted

    def bytes_of(self, agent: str) -> int:
        state = self._agents.get(agent)
        return sum(state.sizes.values()) if state is not None else 0

    def agents(self) -> int:
        return len(self._agents)

    def close(self) -> None:
        """Close every open file (idempotent)."""
        for state in self._agents.values():
            if state.active is not None:
                state.active.close()
                state.active = None
