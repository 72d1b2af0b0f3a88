"""Live adapter routing (``sidecar/scoring/routes.py``): decoding hostile rows, fencing, applying rows
over the configured agents, and what ScoringHooks does when a route changes. No Kafka here."""

from __future__ import annotations

import inspect
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry
from structlog.testing import capture_logs

from sidecar.contract import CompletionScored, HookResult, Outcome, TurnContext, events_of
from sidecar.fleet.table import Change, InvalidRow
from sidecar.scoring.config import AgentConfig, ScoringConfig
from sidecar.scoring.hooks import ScoringHooks
from sidecar.scoring.routes import (
    MAX_HISTORY,
    MAX_ROUTE_BYTES,
    DecisionRecord,
    LiveRoutes,
    Route,
    RouteRow,
    accept_route,
    decode_route,
    encode_route,
    summary,
)
from sidecar.telemetry.labels import AgentLabels
from tests.scoring.conversations import RESTAURANT, TRAVEL
from tests.scoring.fakes import ToyLM
from tests.support.tiny_model import build_tokenizer

BASELINE = {"completion_rate": 0.6, "p_end_quantiles": [0.0, 0.2, 0.5, 1.0], "untrusted_share": 0.0}


def _doc(**over: Any) -> dict[str, Any]:
    """A valid row as JSON data; ``over`` replaces top-level keys."""
    doc: dict[str, Any] = {
        "schema_version": 1,
        "agent": "shop",
        "generation": 3,
        "version": 7,
        "route": {
            "adapter": "shop-2",
            "completion_rule": "threshold",
            "p_end_threshold": 0.4,
            "validation_f1": 0.91,
            "baseline": BASELINE,
            "adapter_dir": "/adapters/shop-2",
            "since": 1_700_000_000.5,
        },
        "decision": {
            "kind": "promoted",
            "at": 1_700_000_000.5,
            "candidate": "shop-2",
            "candidate_f1": 0.91,
            "serving_f1": 0.7,
            "reason": "candidate F1 0.910 > serving 0.700",
        },
        "history": [{"adapter": "shop-1", "validation_f1": 0.7}, {"adapter": None}],
    }
    doc.update(over)
    return doc


def _route(**over: Any) -> dict[str, Any]:
    return {**_doc()["route"], **over}


def _raw(doc: Any) -> bytes:
    return json.dumps(doc).encode()


def _row(
    agent: str = "shop",
    version: int = 1,
    *,
    generation: int = 0,
    kind: str = "promoted",
    at: float = 1000.0,
    history: tuple[Route, ...] = (),
    **route: Any,
) -> RouteRow:
    return RouteRow(
        agent=agent,
        generation=generation,
        version=version,
        route=Route(**route),
        decision=DecisionRecord(kind=kind, at=at),
        history=history,
    )


# -- decoding ------------------------------------------------------------------------------------


def test_a_valid_row_round_trips() -> None:
    row = decode_route(_raw(_doc()))
    assert row.agent == "shop" and (row.generation, row.version) == (3, 7)
    assert row.route.adapter == "shop-2" and row.route.completion_rule == "threshold"
    assert row.route.p_end_threshold == 0.4 and row.route.validation_f1 == 0.91
    assert row.route.baseline is not None and row.route.baseline.p_end_quantiles == (0.0, 0.2, 0.5, 1.0)
    assert row.decision.kind == "promoted" and row.decision.serving_f1 == 0.7
    assert [h.adapter for h in row.history] == ["shop-1", None]
    assert decode_route(encode_route(row)) == row
    assert encode_route(decode_route(encode_route(row))) == encode_route(row)


def test_a_minimal_row_gets_the_defaults() -> None:
    row = decode_route(_raw({"agent": "a", "version": 1, "route": {}, "decision": {"kind": "refused", "at": 0}}))
    assert row.schema_version == 1 and row.generation == 0 and row.history == ()
    assert row.route == Route() and row.route.completion_rule == "greedy"
    assert decode_route(encode_route(row)) == row


def test_summary_names_the_history_by_adapter() -> None:
    doc = summary(decode_route(_raw(_doc())))
    assert doc["history"] == ["shop-1", None]
    assert doc["route"]["adapter"] == "shop-2" and doc["decision"]["kind"] == "promoted"


