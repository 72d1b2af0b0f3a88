"""Bounded label values for the ``agent`` label of every metric.

Agents named in the configuration always get their own value. Other agents get one too, first come
first served, up to ``max_dynamic`` of them (a new agent shows up on dashboards without a config
change); past that they share ``other``. Events without an agent are ``default``. The set of
values is therefore at most ``len(configured) + max_dynamic + 2``, whatever producers send (the
event contract already restricts agent names to ``[A-Za-z0-9_.:-]{1,64}``).
"""

from __future__ import annotations

from collections.abc import Iterable

DEFAULT = "default"
OTHER = "other"


class AgentLabels:
    def __init__(self, configured: Iterable[str] = (), max_dynamic: int = 32) -> None:
        self._known = set(configured)
        self._dynamic: set[str] = set()
        self._max_dynamic = max_dynamic

    def __call__(self, agent: str | None) -> str:
        if agent is None:
            return DEFAULT
        if agent in self._known or agent in self._dynamic:
            return agent
        if agent in (DEFAULT, OTHER) or len(self._dynamic) >= self._max_dynamic:
            return OTHER
        self._dynamic.add(agent)
        return agent
