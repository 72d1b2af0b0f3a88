"""The demo screen's pieces: figures read by name from a registry, the alert feed, the log file."""

from __future__ import annotations

import io
import json
import math
import os
import re
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from sidecar.tools.demo.alert_feed import AlertFeed
from sidecar.tools.demo.display import DemoDisplay
from sidecar.tools.demo.figures import quantile, read_figures
from sidecar.tools.demo.logfile import PROGRESS_BAR_ENVIRONMENT, LogFile, echo_text, quiet_progress_bars


def _registry() -> CollectorRegistry:
    """A registry shaped like the sidecar's, with metrics the screen must ignore sorted first."""
    reg = CollectorRegistry()
    Gauge("sidecar_adapter_drift", "noise", ["agent"], registry=reg).labels("a").set(9)
    Counter("sidecar_events_consumed_total", "x", registry=reg).inc(811)
    Gauge("sidecar_consumer_lag_records", "x", ["partition"], registry=reg).labels("0").set(3)
    Gauge("sidecar_conversations_active", "x", registry=reg).set(20)
    finalised = Counter("sidecar_conversations_finalised_total", "x", ["reason"], registry=reg)
    finalised.labels("end_event").inc(38)
    finalised.labels("idle_ttl").inc(2)
    scored = Counter("sidecar_completion_scored_total", "x", ["agent", "outcome"], registry=reg)
    scored.labels("star", "complete").inc(41)
    scored.labels("multiwoz", "incomplete").inc(260)
    ended = Counter("sidecar_conversations_ended_total", "x", ["agent", "outcome", "goal"], registry=reg)
    ended.labels("star", "complete", "g1").inc(3)
    ended.labels("star", "incomplete", "g1").inc(1)
    ended.labels("star", "incomplete", "g2").inc(2)
    ended.labels("star", "unscored", "g2").inc(5)
    leaves = Histogram("sidecar_tree_leaves", "x", ["agent"], registry=reg)
    for _ in range(7):
        leaves.labels("star").observe(2)
    Counter("sidecar_uncertain_turns_total", "x", ["agent"], registry=reg).labels("star").inc(4)
    alerts = Counter("sidecar_alerts_total", "x", ["kind", "sink", "outcome"], registry=reg)
    alerts.labels("uncertain_turn", "kafka", "delivered").inc(4)
    alerts.labels("conversation_incomplete", "kafka", "delivered").inc(3)
    alerts.labels("conversation_incomplete", "webhook", "rejected").inc(1)
    info = Gauge("sidecar_goal_info", "x", ["goal", "name"], registry=reg)
    info.labels("g1", "book a table").set(1)
    info.labels("g2", "unnamed").set(1)
    size = Gauge("sidecar_clustering_goal_conversations", "x", ["goal"], registry=reg)
    size.labels("g1").set(12)
    size.labels("g2").set(4)
    size.labels("other").set(30)
    Gauge("sidecar_clustering_clusters", "x", registry=reg).set(9)
    latency = Histogram("sidecar_scoring_duration_seconds", "x", ["agent", "kind"], buckets=(1, 2, 4), registry=reg)
    for value in (0.5, 1.5, 1.5, 3):
        latency.labels("star", "tree").observe(value)
    return reg


def test_figures_are_read_by_name_and_summed_over_labels() -> None:
    f = read_figures(_registry())
    assert (f.events_in, f.lag_records, f.conversations_open, f.conversations_ended) == (811, 3, 20, 40)
    assert (f.turns_complete, f.turns_incomplete) == (41, 260)
    assert (f.final_complete, f.final_incomplete) == (3, 3)  # unscored is neither
    assert (f.trees, f.uncertain_turns, f.clusters) == (7, 4, 9)
    assert f.alerts_delivered == {("uncertain_turn", "kafka"): 4, ("conversation_incomplete", "kafka"): 3}
    assert f.alerts_rejected == {("conversation_incomplete", "webhook"): 1}
    assert [(g.goal, g.name, g.conversations, g.completion_rate) for g in f.goals] == [
        ("g1", "book a table", 12, 0.75),
        ("g2", "unnamed", 4, 0.0),
    ]
    assert [g.goal for g in f.named_goals] == ["g1"]
    [tree] = f.latency
    assert (tree.kind, tree.count) == ("tree", 4)
    assert 1 <= tree.p50_seconds <= 2 < tree.p95_seconds <= 4


def test_an_empty_registry_reads_as_zeros() -> None:
    f = read_figures(CollectorRegistry())
    assert f.events_in == f.trees == f.alerts == 0
    assert f.goals == ()
    assert f.latency == ()


def test_quantile_interpolates_like_prometheus() -> None:
    buckets = [(1.0, 1.0), (2.0, 3.0), (4.0, 4.0), (math.inf, 4.0)]
    assert quantile(0.5, buckets) == pytest.approx(1.5)
    assert quantile(1.0, buckets) == pytest.approx(4.0)
    assert quantile(0.99, [(1.0, 0.0), (math.inf, 2.0)]) == 1.0  # the open top bucket: its lower edge
    assert math.isnan(quantile(0.5, [(math.inf, 0.0)]))