def _nested(depth: int) -> dict[str, Any]:
    inner: dict[str, Any] = {}
    for _ in range(depth):
        inner = {"x": inner}
    return inner


HOSTILE: list[tuple[str, bytes, str]] = [
    ("not JSON", b"adapter=shop-2", "invalid route row"),
    ("empty", b"", "invalid route row"),
    ("truncated", _raw(_doc())[:-5], "invalid route row"),
    ("JSON array", _raw([_doc()]), "invalid route row: row"),
    ("JSON string", b'"shop"', "invalid route row: row"),
    ("JSON null", b"null", "invalid route row: row"),
    ("schema 2", _raw(_doc(schema_version=2)), "schema_version"),
    ("schema as text", _raw(_doc(schema_version="1")), "schema_version"),
    ("extra top-level field", _raw(_doc(owner="mallory")), "owner"),
    ("extra route field", _raw(_doc(route=_route(tree_model="evil"))), "route.tree_model"),
    ("extra decision field", _raw(_doc(decision={**_doc()["decision"], "by": "x"})), "decision.by"),
    ("missing version", _raw({k: v for k, v in _doc().items() if k != "version"}), "version"),
    ("missing agent", _raw({k: v for k, v in _doc().items() if k != "agent"}), "agent"),
    ("agent with slash", _raw(_doc(agent="../etc")), "agent"),
    ("agent with space", _raw(_doc(agent="shop 2")), "agent"),
    ("agent with newline", _raw(_doc(agent="shop\n")), "agent"),
    ("agent with braces", _raw(_doc(agent='shop"}')), "agent"),
    ("agent non-ASCII", _raw(_doc(agent="shöp")), "agent"),
    ("agent empty", _raw(_doc(agent="")), "agent"),
    ("agent of 65 chars", _raw(_doc(agent="a" * 65)), "agent"),
    ("agent not a string", _raw(_doc(agent=["shop"])), "agent"),
    ("adapter with slash", _raw(_doc(route=_route(adapter="a/b"))), "route.adapter"),
    ("candidate of 65 chars", _raw(_doc(decision={**_doc()["decision"], "candidate": "c" * 65})), "candidate"),
    ("negative version", _raw(_doc(version=-1)), "version"),
    ("version 0", _raw(_doc(version=0)), "version"),
    ("huge version", _raw(_doc(version=2**63)), "version"),
    ("enormous version", b'{"agent":"shop","version":' + b"9" * 4000 + b"}", "invalid route row"),
    ("fractional version", _raw(_doc(version=1.5)), "version"),
    ("negative generation", _raw(_doc(generation=-1)), "generation"),
    ("huge generation", _raw(_doc(generation=2**62 + 1)), "generation"),
    ("NaN threshold", _raw(_doc(route=_route(p_end_threshold=float("nan")))), "route.p_end_threshold"),
    ("inf threshold", _raw(_doc(route=_route(p_end_threshold=float("inf")))), "route.p_end_threshold"),
    ("threshold 1", _raw(_doc(route=_route(p_end_threshold=1.0))), "route.p_end_threshold"),
    ("threshold 0", _raw(_doc(route=_route(p_end_threshold=0.0))), "route.p_end_threshold"),
    ("NaN f1", _raw(_doc(route=_route(validation_f1=float("nan")))), "route.validation_f1"),
    ("-inf f1", _raw(_doc(route=_route(validation_f1=float("-inf")))), "route.validation_f1"),
    ("f1 over 1", _raw(_doc(route=_route(validation_f1=1.01))), "route.validation_f1"),
    ("overflowing f1", _raw(_doc()).replace(b'"validation_f1": 0.91', b'"validation_f1": 1e999'), "validation_f1"),
    ("NaN candidate f1", _raw(_doc(decision={**_doc()["decision"], "candidate_f1": float("nan")})), "candidate_f1"),
    ("inf decision time", _raw(_doc(decision={**_doc()["decision"], "at": float("inf")})), "decision.at"),
    ("negative since", _raw(_doc(route=_route(since=-1))), "route.since"),
    ("unknown decision", _raw(_doc(decision={**_doc()["decision"], "kind": "deleted"})), "decision.kind"),
    ("unknown rule", _raw(_doc(route=_route(completion_rule="sampled"))), "route.completion_rule"),
    ("threshold rule without threshold", _raw(_doc(route=_route(p_end_threshold=None))), "threshold"),
    ("threshold rule without adapter", _raw(_doc(route=_route(adapter=None))), "threshold"),
    (
        "threshold rule in the history without threshold",
        _raw(_doc(history=[{"adapter": "a", "completion_rule": "threshold"}])),
        "history.0",
    ),
    (
        "decreasing quantiles",
        _raw(_doc(route=_route(baseline={"p_end_quantiles": [0.0, 0.6, 0.5, 1.0]}))),
        "non-decreasing",
    ),
    ("one quantile", _raw(_doc(route=_route(baseline={"p_end_quantiles": [0.5]}))), "at least 2"),
    ("quantile over 1", _raw(_doc(route=_route(baseline={"p_end_quantiles": [0.0, 1.5]}))), "[0, 1]"),
    ("NaN quantile", _raw(_doc(route=_route(baseline={"p_end_quantiles": [0.0, float("nan")]}))), "route.baseline"),
    ("102 quantiles", _raw(_doc(route=_route(baseline={"p_end_quantiles": [0.5] * 102}))), "p_end_quantiles"),
    ("baseline extra field", _raw(_doc(route=_route(baseline={"ks": 0.1}))), "route.baseline.ks"),
    ("history of 9", _raw(_doc(history=[{"adapter": f"a{i}"} for i in range(MAX_HISTORY + 1)])), "history"),
    ("history not a list", _raw(_doc(history={"adapter": "a"})), "history"),
    ("reason of 2001 chars", _raw(_doc(decision={**_doc()["decision"], "reason": "r" * 2001})), "decision.reason"),
    ("adapter_dir of 4097 chars", _raw(_doc(route=_route(adapter_dir="d" * 4097))), "route.adapter_dir"),
    ("route deeply nested", _raw(_doc(route=_nested(400))), "invalid route row"),
    ("deep brackets", b"[" * 5000 + b"]" * 5000, "invalid route row"),
    ("deep brackets, unclosed", b'{"agent":' + b"[" * 30_000, "invalid route row"),
    ("over 64 KiB", _raw(_doc(pad="x" * MAX_ROUTE_BYTES)), f"> {MAX_ROUTE_BYTES}"),
    ("64 KiB of spaces", _raw(_doc()) + b" " * MAX_ROUTE_BYTES, f"> {MAX_ROUTE_BYTES}"),
    ("invalid UTF-8", b"\xff\xfe\x00{", "invalid route row"),
    ("invalid UTF-8 in a string", _raw(_doc()).replace(b'"shop-2"', b'"shop-\xc3\x28"', 1), "invalid route row"),
    ("lone surrogate escape", _raw(_doc()).replace(b'"shop"', b'"\\ud800"', 1), "invalid route row"),
    ("NUL byte", _raw(_doc()).replace(b'"shop"', b'"sh\\u0000op"', 1), "agent"),
    ("duplicate key sneaks an extra", b'{"agent":"a","agent":"b","version":1,"x":1}', "invalid route row"),
]


