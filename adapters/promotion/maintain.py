"""``adapters maintain``: the loop a scheduler runs (the chart's CronJob).

1. Read the replicas' ``/metrics`` and pick the agents that need a new adapter: one whose route is
   not trusted (``sidecar_completion_adapter_trusted`` 0) or whose live verdicts drifted from the
   serving adapter's validation baseline (any ``sidecar_adapter_drift`` signal above ``max_drift``
   on any replica).
2. For each, onboard a candidate on the agent's newest conversations (by default the fleet's
   training topic), continuing the serving adapter where its directory is known.
3. Promote it only if it beats the serving adapter on the same held-back conversations
   (:mod:`adapters.promotion.promote`); a refusal keeps the route, records the decision and the
   serving adapter's fresh F1 (which the replicas' trust follows).

A rollback holds (:func:`hold_rollbacks`): an agent whose last decision is ``rolled_back`` is
not due for being untrusted; only drift measured since the rollback (every replica starts the
agent's drift window over when the rollback's route takes effect) or ``adapters release`` makes it
due again.
"""

from __future__ import annotations

import argparse
import re
import shlex
import time
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import structlog
from prometheus_client.parser import text_string_to_metric_families

from adapters.errors import AdaptersError, DataError

if TYPE_CHECKING:
    from sidecar.scoring.routes import RouteRow

log = structlog.get_logger()

MAX_METRICS_BYTES = 16 * 1024 * 1024
NAME = re.compile(r"[A-Za-z0-9_:-][A-Za-z0-9_.:-]{0,63}")  # an agent name `onboard` takes, not "." or ".."
SHARED_LABELS = frozenset({"default", "other"})


@dataclass(frozen=True)
class Due:
    agent: str
    reasons: tuple[str, ...]


def due_agents(expositions: Iterable[str], *, max_drift: float) -> list[Due]:
    """The agents whose route is untrusted or drifted on any replica (``default``/``other`` excluded:
    they stand for many agents)."""
    reasons: dict[str, set[str]] = defaultdict(set)
    for text in expositions:
        try:
            families = list(text_string_to_metric_families(text))
        except ValueError as exc:
            raise DataError(f"a replica's /metrics does not parse: {exc}") from None
        for family in families:
            for sample in family.samples:
                agent = sample.labels.get("agent")
                if agent is None or agent in SHARED_LABELS or not NAME.fullmatch(agent):
                    continue  # no agent of its own, or a name no adapter can be onboarded under
                if sample.name == "sidecar_completion_adapter_trusted" and sample.value == 0:
                    reasons[agent].add("untrusted")
                elif sample.name == "sidecar_adapter_drift" and sample.value > max_drift:
                    reasons[agent].add(f"drift:{sample.labels.get('signal', '?')}")
    return [Due(a, tuple(sorted(r))) for a, r in sorted(reasons.items())]


def hold_rollbacks(due: list[Due], rows: Mapping[str, RouteRow]) -> tuple[list[Due], dict[str, str]]:
    """The agents still due once rollbacks hold, and what holds each held one.

    An agent whose row's last decision is ``rolled_back`` stays on its restored route: being
    untrusted is no reason to replace it (the operator chose it). Drift is, because it was measured
    since the rollback: each replica restarts the agent's drift window when the rollback's route
    takes effect, so a drift signal it exports is evidence against the restored route."""
    still: list[Due] = []
    held: dict[str, str] = {}
    for item in due:
        row = rows.get(item.agent)
        if row is None or row.decision.kind != "rolled_back":
            still.append(item)
            continue
        drift = tuple(r for r in item.reasons if r.startswith("drift:"))
        if drift:
            still.append(Due(item.agent, drift))
            continue
        when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(row.decision.at))
        held[item.agent] = (
            f"rolled back to {row.route.adapter or 'the instruct prompt'} at {when} (version {row.version}); "
            f"held, though {', '.join(item.reasons)}, until `adapters release --agent {item.agent}` or drift "
            "above --max-drift since the rollback"
        )
    return still, held