def test_the_screen_shows_the_story_and_the_pages() -> None:
    out = io.StringIO()
    feed = AlertFeed("http://127.0.0.1:9108")
    feed.add(json.dumps({"kind": "uncertain_turn", "conversation_id": "star/1", "summary": "unsure",
                         "tree_url": "http://127.0.0.1:9108/trees/" + "a" * 32}).encode())  # fmt: skip
    display = DemoDisplay(_registry(), total=100, pages_url="http://127.0.0.1:9108", alerts=feed, stream=out, width=160)
    with display:
        display.progress(10)
        display.final()
    text = out.getvalue()
    for shown in [
        "events in        811  (lag 3)",
        "20 open, 40 ended",
        "41 complete, 260 incomplete",
        "3 complete, 3 incomplete (50% complete)",
        "7  (4 uncertain turns)",
        "uncertain_turn → kafka 4",
        "(1 rejected by sinks)",
        "1 named of 9 clusters",
        "book a table",
        "75%",
        "star/1",
        "http://127.0.0.1:9108/trees/" + "a" * 32,
        "http://127.0.0.1:9108/escalations",
        "http://127.0.0.1:9108/clusters",
    ]:
        assert shown in text, shown
    assert "sidecar_adapter_drift" not in text  # chosen by name, not the first metrics alphabetically


def test_status_line_gives_the_time_left_at_the_target_rate_until_the_rate_settles() -> None:
    display = DemoDisplay(CollectorRegistry(), total=5960, pages_url="http://h:1", rate=4.0, stream=io.StringIO())
    display.progress(673)
    assert re.fullmatch(r"produced 673/5960 events, ~(\d+) min left", display.status_line())
    assert display.status_line().endswith("~22 min left")  # (5960 - 673) / 4 = 1322 s
    display.progress(5960)
    assert display.status_line().endswith("all sent")


@pytest.mark.parametrize(
    "value",
    [b"", b"not json", b"[1, 2]", b'{"kind": 3}', b'{"a": ' * 100_000, "\u00ff".encode("latin-1")],
)
def test_alert_feed_skips_what_is_not_an_alert(value: bytes) -> None:
    feed = AlertFeed("http://h:1")
    assert feed.add(value) is None
    assert feed.recent() == [] and feed.read == 0


def test_alert_feed_keeps_the_last_alerts_and_makes_hostile_text_inert() -> None:
    feed = AlertFeed("http://h:1/", keep=2)
    for i in range(3):
        feed.add(json.dumps({"kind": "conversation_incomplete", "conversation_id": f"c{i}"}).encode())
    hostile = {
        "kind": "uncertain_turn\x1b[2J",
        "conversation_id": "x" * 10_000,
        "summary": "[bold red]boom[/] \x1b]8;;http://evil\x07click\u202e",
        "tree_url": "javascript:alert(1)",
    }
    alert = feed.add(json.dumps(hostile).encode())
    assert alert is not None
    assert "\x1b" not in alert.kind + alert.summary and "\u202e" not in alert.summary
    assert len(alert.conversation_id) == 80
    assert alert.link == "http://h:1/escalations"  # not a web link: the escalations page instead
    assert [a.conversation_id for a in feed.recent()] == ["x" * 80, "c2"]
    assert feed.read == 4
    out = io.StringIO()
    with DemoDisplay(
        CollectorRegistry(), total=None, pages_url="http://h:1", alerts=feed, stream=out, width=200
    ) as display:
        display.final()
    assert "[bold red]boom[/]" in out.getvalue()  # shown as text, not read as markup


def test_log_file_keeps_every_line_and_echoes_warnings(tmp_path: Path) -> None:
    echoed: list[str] = []
    log = LogFile(tmp_path / "demo.log", echo=echoed.append)
    info = json.dumps({"timestamp": "t", "level": "info", "event": "sidecar.started"})
    warning = json.dumps({"timestamp": "t", "level": "warning", "event": "vllm.slow", "seconds": 3})
    log.write(info + "\n" + warning[:10])
    log.write(warning[10:] + "\nplain text\n")
    log.close()
    assert (tmp_path / "demo.log").read_text(encoding="utf-8").splitlines() == [info, warning, "plain text"]
    assert echoed == ["warning: vllm.slow seconds=3"]
    assert echo_text("{}") is None and echo_text("[") is None


def test_progress_bars_are_silenced_without_overriding_a_choice(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in PROGRESS_BAR_ENVIRONMENT:  # restored after the test, whatever quiet_progress_bars sets
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_HUB_DISABLE_PROGRESS_BARS", "0")
    quiet_progress_bars()
    assert os.environ["TQDM_DISABLE"] == "1"
    assert os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] == "0"


@pytest.mark.parametrize("width", [160, 100, 80])
def test_alert_links_are_shown_whole_whatever_the_width(width: int) -> None:
    feed = AlertFeed("http://127.0.0.1:9108")
    tree = "http://127.0.0.1:9108/trees/" + "0123456789abcdef" * 2
    feed.add(
        json.dumps({"kind": "conversation_incomplete", "conversation_id": "star/1", "summary": "s" * 300}).encode()
    )
    feed.add(json.dumps({"kind": "uncertain_turn", "conversation_id": "multiwoz/" + "P" * 60, "summary": "x" * 300,
                         "tree_url": tree}).encode())  # fmt: skip
    out = io.StringIO()
    with DemoDisplay(CollectorRegistry(), total=None, pages_url="http://127.0.0.1:9108", alerts=feed, stream=out,
                     width=width) as display:  # fmt: skip
        display.final()
    lines = out.getvalue().splitlines()
    assert any(tree in line for line in lines)
    assert all(len(line.rstrip()) <= width for line in lines)