@pytest.mark.parametrize(("value", "expected"), [(v, e) for _, v, e in HOSTILE], ids=[n for n, _, _ in HOSTILE])
def test_hostile_rows_raise_invalid_row_with_a_clear_message(value: bytes, expected: str) -> None:
    with pytest.raises(InvalidRow) as info:
        decode_route(value)
    assert type(info.value) is InvalidRow
    message = str(info.value)
    assert message.startswith(("invalid route row", "route row of ")), message
    assert expected in message, message
    assert len(message) < 500 and "\n" not in message  # one line, never the hostile row echoed back
    assert info.value.__cause__ is None


def test_rows_at_the_bounds_are_valid() -> None:
    row = decode_route(
        _raw(
            _doc(
                agent="A" * 64,
                version=2**62,
                generation=2**62,
                history=[{"adapter": f"a{i}"} for i in range(MAX_HISTORY)],
                decision={**_doc()["decision"], "reason": "r" * 2000},
            )
        )
    )
    assert len(row.history) == MAX_HISTORY and row.version == 2**62
    assert decode_route(encode_route(row)) == row
    assert decode_route(_raw(_doc(agent="a.b:c_d-e"))).agent == "a.b:c_d-e"


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=512))
def test_arbitrary_bytes_decode_or_raise_invalid_row(value: bytes) -> None:
    try:
        row = decode_route(value)
    except InvalidRow:
        return
    assert decode_route(encode_route(row)) == row


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=8), kids, max_size=4),
    max_leaves=20,
)


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(sorted(_doc())), _json, st.sampled_from(sorted(_doc()["route"])), _json)
def test_a_row_with_any_field_replaced_decodes_or_raises_invalid_row(key: str, value: Any, rkey: str, rv: Any) -> None:
    for doc in (_doc(**{key: value}), _doc(route=_route(**{rkey: rv}))):
        try:
            row = decode_route(json.dumps(doc, allow_nan=True).encode())
        except InvalidRow:
            continue
        assert decode_route(encode_route(row)) == row


