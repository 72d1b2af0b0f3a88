"""The adapter loop's decisions stick: what ``promote``, ``rollback``, ``release`` and ``maintain``
write and decide, with the routing topic and the scoring of held-back conversations faked (the
real thing, on Tansu with vLLM: tests/replicas/test_adapter_loop.py).

- a refusal records the serving adapter's fresh F1, and the replicas' trust follows it;
- a rollback holds: ``maintain`` names the agent held, not due, until ``release`` or new drift;
- ``promote`` refuses an onboarding (or candidate) made for another agent;
- ``--margin`` may be negative.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from adapters.cli import main
from adapters.promotion import maintain as maintain_module
from adapters.promotion import promote as promote_module
from adapters.promotion import topic as topic_module
from sidecar.config import SidecarConfig, load_config
from sidecar.fleet.table import Change
from sidecar.scoring.routes import DecisionRecord, LiveRoutes, Route, RouteRow
from sidecar.scoring.trust import assess

AGENT = "shop"
FLOOR = 0.6


class Topic:
    """The routing topic: the rows ``read_rows`` returns and every row written, in order."""

    def __init__(self) -> None:
        self.rows: dict[str, RouteRow] = {}
        self.written: list[RouteRow] = []

    async def read(self, config: SidecarConfig, **_: Any) -> dict[str, RouteRow]:
        return dict(self.rows)

    async def write(self, config: SidecarConfig, row: RouteRow) -> None:
        self.written.append(row)
        self.rows[row.agent] = row


@pytest.fixture
def topic(monkeypatch: pytest.MonkeyPatch) -> Topic:
    fake = Topic()
    monkeypatch.setattr(promote_module, "read_rows", fake.read)
    monkeypatch.setattr(promote_module, "write_row", fake.write)
    monkeypatch.setattr(topic_module, "read_rows", fake.read)
    return fake


@pytest.fixture
def f1s(monkeypatch: pytest.MonkeyPatch) -> dict[str, float]:
    """F1 on the held-back conversations by adapter directory name (set by each test)."""
    scores: dict[str, float] = {}

    def score(base: Path, adapter: Path, route: Route, **_: Any) -> float:
        return scores[adapter.name]

    import adapters.onboarding.onboard as onboard

    monkeypatch.setattr(promote_module, "_complete_score", score)
    monkeypatch.setattr(onboard, "protocol_examples", lambda data, seed: [("c1", [], True), ("c2", [], False)])
    return scores


@pytest.fixture
def serving(tmp_path: Path) -> Path:
    """The adapter that serves the agent: configured with its manifest, no validation recorded."""
    where = tmp_path / "serving"
    where.mkdir()
    (where / "manifest.json").write_text(json.dumps({"kind": "exported-lora-adapter", "agent": AGENT}))
    return where


@pytest.fixture
def config_path(tmp_path: Path, serving: Path) -> Path:
    path = tmp_path / "sidecar.yaml"
    path.write_text(
        "kafka:\n  bootstrap_servers: 127.0.0.1:1\n  topic: events\n"
        f"scoring:\n  completion:\n    min_validation_f1: {FLOOR}\n"
        f"  agents:\n    {AGENT}:\n      adapter: shop-1\n      adapter_manifest: {serving / 'manifest.json'}\n",
        encoding="utf-8",
    )
    return path


def onboarding(root: Path, *, agent: str = AGENT, candidate_agent: str | None = None) -> Path:
    """An `adapters onboard` --out directory whose candidate is ``ROOT/ob/candidate``."""
    out = root / "ob"
    (out / "data").mkdir(parents=True)
    (out / "data" / "holdback.jsonl").write_text("", encoding="utf-8")
    (root / "base").mkdir(exist_ok=True)
    spec = {"agent": agent, "base": str(root / "base"), "recipe": {"max_context_tokens": 256}, "seed": 0}
    (out / "manifest.json").write_text(json.dumps({"kind": "onboarding", "spec": spec}), encoding="utf-8")
    cand = out / "candidate"
    cand.mkdir()
    manifest = {
        "kind": "exported-lora-adapter",
        "agent": candidate_agent or agent,
        "served_name": f"{candidate_agent or agent}-2",
        "validation": {"rule": "greedy"},
    }
    (cand / "manifest.json").write_text(json.dumps(manifest), encoding="utf-8")
    return out


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    assert main(argv) == 0
    doc: dict[str, Any] = json.loads(capsys.readouterr().out)
    return doc


def _refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    out, err = capsys.readouterr()
    assert out == "" and "Traceback" not in err
    return err


def _promote(ob: Path, config: Path, *extra: str) -> list[str]:
    return [
        "promote",
        "--agent",
        AGENT,
        "--onboarding",
        str(ob),
        "--candidate",
        str(ob / "candidate"),
        "--sidecar-config",
        str(config),
        *extra,
    ]


def _trusted_on_a_replica(config: SidecarConfig, row: RouteRow) -> bool:
    """What a replica that applies ``row`` reports for the agent's adapter."""
    routes = LiveRoutes(config.scoring.agent, CollectorRegistry(), lambda name: name or "default")
    before = assess(routes.agent(AGENT), FLOOR).trusted
    routes.apply(Change(AGENT, row))
    assert before is False  # the configured adapter records no validation
    return assess(routes.agent(AGENT), FLOOR).trusted


