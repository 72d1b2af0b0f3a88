"""``adapters promote`` and ``adapters rollback``: change an agent's route on every replica, live.

Promotion compares a candidate adapter with the adapter serving the agent now **on the same
held-back conversations** (an onboarding's held-back slice, under the label-free truncation
protocol), each under its own completion rule and threshold, in-process on the same token ids the
sidecar sends. The candidate is promoted only when its F1 on the complete class reaches the
sidecar's floor (``scoring.completion.min_validation_f1``) and beats the serving adapter's by more
than ``margin``; then it is loaded into every vLLM server named, and only after that the new route
is written to the routing topic, which every replica applies live (:mod:`sidecar.scoring.routes`).
A refusal is written too (the route unchanged, the decision and its figures recorded), so every
replica's metrics and logs show it; when the serving adapter was re-scored, its fresh F1 becomes the
route's ``validation_f1``, so every replica's trust in it follows the figure (an adapter re-validated
above the floor is no longer untrusted, and ``maintain`` stops re-onboarding the agent for that).
Either way the decision is kept in ``promotion.json`` of the onboarding directory and appended to
the candidate manifest's ``promotions``. An onboarding (or candidate) made for another agent than
the one named is refused before anything is scored.

A rollback writes the route before the current one (the row's history) back, loading its adapter
again first where a vLLM server is named (a restarted server has lost runtime-loaded adapters). It
holds: ``adapters maintain`` leaves the agent alone until an operator releases it
(:func:`release`, a ``released`` row) or drift measured since the rollback asks again.

One job writes at a time (the chart's CronJob forbids concurrent runs); the row's version grows by
one per decision, and replicas ignore a row whose version is not above the one they hold.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from adapters.errors import DataError, ServeError
from adapters.evaluation.binary import binary_metrics
from adapters.promotion.topic import read_rows, write_row
from adapters.serving.manifest import read_manifest
from adapters.serving.serving import load_adapter
from sidecar.config import SidecarConfig
from sidecar.scoring.config import DriftBaselineConfig
from sidecar.scoring.routes import MAX_HISTORY, DecisionRecord, Route, RouteRow

log = structlog.get_logger()


@dataclass(frozen=True)
class PromoteSpec:
    agent: str
    onboarding: Path
    config: SidecarConfig
    candidate: Path | None = None
    serving_dir: Path | None = None
    base: Path | None = None
    vllm_urls: tuple[str, ...] = ()
    served_path: Path | None = None
    margin: float = 0.0


@dataclass(frozen=True)
class Scored:
    f1: float | None
    how: str
    fresh: bool = False  # re-scored now on the held-back conversations (not a recorded figure)


def _onboarding_manifest(out: Path) -> dict[str, Any]:
    if not (out / "data" / "holdback.jsonl").is_file():
        raise DataError(f"{out} holds no onboarding's held-back slice (data/holdback.jsonl)")
    try:
        return read_manifest(out)
    except (OSError, ValueError, TypeError) as exc:
        raise DataError(f"{out}: no readable onboarding manifest ({type(exc).__name__})") from None


def _candidate_route(candidate: Path, f1: float) -> Route:
    try:
        return _route_of_manifest(candidate, f1)
    except (OSError, ValueError, TypeError) as exc:  # pydantic's ValidationError is a ValueError
        raise DataError(f"{candidate}: the manifest does not describe a servable adapter: {exc}") from None


def _route_of_manifest(candidate: Path, f1: float) -> Route:
    manifest = read_manifest(candidate)
    validation = manifest.get("validation") or {}
    name = manifest.get("served_name")
    if not isinstance(name, str):
        raise DataError(f"{candidate}: the manifest names no served_name (export it with `adapters onboard`)")
    raw_baseline = validation.get("baseline")
    return Route(
        adapter=name,
        completion_rule=validation.get("rule", "greedy"),
        p_end_threshold=validation.get("p_end_threshold") if validation.get("rule") == "threshold" else None,
        validation_f1=round(f1, 6),
        baseline=DriftBaselineConfig.model_validate(raw_baseline) if raw_baseline else None,
        adapter_dir=str(candidate.resolve()),
        since=time.time(),
    )


def _complete_score(
    base: Path, adapter: Path, route: Route, *, examples: list[Any], window: dict[str, Any], desc: str
) -> float:
    from adapters.onboarding.onboard import score_examples

    scored = score_examples(
        base,
        adapter,
        examples,
        max_context_tokens=window["max_context_tokens"],
        max_message_tokens=window.get("max_message_tokens"),
        desc=desc,
    )
    if route.completion_rule == "threshold" and route.p_end_threshold is not None:
        predicted = [e.p_end >= route.p_end_threshold for e in scored]
    else:
        predicted = [e.greedy_end for e in scored]
    f1 = binary_metrics([e.complete for e in scored], predicted)["complete"]["f1"]
    return float(f1 or 0.0)


def _serving_score(
    spec: PromoteSpec, serving: Route, base: Path, examples: list[Any], window: dict[str, Any]
) -> Scored:
    if serving.adapter is None:
        return Scored(None, "no adapter serves the agent (instruct prompt): none to beat")
    where = spec.serving_dir or (Path(serving.adapter_dir) if serving.adapter_dir else None)
    if where is None or not where.is_dir():
        if serving.validation_f1 is None:
            return Scored(None, f"serving adapter {serving.adapter} not found and no validation recorded")
        return Scored(serving.validation_f1, f"serving adapter {serving.adapter} not found: its recorded F1")
    return Scored(
        _complete_score(base, where, serving, examples=examples, window=window, desc="score serving"),
        f"re-scored {serving.adapter}",
        fresh=True,
    )


def _check_agent(spec: PromoteSpec, onboarding: dict[str, Any], candidate: Path) -> None:
    """An onboarding (and its candidate) made for another agent is never promoted for this one."""
    made_for = (onboarding.get("spec") or {}).get("agent")
    if made_for != spec.agent:
        said = "records no agent" if made_for is None else f"was made for agent {made_for!r}"
        raise DataError(f"{spec.onboarding}: the onboarding {said}, not --agent {spec.agent!r}")
    try:
        trained_for = read_manifest(candidate).get("agent")
    except (OSError, ValueError, TypeError):
        return  # said below, when the candidate's route is read
    if trained_for is not None and trained_for != spec.agent:
        raise DataError(f"{candidate}: the candidate was trained for agent {trained_for!r}, not --agent {spec.agent!r}")


def promote(spec: PromoteSpec) -> dict[str, Any]:
    """Validate, decide, load and publish (see the module docstring); the decision's document."""
    from adapters.onboarding.onboard import protocol_examples

    onboarding = _onboarding_manifest(spec.onboarding)
    fields = onboarding.get("spec", {})
    candidate = spec.candidate or spec.onboarding / "adapter"
    if not (candidate / "manifest.json").is_file():
        raise DataError(f"no exported adapter at {candidate}")
    _check_agent(spec, onboarding, candidate)
    base = spec.base or Path(fields.get("base", ""))
    if not base.is_dir():
        raise DataError(f"no base model at {base} (give --base)")
    window = fields.get("recipe") or {}
    if "max_context_tokens" not in window:
        raise DataError(f"{spec.onboarding}: the onboarding manifest records no training window")
    examples = protocol_examples(spec.onboarding / "data", int(fields.get("seed", 0)))

    rows = asyncio.run(read_rows(spec.config))
    current = rows.get(spec.agent)
    serving = current.route if current else Route.of(spec.config.scoring.agent(spec.agent))
    provisional = _candidate_route(candidate, 0.0)
    cand_f1 = _complete_score(base, candidate, provisional, examples=examples, window=window, desc="score candidate")
    route = provisional.model_copy(update={"validation_f1": round(cand_f1, 6)})
    serv = _serving_score(spec, serving, base, examples, window)
    floor = spec.config.scoring.completion.min_validation_f1
    if cand_f1 < floor:
        kind, reason = "refused", f"candidate F1 {cand_f1:.3f} < floor {floor:.3f}"
    elif serving.adapter == route.adapter:
        kind, reason = "refused", f"{route.adapter} already serves the agent"
    elif serv.f1 is not None and cand_f1 <= serv.f1 + spec.margin:
        kind, reason = "refused", f"candidate F1 {cand_f1:.3f} <= serving {serv.f1:.3f} + margin {spec.margin}"
    else:
        kind = "promoted"
        reason = f"candidate F1 {cand_f1:.3f}" + (f" > serving {serv.f1:.3f}" if serv.f1 is not None else "")
        reason += f" ({serv.how})"
    loaded = []
    if kind == "promoted":
        path = spec.served_path or candidate.resolve()
        assert route.adapter is not None
        loaded = [load_adapter(url, route.adapter, path) for url in spec.vllm_urls]
    decision = DecisionRecord(
        kind=kind,
        at=time.time(),
        candidate=route.adapter,
        candidate_f1=round(cand_f1, 6),
        serving_f1=None if serv.f1 is None else round(serv.f1, 6),
        reason=reason,
    )
    history = (serving, *(current.history if current else ()))[:MAX_HISTORY]
    kept = serving
    if kind == "refused" and serv.fresh and serv.f1 is not None:
        # The serving adapter's figure on the newest held-back conversations replaces the recorded
        # one (or the missing one): the replicas' trust in it follows.
        kept = serving.model_copy(update={"validation_f1": round(serv.f1, 6)})
    row = RouteRow(
        agent=spec.agent,
        generation=current.generation if current else 0,
        version=(current.version if current else 0) + 1,
        route=route if kind == "promoted" else kept,
        decision=decision,
        history=history if kind == "promoted" else (current.history if current else ()),
    )
    asyncio.run(write_row(spec.config, row))
    doc = {
        "agent": spec.agent,
        "decision": kind,
        "reason": reason,
        "candidate": route.adapter,
        "candidate_f1": decision.candidate_f1,
        "serving": serving.adapter,
        "serving_f1": decision.serving_f1,
        "serving_scored": serv.how,
        "route_validation_f1": row.route.validation_f1,
        "examples": len(examples),
        "loaded": loaded,
        "version": row.version,
    }
    (spec.onboarding / "promotion.json").write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    _record_in_manifest(candidate, doc)
    log.info("adapters.promotion", **{k: doc[k] for k in ("agent", "decision", "reason", "candidate", "version")})
    return doc


