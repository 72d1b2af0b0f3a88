"""Whether an agent's completion verdicts come from an adapter that was shown to work for it.

An adapter specialised to other traffic calls a new agent's conversations incomplete (or complete)
with confidence; nothing in its output says so. So each agent's route is assessed once, at start:

- ``adapter``: an adapter is configured and its recorded validation F1 on the agent's own held-back
  conversations (``scoring.agents.<name>.validation_f1``, else the ``validation`` section of the
  adapter's manifest, ``adapter_manifest``) is at least ``scoring.completion.min_validation_f1``;
- ``untrusted_adapter``: its recorded validation is below that floor;
- ``unvalidated_adapter``: no validation is recorded for it (e.g. the bundled adapter serving an
  agent it was never shown to fit). ``/readyz`` lists it as not validated on this traffic, apart
  from the untrusted, with the manifest's ``note`` when it has one: the bundled adapter's says it
  is a demo adapter bundled for illustration;
- ``instruct``: no adapter; the paper's instruct prompt on the base model.

Scoring goes on in every case; the assessment is what each outcome's ``completion_source`` says,
what ``sidecar_completion_adapter_trusted{agent}`` exports (1 only for ``adapter``) and what the
``completion_adapters`` check of ``/readyz`` lists. That check never gates readiness (it always
reads ready): an untrusted adapter is a fact to show, not a reason to stop consuming.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import structlog

from sidecar.lifecycle import Health
from sidecar.scoring.config import AgentConfig, ScoringConfig

log = structlog.get_logger()

CompletionSource = Literal["adapter", "untrusted_adapter", "unvalidated_adapter", "instruct"]
DEFAULT_AGENT = "default"
MAX_MANIFEST_BYTES = 1_048_576
MAX_NOTE_CHARS = 200
MAX_VERSION_CHARS = 128
_DETAIL_AGENTS = 20


@dataclass(frozen=True, slots=True)
class AgentRoute:
    """How one agent's completion is scored and how far to trust it."""

    adapter: str | None
    source: CompletionSource
    rule: str
    p_end_threshold: float | None
    validation_f1: float | None
    reason: str
    adapter_version: str | None = None
    """What identifies the adapter's build: its manifest's ``version``, else its ``created_utc``."""

    @property
    def trusted(self) -> bool:
        return self.source == "adapter"

    def outcome(self) -> dict[str, Any]:
        """The keys every completion outcome carries."""
        return {"completion_source": self.source, "adapter": self.adapter, "completion_rule": self.rule}


def manifest_validation(path: Path) -> tuple[dict[str, Any] | None, str]:
    """The ``validation`` section of an exported adapter's manifest, or why it could not be read."""
    try:
        if path.is_dir():
            path = path / "manifest.json"
        if path.stat().st_size > MAX_MANIFEST_BYTES:
            return None, "manifest too large"
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as exc:
        return None, f"manifest unreadable ({type(exc).__name__})"
    validation = doc.get("validation") if isinstance(doc, dict) else None
    if not isinstance(validation, dict):
        return None, "no validation in the manifest"
    return validation, "manifest"


def manifest_version(path: Path | None) -> str | None:
    """The exported adapter's version: its manifest's ``version``, else its ``created_utc``; None
    without a readable manifest."""
    if path is None:
        return None
    try:
        if path.is_dir():
            path = path / "manifest.json"
        if path.stat().st_size > MAX_MANIFEST_BYTES:
            return None
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return None
    if not isinstance(doc, dict):
        return None
    for key in ("version", "created_utc"):
        value = doc.get(key)
        if isinstance(value, str | int) and not isinstance(value, bool) and 0 < len(str(value)) <= MAX_VERSION_CHARS:
            return str(value)
    return None


def manifest_f1(path: Path) -> tuple[float | None, str]:
    """The validation F1 recorded in an exported adapter's manifest, and why it could not be read."""
    validation, why = manifest_validation(path)
    if validation is None:
        return None, why
    f1 = validation.get("f1_complete")
    if isinstance(f1, int | float) and not isinstance(f1, bool) and 0 <= f1 <= 1:
        return float(f1), "manifest"
    return None, "no validation in the manifest"


def manifest_note(path: Path) -> str | None:
    """The ``note`` an adapter's manifest gives in words (what it is for, e.g. a demo adapter), or None.

    Cut to :data:`MAX_NOTE_CHARS` printable characters: it is shown as is on ``/readyz``."""
    try:
        if path.is_dir():
            path = path / "manifest.json"
        if path.stat().st_size > MAX_MANIFEST_BYTES:
            return None
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return None
    note = doc.get("note") if isinstance(doc, dict) else None
    if not isinstance(note, str):
        return None
    return "".join(c for c in note[:MAX_NOTE_CHARS] if c.isprintable()).strip() or None