# -- a refusal records the serving adapter's figure -------------------------------------------------


def test_a_refusal_records_the_serving_adapters_fresh_f1_and_trust_follows_it(
    tmp_path: Path, config_path: Path, topic: Topic, f1s: dict[str, float], capsys: pytest.CaptureFixture[str]
) -> None:
    f1s.update(candidate=0.9, serving=0.974)
    doc = _run(_promote(onboarding(tmp_path), config_path), capsys)
    assert doc["decision"] == "refused" and doc["serving_f1"] == 0.974 and doc["route_validation_f1"] == 0.974
    [row] = topic.written
    assert row.decision.kind == "refused" and row.route.adapter == "shop-1"
    assert row.route.validation_f1 == 0.974  # the figure promote measured, not the missing recorded one
    assert row.history == ()  # a refusal adds nothing to roll back to
    assert _trusted_on_a_replica(load_config(config_path), row)


def test_a_refusal_below_the_floor_records_it_too_and_the_agent_stays_untrusted(
    tmp_path: Path, config_path: Path, topic: Topic, f1s: dict[str, float], capsys: pytest.CaptureFixture[str]
) -> None:
    f1s.update(candidate=0.5, serving=0.4)
    doc = _run(_promote(onboarding(tmp_path), config_path), capsys)
    assert doc["decision"] == "refused" and "floor" in doc["reason"]
    assert topic.written[0].route.validation_f1 == 0.4
    assert not _trusted_on_a_replica(load_config(config_path), topic.written[0])


def test_a_recorded_figure_is_not_passed_off_as_a_fresh_one(
    tmp_path: Path,
    config_path: Path,
    serving: Path,
    topic: Topic,
    f1s: dict[str, float],
    capsys: pytest.CaptureFixture[str],
) -> None:
    # The serving adapter's directory is gone: its recorded F1 (none here) stands, nothing is invented.
    (serving / "manifest.json").unlink()
    serving.rmdir()
    f1s.update(candidate=0.9)
    doc = _run(_promote(onboarding(tmp_path), config_path), capsys)
    assert doc["decision"] == "promoted" and doc["serving_f1"] is None
    assert topic.written[0].route.validation_f1 == 0.9 and topic.written[0].route.adapter == "shop-2"


# -- another agent's onboarding ------------------------------------------------------------------


def test_promote_refuses_an_onboarding_made_for_another_agent(
    tmp_path: Path, config_path: Path, topic: Topic, f1s: dict[str, float], capsys: pytest.CaptureFixture[str]
) -> None:
    f1s.update(candidate=0.99, serving=0.7)
    err = _refused(_promote(onboarding(tmp_path, agent="desk"), config_path), capsys)
    assert "adapters promote: error" in err and "made for agent 'desk'" in err and "--agent 'shop'" in err
    assert topic.written == []


def test_promote_refuses_a_candidate_trained_for_another_agent(
    tmp_path: Path, config_path: Path, topic: Topic, f1s: dict[str, float], capsys: pytest.CaptureFixture[str]
) -> None:
    f1s.update(candidate=0.99, serving=0.7)
    err = _refused(_promote(onboarding(tmp_path, candidate_agent="desk"), config_path), capsys)
    assert "trained for agent 'desk'" in err and topic.written == []


def test_promote_refuses_an_onboarding_that_records_no_agent(
    tmp_path: Path, config_path: Path, topic: Topic, f1s: dict[str, float], capsys: pytest.CaptureFixture[str]
) -> None:
    ob = onboarding(tmp_path)
    manifest = json.loads((ob / "manifest.json").read_text())
    del manifest["spec"]["agent"]
    (ob / "manifest.json").write_text(json.dumps(manifest))
    err = _refused(_promote(ob, config_path), capsys)
    assert "records no agent" in err and topic.written == []


# -- the margin ----------------------------------------------------------------------------------