def scrape(url: str, *, timeout_seconds: float = 10.0) -> str:
    try:
        with httpx.Client(timeout=timeout_seconds) as http, http.stream("GET", url) as resp:
            resp.raise_for_status()
            body = b""
            for chunk in resp.iter_bytes():
                body += chunk
                if len(body) > MAX_METRICS_BYTES:
                    raise DataError(f"{url}: /metrics over {MAX_METRICS_BYTES} bytes")
    except httpx.HTTPError as exc:
        raise DataError(f"cannot read {url}: {type(exc).__name__}") from None
    return body.decode("utf-8", errors="replace")


def maintain(args: Any) -> dict[str, Any]:
    """Run the loop once with the parsed ``adapters maintain`` arguments."""
    import asyncio

    from adapters.onboarding.cli import add_parser, spec_from_args
    from adapters.onboarding.onboard import run_onboarding
    from adapters.promotion.promote import PromoteSpec, promote
    from adapters.promotion.topic import read_rows
    from sidecar.config import load_config
    from sidecar.scoring.routes import Route

    def build_parser() -> argparse.ArgumentParser:  # `adapters onboard`'s own arguments
        parser = argparse.ArgumentParser(prog="adapters")
        add_parser(parser.add_subparsers(dest="command"))
        return parser

    config = load_config(args.sidecar_config)
    due = due_agents((scrape(u) for u in args.metrics_url), max_drift=args.max_drift)
    if args.agent:
        due = [d for d in due if d.agent in set(args.agent)]
    rows = asyncio.run(read_rows(config)) if due else {}
    due, held = hold_rollbacks(due, rows)
    for agent, why in held.items():
        log.info("adapters.maintain.held", agent=agent, reason=why)
    log.info("adapters.maintain.due", agents={d.agent: d.reasons for d in due})
    if args.dry_run or not due:
        return {"due": {d.agent: list(d.reasons) for d in due}, "held": held, "results": {}}
    try:
        extra = shlex.split(args.onboard_flags)
    except ValueError as exc:
        raise DataError(f"--onboard-flags: {exc}") from None
    try:  # checked once, before any agent is onboarded
        build_parser().parse_args(["onboard", "--agent", "a", "--source", "-", "--out", str(args.work), *extra])
    except SystemExit:  # argparse said why on stderr
        raise DataError(f"--onboard-flags: `adapters onboard` refuses {args.onboard_flags!r}") from None
    results: dict[str, Any] = {}
    for item in due:
        out = args.work / item.agent / time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        row = rows.get(item.agent)
        serving = row.route if row else Route.of(config.scoring.agent(item.agent))
        argv = ["onboard", "--agent", item.agent, "--out", str(out), "--sidecar-config", str(args.sidecar_config)]
        for source in args.source:
            argv += ["--source", source]
        if args.base is not None:
            argv += ["--base", str(args.base)]
        if serving.adapter_dir is not None and (Path(serving.adapter_dir) / "manifest.json").is_file():
            # Continue what serves the agent now when `adapters` trained it (its recipe is recorded);
            # otherwise `onboard`'s own default.
            argv += ["--init-adapter", serving.adapter_dir]
        try:
            onboarded = run_onboarding(spec_from_args(build_parser().parse_args([*argv, *extra])))
            decision = promote(
                PromoteSpec(
                    agent=item.agent,
                    onboarding=out,
                    config=config,
                    base=args.base,
                    vllm_urls=tuple(args.vllm_url),
                    served_path=None,
                    margin=args.margin,
                )
            )
        except AdaptersError as exc:  # one agent's failure does not stop the others
            log.warning("adapters.maintain.failed", agent=item.agent, error=str(exc))
            results[item.agent] = {"reasons": list(item.reasons), "error": str(exc)}
            continue
        results[item.agent] = {
            "reasons": list(item.reasons),
            "onboarding": str(out),
            "validation_f1": onboarded["validation_f1"],
            **decision,
        }
    return {"due": {d.agent: list(d.reasons) for d in due}, "held": held, "results": results}