# -- fencing -------------------------------------------------------------------------------------


def test_the_first_row_of_an_agent_is_accepted() -> None:
    assert accept_route(None, _row(version=1))


def test_an_older_generation_is_refused_whatever_its_version() -> None:
    current = _row(generation=5, version=3)
    assert not accept_route(current, _row(generation=4, version=3))
    assert not accept_route(current, _row(generation=4, version=1_000_000))
    assert accept_route(current, _row(generation=6, version=1))  # a successor starts its own count


def test_within_a_generation_only_a_higher_version_is_accepted() -> None:
    current = _row(generation=5, version=3)
    assert not accept_route(current, _row(generation=5, version=2))
    assert not accept_route(current, _row(generation=5, version=3))
    assert not accept_route(current, _row(generation=5, version=3, adapter="other"))  # same version, other body
    assert accept_route(current, _row(generation=5, version=4))


# -- LiveRoutes ----------------------------------------------------------------------------------


CONFIGURED = ScoringConfig.model_validate(
    {
        "agents": {
            "shop": {
                "adapter": "shop-1",
                "validation_f1": 0.7,
                "completion_sample_rate": 0.5,
                "tree_sample_rate": 0.25,
                "max_tokens_per_minute": 900,
                "tree_model": "trees",
            },
            "desk": {"adapter": "desk-1"},
        },
        "default_agent": {"completion_sample_rate": 0.1, "max_tokens_per_minute": 50},
    }
)


class Told:
    def __init__(self) -> None:
        self.calls: list[tuple[str, AgentConfig | None]] = []

    def __call__(self, name: str, settings: AgentConfig | None) -> None:
        self.calls.append((name, settings))


def _live() -> tuple[LiveRoutes, CollectorRegistry, Told]:
    registry = CollectorRegistry()
    routes = LiveRoutes(CONFIGURED.agent, registry, AgentLabels(CONFIGURED.agents))
    told = Told()
    routes.listen(told)
    return routes, registry, told