def assess(agent: AgentConfig, floor: float) -> AgentRoute:
    """The route of one agent's settings (reads the adapter's manifest when it must)."""
    if agent.adapter is None:
        return AgentRoute(None, "instruct", "greedy", None, None, "no adapter configured")
    f1, where = agent.validation_f1, "config"
    if f1 is None and agent.adapter_manifest is not None:
        f1, where = manifest_f1(agent.adapter_manifest)
    threshold = agent.p_end_threshold if agent.completion_rule == "threshold" else None
    version = manifest_version(agent.adapter_manifest)
    if f1 is None:
        reason = "no validation recorded" if where == "config" else where
        note = manifest_note(agent.adapter_manifest) if agent.adapter_manifest is not None else None
        if note is not None:
            reason = f"{note}; {reason}"
        return AgentRoute(agent.adapter, "unvalidated_adapter", agent.completion_rule, threshold, None, reason, version)
    if f1 < floor:
        return AgentRoute(
            agent.adapter,
            "untrusted_adapter",
            agent.completion_rule,
            threshold,
            f1,
            f"validation F1 {f1:.3f} < {floor:.3f} ({where})",
            version,
        )
    return AgentRoute(
        agent.adapter,
        "adapter",
        agent.completion_rule,
        threshold,
        f1,
        f"validation F1 {f1:.3f} >= {floor:.3f} ({where})",
        version,
    )


class AdapterTrust:
    """Every configured agent's route, assessed once; unconfigured agents share ``default_agent``'s.

    ``publish`` sets the trusted gauge for a metric label (called for each label that scores, so
    agents seen only in traffic get their series too). A :class:`~sidecar.lifecycle.HealthReporter`.
    """

    name = "completion_adapters"

    def __init__(self, config: ScoringConfig, gauge: Callable[[str, float], None]) -> None:
        floor = self._floor = config.completion.min_validation_f1
        self._routes = {name: assess(cfg, floor) for name, cfg in config.agents.items()}
        self._default = assess(config.default_agent, floor)
        self._gauge = gauge
        self._published: set[str] = set()
        for name, route in [*self._routes.items(), (DEFAULT_AGENT, self._default)]:
            log.info("score.adapter_trust", agent=name, source=route.source, reason=route.reason)

    def reassess(self, agent: str, settings: AgentConfig | None, configured: AgentConfig) -> None:
        """A live route took effect for ``agent`` (``settings`` None: its configured one again)."""
        route = assess(settings if settings is not None else configured, self._floor)
        self._routes[agent] = route
        self._published = {label for label in self._published if label != agent}
        log.info("score.adapter_trust", agent=agent, source=route.source, reason=route.reason, live=True)

    def route(self, agent: str | None) -> AgentRoute:
        if agent is not None and agent in self._routes:
            return self._routes[agent]
        return self._default

    def publish(self, label: str, route: AgentRoute) -> None:
        if label not in self._published:
            self._published.add(label)
            self._gauge(label, 1.0 if route.trusted else 0.0)

    def publish_configured(self, label_of: Callable[[str | None], str]) -> None:
        for name, route in self._routes.items():
            self.publish(label_of(name), route)
        self.publish(label_of(None), self._default)

    def health(self) -> Health:
        entries = [(name, r) for name, r in self._routes.items()] + [("(other agents)", self._default)]
        # An adapter never validated is not known to be wrong, only unproven here: worded apart
        # from one whose validation fell short and from the instruct fallback.
        unvalidated = [f"{n}: {r.source} ({r.reason})" for n, r in entries if r.source == "unvalidated_adapter"]
        untrusted = [
            f"{n}: {r.source} ({r.reason})" for n, r in entries if not r.trusted and r.source != "unvalidated_adapter"
        ]
        trusted = [n for n, r in entries if r.trusted]
        parts = []
        for heading, listed in (
            ("no trustworthy adapter for ", untrusted),
            ("not validated on this traffic: ", unvalidated),
        ):
            if listed:
                more = f" and {len(listed) - _DETAIL_AGENTS} more" if len(listed) > _DETAIL_AGENTS else ""
                parts.append(heading + "; ".join(listed[:_DETAIL_AGENTS]) + more)
        if trusted:
            parts.append(f"trusted: {', '.join(trusted[:_DETAIL_AGENTS])}")
        # Never gates: an agent without a validated adapter is shown, not a reason to stop consuming.
        return Health(self.name, True, "; ".join(parts))