def test_a_negative_margin_promotes_a_candidate_up_to_that_much_worse(
    tmp_path: Path, config_path: Path, topic: Topic, f1s: dict[str, float], capsys: pytest.CaptureFixture[str]
) -> None:
    f1s.update(candidate=0.95, serving=0.974)
    ob = onboarding(tmp_path)
    assert _run(_promote(ob, config_path), capsys)["decision"] == "refused"
    doc = _run(_promote(ob, config_path, "--margin", "-0.05"), capsys)
    assert doc["decision"] == "promoted" and doc["version"] == 2
    assert topic.rows[AGENT].route.adapter == "shop-2"
    # Never below the floor, whatever the margin.
    f1s.update(candidate=0.55)
    doc = _run(_promote(onboarding(tmp_path / "again"), config_path, "--margin", "-0.99"), capsys)
    assert doc["decision"] == "refused" and "floor" in doc["reason"]


# -- a rollback holds ----------------------------------------------------------------------------


def _exposition(trusted: dict[str, float], drift: dict[str, float] | None = None) -> str:
    lines = ["# TYPE sidecar_completion_adapter_trusted gauge"]
    lines += [f'sidecar_completion_adapter_trusted{{agent="{a}"}} {v}' for a, v in trusted.items()]
    lines += ["# TYPE sidecar_adapter_drift gauge"]
    lines += [f'sidecar_adapter_drift{{agent="{a}",signal="p_end"}} {v}' for a, v in (drift or {}).items()]
    return "\n".join(lines) + "\n"


def _maintain(tmp_path: Path, config: Path, monkeypatch: pytest.MonkeyPatch, metrics: str) -> list[str]:
    monkeypatch.setattr(maintain_module, "scrape", lambda url: metrics)
    return [
        "maintain",
        "--sidecar-config",
        str(config),
        "--metrics-url",
        "http://replica/metrics",
        "--work",
        str(tmp_path / "work"),
        "--dry-run",
    ]


def _rolled_back(topic: Topic) -> None:
    first = Route(adapter="shop-1")
    promoted = Route(adapter="shop-2", validation_f1=0.9)
    topic.rows[AGENT] = RouteRow(
        agent=AGENT,
        version=1,
        route=promoted,
        decision=DecisionRecord(kind="promoted", at=100.0),
        history=(first,),
    )


def test_a_rollback_holds_until_an_operator_releases_it(
    tmp_path: Path, config_path: Path, topic: Topic, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _rolled_back(topic)
    cfg = str(config_path)
    doc = _run(["rollback", "--agent", AGENT, "--sidecar-config", cfg], capsys)
    assert doc["to"] == "shop-1" and topic.rows[AGENT].decision.kind == "rolled_back"
    # The restored adapter records no validation: untrusted on the replicas, yet not due.
    untrusted = _exposition({AGENT: 0.0, "desk": 0.0})
    doc = _run(_maintain(tmp_path, config_path, monkeypatch, untrusted), capsys)
    assert doc["due"] == {"desk": ["untrusted"]}
    assert "rolled back to shop-1" in doc["held"][AGENT] and f"adapters release --agent {AGENT}" in doc["held"][AGENT]
    # Released: the agent is due again.
    doc = _run(["release", "--agent", AGENT, "--sidecar-config", cfg], capsys)
    assert doc["decision"] == "released" and doc["version"] == 3
    row = topic.rows[AGENT]
    assert row.decision.kind == "released" and row.route.adapter == "shop-1" and row.history == ()
    doc = _run(_maintain(tmp_path, config_path, monkeypatch, untrusted), capsys)
    assert doc["due"] == {"desk": ["untrusted"], AGENT: ["untrusted"]} and doc["held"] == {}


def test_drift_measured_since_a_rollback_makes_the_agent_due_again(
    tmp_path: Path, config_path: Path, topic: Topic, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _rolled_back(topic)
    _run(["rollback", "--agent", AGENT, "--sidecar-config", str(config_path)], capsys)
    drifted = _exposition({AGENT: 0.0}, {AGENT: 0.8})
    doc = _run(_maintain(tmp_path, config_path, monkeypatch, drifted), capsys)
    assert doc["due"] == {AGENT: ["drift:p_end"]} and doc["held"] == {}  # untrusted alone would not do


def test_release_without_a_rollback_is_refused(
    tmp_path: Path, config_path: Path, topic: Topic, capsys: pytest.CaptureFixture[str]
) -> None:
    err = _refused(["release", "--agent", AGENT, "--sidecar-config", str(config_path)], capsys)
    assert "no rollback holds shop: no row on the routing topic" in err
    _rolled_back(topic)
    err = _refused(["release", "--agent", AGENT, "--sidecar-config", str(config_path)], capsys)
    assert "its last decision is promoted" in err and len(topic.written) == 0