def _metric(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    return registry.get_sample_value(name, labels)


def test_a_row_replaces_the_routing_and_keeps_budgets_and_sampling() -> None:
    routes, registry, told = _live()
    assert routes.agent("shop") is CONFIGURED.agents["shop"]
    row = _row(
        version=4,
        at=1234.5,
        adapter="shop-2",
        completion_rule="threshold",
        p_end_threshold=0.35,
        validation_f1=0.93,
        baseline=BASELINE,
        adapter_dir="/adapters/shop-2",
    )
    routes.apply(Change("shop", row))
    live = routes.agent("shop")
    assert (live.adapter, live.completion_rule, live.p_end_threshold) == ("shop-2", "threshold", 0.35)
    assert live.validation_f1 == 0.93
    assert live.baseline is not None and live.baseline.completion_rate == 0.6
    assert live.adapter_manifest is None
    assert (live.completion_sample_rate, live.tree_sample_rate) == (0.5, 0.25)
    assert (live.max_tokens_per_minute, live.tree_model) == (900, "trees")
    assert routes.row("shop") == row
    assert told.calls == [("shop", live)]
    assert routes.agent("desk") is CONFIGURED.agents["desk"]  # other agents keep theirs
    assert routes.agent(None) is CONFIGURED.default_agent
    assert _metric(registry, "sidecar_adapter_route_version", agent="shop") == 4
    assert _metric(registry, "sidecar_adapter_route_changes_total", agent="shop", decision="promoted") == 1
    stamp = _metric(registry, "sidecar_adapter_route_decision_timestamp_seconds", agent="shop", decision="promoted")
    assert stamp == 1234.5


def test_a_route_back_to_no_adapter_clears_the_routing_fields() -> None:
    routes, _, told = _live()
    routes.apply(Change("shop", _row(version=1, adapter=None)))
    live = routes.agent("shop")
    assert live.adapter is None and live.validation_f1 is None and live.completion_rule == "greedy"
    assert live.max_tokens_per_minute == 900
    assert told.calls == [("shop", live)]


def test_a_row_for_an_unconfigured_agent_goes_over_the_default_agent() -> None:
    routes, _, told = _live()
    routes.apply(Change("newcomer", _row("newcomer", adapter="newcomer-1", validation_f1=0.85)))
    live = routes.agent("newcomer")
    assert live.adapter == "newcomer-1" and live.validation_f1 == 0.85
    assert (live.completion_sample_rate, live.max_tokens_per_minute) == (0.1, 50)
    assert routes.agent("someone-else") is CONFIGURED.default_agent
    assert [name for name, _ in told.calls] == ["newcomer"]


def test_a_refusal_with_the_same_route_changes_nothing_but_is_counted() -> None:
    routes, registry, told = _live()
    routes.apply(Change("shop", _row(version=1, at=100.0, adapter="shop-2", validation_f1=0.9)))
    live = routes.agent("shop")
    refusal = _row(version=2, kind="refused", at=200.0, adapter="shop-2", validation_f1=0.9)
    routes.apply(Change("shop", refusal))
    assert len(told.calls) == 1  # listeners only hear of routes that take effect
    assert routes.agent("shop") is live
    assert routes.row("shop") == refusal
    assert _metric(registry, "sidecar_adapter_route_version", agent="shop") == 2
    assert _metric(registry, "sidecar_adapter_route_changes_total", agent="shop", decision="promoted") == 1
    assert _metric(registry, "sidecar_adapter_route_changes_total", agent="shop", decision="refused") == 1
    decided = "sidecar_adapter_route_decision_timestamp_seconds"
    assert _metric(registry, decided, agent="shop", decision="refused") == 200.0
    assert _metric(registry, decided, agent="shop", decision="promoted") == 100.0


def test_a_first_row_that_is_a_refusal_keeps_the_configured_route_and_logs_it_unchanged() -> None:
    routes, registry, told = _live()
    refusal = _row(version=1, kind="refused", at=50.0, adapter="shop-1", validation_f1=0.7)
    with capture_logs() as logs:
        routes.apply(Change("shop", refusal))
    assert [e["event"] for e in logs] == ["score.route_unchanged"]
    assert logs[0]["decision"] == "refused" and logs[0]["validation_f1"] == 0.7
    assert told.calls == [] and routes.agent("shop") is CONFIGURED.agents["shop"]
    assert _metric(registry, "sidecar_adapter_route_changes_total", agent="shop", decision="refused") == 1


def test_a_refusal_with_a_fresh_validation_updates_only_the_figure() -> None:
    """A refusal re-scores the serving adapter: the row keeps the route and records the new F1,
    which replaces the agent's validation (nothing else) and is told as a revalidation."""
    registry = CollectorRegistry()
    routes = LiveRoutes(CONFIGURED.agent, registry, AgentLabels(CONFIGURED.agents))
    told, revalidated = Told(), Told()
    routes.listen(told, revalidated)
    with capture_logs() as logs:
        routes.apply(Change("shop", _row(version=1, kind="refused", adapter="shop-1", validation_f1=0.97)))
    live = routes.agent("shop")
    assert live == CONFIGURED.agents["shop"].model_copy(update={"validation_f1": 0.97})
    assert told.calls == [] and revalidated.calls == [("shop", live)]
    assert [e["event"] for e in logs] == ["score.route_unchanged"]
    # The same figure again, or none at all, changes nothing.
    routes.apply(Change("shop", _row(version=2, kind="refused", adapter="shop-1", validation_f1=0.97)))
    routes.apply(Change("shop", _row(version=3, kind="released", adapter="shop-1")))
    assert routes.agent("shop") is live and len(revalidated.calls) == 1 and told.calls == []
    assert _metric(registry, "sidecar_adapter_route_changes_total", agent="shop", decision="released") == 1


def test_a_rollback_that_changes_the_route_is_told() -> None:
    routes, registry, told = _live()
    first = Route(adapter="shop-1", validation_f1=0.7)
    routes.apply(Change("shop", _row(version=1, adapter="shop-2", validation_f1=0.9, history=(first,))))
    routes.apply(Change("shop", _row(version=2, kind="rolled_back", adapter="shop-1", validation_f1=0.7)))
    assert [s.adapter for _, s in told.calls if s is not None] == ["shop-2", "shop-1"]
    assert routes.agent("shop").adapter == "shop-1"
    assert _metric(registry, "sidecar_adapter_route_changes_total", agent="shop", decision="rolled_back") == 1


def test_a_row_under_another_agents_key_is_ignored() -> None:
    routes, registry, told = _live()
    routes.apply(Change("shop", _row("desk", adapter="desk-9")))
    assert routes.agent("shop") is CONFIGURED.agents["shop"]
    assert routes.agent("desk") is CONFIGURED.agents["desk"]
    assert routes.row("shop") is None and routes.row("desk") is None
    assert told.calls == []
    assert _metric(registry, "sidecar_adapter_route_version", agent="shop") is None
    assert _metric(registry, "sidecar_adapter_route_version", agent="desk") is None


def test_a_mismatched_row_leaves_the_live_route_in_place() -> None:
    routes, _, told = _live()
    routes.apply(Change("shop", _row(version=1, adapter="shop-2")))
    routes.apply(Change("shop", _row("desk", version=2, adapter="desk-9")))
    assert routes.agent("shop").adapter == "shop-2"
    assert len(told.calls) == 1


def test_a_tombstone_restores_the_configured_settings() -> None:
    routes, registry, told = _live()
    routes.apply(Change("shop", _row(version=5, adapter="shop-2", validation_f1=0.9)))
    routes.apply(Change("shop", None))
    assert routes.agent("shop") is CONFIGURED.agents["shop"]
    assert routes.row("shop") is None
    assert told.calls[-1] == ("shop", None)
    assert _metric(registry, "sidecar_adapter_route_version", agent="shop") == 0
    # A tombstone for an agent without a row tells no one.
    routes.apply(Change("desk", None))
    assert len(told.calls) == 2
    # And a new row after it applies again.
    routes.apply(Change("shop", _row(version=6, adapter="shop-3")))
    assert routes.agent("shop").adapter == "shop-3"
    assert _metric(registry, "sidecar_adapter_route_version", agent="shop") == 6


def test_every_listener_is_told() -> None:
    routes, _, told = _live()
    other = Told()
    routes.listen(other)
    routes.apply(Change("shop", _row(adapter="shop-2")))
    assert told.calls == other.calls and len(other.calls) == 1


# -- through ScoringHooks ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("tok")
    build_tokenizer(d)
    return d


def _hooks(tok_dir: Path, **cfg: Any) -> tuple[ScoringHooks, LiveRoutes, ToyLM, CollectorRegistry]:
    base: dict[str, Any] = {
        "enabled": True,
        "tokenizer": {"model_dir": str(tok_dir)},
        "agents": {"booking": {"adapter": "completion-booking"}},
        "tree": {"alpha": 0.1, "max_depth_tokens": 6},
        **cfg,
    }
    lm = ToyLM(vocab=512, seed=1, peak=1.5)
    registry = CollectorRegistry()
    config = ScoringConfig.model_validate(base)
    hooks = ScoringHooks.from_config(config, registry, client=lm)
    routes = LiveRoutes(config.agent, registry, hooks._labels)
    hooks.follow(routes)
    return hooks, routes, lm, registry


async def _run(result: HookResult) -> Outcome:
    return await result if inspect.isawaitable(result) else result


def _ctx(kind: str, cid: str, messages: Any = RESTAURANT, agent: str | None = "booking") -> TurnContext:
    return TurnContext(kind, cid, 2, messages, agent, None)  # type: ignore[arg-type]


def _model(lm: ToyLM) -> object:
    """The model the last request went to."""
    return lm.requests[-1]["model"]


def _trusted(registry: CollectorRegistry, agent: str = "booking") -> float | None:
    return registry.get_sample_value("sidecar_completion_adapter_trusted", {"agent": agent})


async def test_a_live_row_routes_the_completion_to_the_new_adapter(tok_dir: Path) -> None:
    hooks, routes, lm, registry = _hooks(tok_dir)
    before = await _run(hooks.on_turn_closed(_ctx("turn_closed", "c1")))
    assert _model(lm) == "completion-booking"
    assert (before["adapter"], before["completion_source"]) == ("completion-booking", "unvalidated_adapter")
    assert _trusted(registry) == 0

    routes.apply(Change("booking", _row("booking", adapter="booking-v2", validation_f1=0.9)))
    assert hooks.settings("booking").adapter == "booking-v2"
    assert _trusted(registry) == 1  # flipped at once, before any traffic
    # The same conversation and prefix again: the new adapter scores it (no cached verdict reused).
    after = await _run(hooks.on_turn_closed(_ctx("turn_closed", "c1")))
    assert _model(lm) == "booking-v2"
    assert (after["adapter"], after["completion_source"]) == ("booking-v2", "adapter")
    assert after["variant"] == "adapter"
    [event] = events_of(after)
    assert isinstance(event, CompletionScored) and event.model == "booking-v2"
    assert hooks.trust.health().detail.endswith("trusted: booking")


async def test_a_row_below_the_floor_is_untrusted_and_a_tombstone_restores(tok_dir: Path) -> None:
    hooks, routes, lm, registry = _hooks(
        tok_dir, agents={"booking": {"adapter": "completion-booking", "validation_f1": 0.95}}
    )
    assert _trusted(registry) == 1
    routes.apply(Change("booking", _row("booking", adapter="booking-v2", validation_f1=0.5)))
    assert _trusted(registry) == 0
    out = await _run(hooks.on_turn_closed(_ctx("turn_closed", "u1")))
    assert (out["adapter"], out["completion_source"]) == ("booking-v2", "untrusted_adapter")

    routes.apply(Change("booking", None))
    assert _trusted(registry) == 1
    back = await _run(hooks.on_turn_closed(_ctx("turn_closed", "u2")))
    assert _model(lm) == "completion-booking"
    assert (back["adapter"], back["completion_source"]) == ("completion-booking", "adapter")


async def test_a_row_without_adapter_scores_with_the_instruct_prompt(tok_dir: Path) -> None:
    hooks, routes, lm, registry = _hooks(tok_dir)
    routes.apply(Change("booking", _row("booking", adapter=None)))
    out = await _run(hooks.on_turn_closed(_ctx("turn_closed", "i1")))
    assert out["variant"] == "instruct" and _model(lm) == "base"
    assert (out["adapter"], out["completion_source"]) == (None, "instruct")
    assert _trusted(registry) == 0


async def test_a_threshold_row_applies_its_rule(tok_dir: Path) -> None:
    hooks, routes, _, _ = _hooks(tok_dir)
    row = _row("booking", adapter="booking-v2", validation_f1=0.9, completion_rule="threshold", p_end_threshold=1e-12)
    routes.apply(Change("booking", row))
    out = await _run(hooks.on_turn_closed(_ctx("turn_closed", "t1")))
    assert out["completion_rule"] == "threshold" and out["adapter"] == "booking-v2"
    assert out["complete"] is True and "greedy_complete" in out  # any P(end) clears a 1e-12 threshold


async def test_a_row_for_an_agent_only_seen_in_traffic(tok_dir: Path) -> None:
    hooks, routes, lm, registry = _hooks(tok_dir)
    out = await _run(hooks.on_turn_closed(_ctx("turn_closed", "n1", agent="newcomer")))
    assert out["variant"] == "instruct"
    routes.apply(Change("newcomer", _row("newcomer", adapter="newcomer-1", validation_f1=0.99)))
    assert _trusted(registry, "newcomer") == 1
    out = await _run(hooks.on_turn_closed(_ctx("turn_closed", "n2", agent="newcomer")))
    assert _model(lm) == "newcomer-1" and out["completion_source"] == "adapter"
    # Other unconfigured agents keep the default route.
    other = await _run(hooks.on_turn_closed(_ctx("turn_closed", "n3", agent="stranger")))
    assert other["completion_source"] == "instruct"


async def test_a_route_change_resets_the_agents_drift_window(tok_dir: Path) -> None:
    hooks, routes, _, registry = _hooks(
        tok_dir,
        agents={"booking": {"adapter": "completion-booking", "validation_f1": 0.9, "baseline": BASELINE}},
        drift={"window_verdicts": 8, "min_verdicts": 2},
    )

    def window() -> float | None:
        return registry.get_sample_value("sidecar_adapter_drift_window_verdicts", {"agent": "booking"})

    def drift(signal: str) -> float | None:
        return registry.get_sample_value("sidecar_adapter_drift", {"agent": "booking", "signal": signal})

    for i, messages in enumerate([RESTAURANT, TRAVEL, RESTAURANT]):
        await _run(hooks.on_conversation_ended(_ctx("conversation_ended", f"d{i}", messages)))
    assert window() == 3
    assert drift("p_end") is not None and drift("completion_rate") is not None

    # A first row that keeps the configured routing changes nothing: the window goes on.
    routes.apply(
        Change(
            "booking", _row("booking", version=1, adapter="completion-booking", validation_f1=0.9, baseline=BASELINE)
        )
    )
    assert window() == 3
    # A refusal that keeps the route keeps the window.
    routes.apply(
        Change(
            "booking",
            _row(
                "booking", version=2, kind="refused", adapter="completion-booking", validation_f1=0.9, baseline=BASELINE
            ),
        )
    )
    assert window() == 3 and drift("p_end") is not None

    # A new route starts a new window against its own baseline (completion rate only).
    routes.apply(
        Change(
            "booking",
            _row("booking", version=3, adapter="booking-v2", validation_f1=0.9, baseline={"completion_rate": 0.5}),
        )
    )
    assert window() == 0
    assert drift("p_end") is None and drift("completion_rate") is None and drift("untrusted_share") is None
    for i in range(2):
        await _run(hooks.on_conversation_ended(_ctx("conversation_ended", f"f{i}")))
    assert window() == 2
    assert drift("p_end") is None and drift("completion_rate") is not None


async def test_a_refusal_that_revalidates_the_serving_adapter_makes_it_trusted_and_keeps_drift(
    tok_dir: Path,
) -> None:
    hooks, routes, _, registry = _hooks(
        tok_dir,
        agents={"booking": {"adapter": "completion-booking", "baseline": BASELINE}},
        drift={"window_verdicts": 8, "min_verdicts": 2},
    )
    assert _trusted(registry) == 0  # no validation recorded
    for i in range(3):
        await _run(hooks.on_conversation_ended(_ctx("conversation_ended", f"r{i}")))
    window = "sidecar_adapter_drift_window_verdicts"
    assert registry.get_sample_value(window, {"agent": "booking"}) == 3
    refusal = _row("booking", kind="refused", adapter="completion-booking", validation_f1=0.97, baseline=BASELINE)
    routes.apply(Change("booking", refusal))
    assert _trusted(registry) == 1  # trust follows the fresh figure at once
    assert registry.get_sample_value(window, {"agent": "booking"}) == 3  # the same route: drift goes on
    out = await _run(hooks.on_turn_closed(_ctx("turn_closed", "r9")))
    assert (out["adapter"], out["completion_source"]) == ("completion-booking", "adapter")


async def test_a_route_without_baseline_stops_tracking_and_a_later_one_resumes(tok_dir: Path) -> None:
    hooks, routes, _, registry = _hooks(
        tok_dir,
        agents={"booking": {"adapter": "completion-booking", "validation_f1": 0.9}},
        drift={"window_verdicts": 8, "min_verdicts": 1},
    )

    def window() -> float | None:
        return registry.get_sample_value("sidecar_adapter_drift_window_verdicts", {"agent": "booking"})

    await _run(hooks.on_conversation_ended(_ctx("conversation_ended", "g0")))
    assert window() is None  # no baseline: not tracked
    routes.apply(Change("booking", _row("booking", adapter="booking-v2", validation_f1=0.9, baseline=BASELINE)))
    await _run(hooks.on_conversation_ended(_ctx("conversation_ended", "g1")))
    assert window() == 1


@pytest.mark.parametrize(
    "over",
    [{"version": "10"}, {"generation": True}, {"version": 1.0}, {"schema_version": "1"}],
    ids=["version-string", "generation-bool", "version-float", "schema-string"],
)
def test_loosely_typed_numbers_are_refused_not_coerced(over: dict[str, Any]) -> None:
    with pytest.raises(InvalidRow):
        decode_route(_raw(_doc(**over)))