def _record_in_manifest(candidate: Path, doc: dict[str, Any]) -> None:
    """Append the decision to the candidate's manifest (``promotions``: every decision it met)."""
    path = candidate / "manifest.json"
    manifest = json.loads(path.read_text(encoding="utf-8"))
    decisions = manifest.get("promotions") if isinstance(manifest.get("promotions"), list) else []
    manifest["promotions"] = [*decisions, {k: doc[k] for k in ("agent", "decision", "reason", "version")}][-20:]
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    tmp.replace(path)


def rollback(agent: str, config: SidecarConfig, vllm_urls: tuple[str, ...] = ()) -> dict[str, Any]:
    """Write the route before the current one back (loading its adapter again where asked)."""
    current = asyncio.run(read_rows(config)).get(agent)
    if current is None or not current.history:
        raise DataError(f"nothing to roll back to for {agent}: no earlier route on the routing topic")
    previous, rest = current.history[0], current.history[1:]
    if previous.adapter is not None and vllm_urls:
        if previous.adapter_dir is None:
            raise ServeError(f"{previous.adapter}: its directory is not recorded, so it cannot be loaded again")
        for url in vllm_urls:
            load_adapter(url, previous.adapter, Path(previous.adapter_dir))
    restored = previous.model_copy(update={"since": time.time()})
    row = RouteRow(
        agent=agent,
        generation=current.generation,
        version=current.version + 1,
        route=restored,
        decision=DecisionRecord(
            kind="rolled_back",
            at=time.time(),
            candidate=previous.adapter,
            reason=f"rolled back from {current.route.adapter} to {previous.adapter}",
        ),
        history=rest,
    )
    asyncio.run(write_row(config, row))
    log.info("adapters.rollback", agent=agent, adapter=previous.adapter, version=row.version)
    return {
        "agent": agent,
        "decision": "rolled_back",
        "from": current.route.adapter,
        "to": previous.adapter,
        "version": row.version,
    }


def release(agent: str, config: SidecarConfig) -> dict[str, Any]:
    """Lift the hold of the agent's rollback (``adapters release``): a ``released`` row that keeps
    the route, after which ``adapters maintain`` treats the agent as any other."""
    current = asyncio.run(read_rows(config)).get(agent)
    if current is None or current.decision.kind != "rolled_back":
        last = "no row on the routing topic" if current is None else f"its last decision is {current.decision.kind}"
        raise DataError(f"no rollback holds {agent}: {last}")
    row = RouteRow(
        agent=agent,
        generation=current.generation,
        version=current.version + 1,
        route=current.route,
        decision=DecisionRecord(
            kind="released",
            at=time.time(),
            candidate=current.route.adapter,
            reason=f"the rollback to {current.route.adapter} released by an operator",
        ),
        history=current.history,
    )
    asyncio.run(write_row(config, row))
    log.info("adapters.release", agent=agent, adapter=current.route.adapter, version=row.version)
    return {"agent": agent, "decision": "released", "adapter": current.route.adapter, "version": row.version}


def routes(config: SidecarConfig) -> dict[str, Any]:
    """Every agent's live route and last decision (``adapters routes``)."""
    from sidecar.scoring.routes import summary

    return {agent: summary(row) for agent, row in sorted(asyncio.run(read_rows(config)).items())}
