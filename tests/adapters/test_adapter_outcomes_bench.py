"""The adapter-outcomes benchmark's own pieces (``tests/bench/bench_adapter_outcomes.py``), without
a model or the corpora: its outcome table, its score cache and its refusals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sidecar.tools.eval.dataset import EvalConversation
from sidecar.transcript.model import Message
from tests.bench.bench_adapter_outcomes import main, markdown, medians, outcome_rows, read_cache, write_cache


def conv(cid: str, turns: int, labels: dict[str, object]) -> EvalConversation:
    messages = []
    for t in range(turns):
        messages += [Message(role="user", content=f"u{t}"), Message(role="assistant", content=f"a{t}")]
    return EvalConversation(cid, tuple(messages), "tau-bench", "airline", labels)


def sets_and_scores() -> tuple[dict[str, list[EvalConversation]], dict[str, dict[str, float]]]:
    # Ten failures (reward 0), ten successes; failures end with a low P(end) and are longer.
    convs = [conv(f"f{i}", 3 + i % 3, {"reward": 0.0}) for i in range(10)]
    convs += [conv(f"s{i}", 2 + i % 3, {"reward": 1.0}) for i in range(10)]
    convs.append(conv("unlabelled", 2, {}))
    separating = {c.conversation_id: (0.01 if c.conversation_id.startswith("f") else 0.6) for c in convs}
    inverted = {cid: 1.0 - p for cid, p in separating.items()}
    return {"tau-bench (shared)": convs}, {"good, adapter": separating, "bad, adapter": inverted}


def test_the_table_ranks_low_p_end_as_failure_and_keeps_the_turn_baseline() -> None:
    sets, scores = sets_and_scores()
    rows = {r["statistic"]: r for r in outcome_rows(sets, scores, n_boot=200)}
    assert set(rows) == {"good, adapter: -P(end)", "bad, adapter: -P(end)", "baseline: user turns"}
    assert rows["good, adapter: -P(end)"]["auc"] == pytest.approx(1.0)
    assert rows["bad, adapter: -P(end)"]["auc"] == pytest.approx(0.0)
    baseline = rows["baseline: user turns"]
    assert 0.5 < baseline["auc"] < 1.0  # failures are longer here, not perfectly
    assert baseline["lo"] <= baseline["auc"] <= baseline["hi"]
    assert all(r["pos"] == 10 and r["neg"] == 10 for r in rows.values())  # the unlabelled one is left out
    assert all(r["outcome"] == "tau-bench task failure (reward < 1)" for r in rows.values())


def test_the_report_renders_every_row_and_median() -> None:
    sets, scores = sets_and_scores()
    report = {
        "command": "python -m tests.bench.bench_adapter_outcomes",
        "train_on": ["sgd"],
        "per_dataset": 3,
        "training": {"good": {"trained_on": {"sgd": 3}, "seconds": 1.0}},
        "auc": outcome_rows(sets, scores, n_boot=50),
        "medians": medians(sets, scores),
        "seconds": 2.0,
    }
    text = markdown(report)
    assert "| tau-bench task failure (reward < 1) (10/10) | good, adapter: -P(end) | 1.00" in text
    assert "| tau-bench task failure (reward < 1) | good, adapter | 0.01 | 0.6 |" in text
    assert "sgd 3" in text


def test_the_cache_keeps_only_probabilities_and_survives_a_cut_short_file(tmp_path: Path) -> None:
    path = tmp_path / "scores.json"
    write_cache(path, {"toy, adapter": {"a": 0.5}})
    assert read_cache(path) == {"toy, adapter": {"a": 0.5}}
    path.write_text(
        json.dumps(
            {
                "toy, adapter": {"a": 0.5, "b": 1.5, "c": "0.2", "d": True, "e": None, "f": -0.1, "g": 1},
                "foreign": [1, 2],
            }
        )
    )
    assert read_cache(path) == {"toy, adapter": {"a": 0.5, "g": 1.0}}
    path.write_text('{"toy, adapter": {"a": 0.')  # an interrupted write
    assert read_cache(path) == {}
    path.write_bytes(b"\xff\xfe" + b"x" * 100_000)
    assert read_cache(path) == {}
    path.write_text("NaN")
    assert read_cache(path) == {}
    assert read_cache(tmp_path / "missing.json") == {}


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--train-on", "sgd,star"], "must not hold the data sets the outcomes come from: star"),
        (["--train-on", "taubench_airline"], "taubench_airline"),
        (["--base", "nodir"], "expected NAME=DIR"),
        (["--base", "=x"], "expected NAME=DIR"),
        (["--per-dataset", "0"], "at least 1"),
        (["--star", "-3"], "at least 1"),
        (["--bootstrap", "0"], "at least 1"),
        (["--tau", "many"], "invalid int value"),
    ],
)
def test_bad_arguments_are_refused_before_any_work(
    argv: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    full = ["--data", str(tmp_path), *(["--base", f"toy={tmp_path}"] if "--base" not in argv else []), *argv]
    with pytest.raises(SystemExit) as exc:
        main([*full, "--work", str(tmp_path / "w"), "--out", str(tmp_path / "o")])
    assert exc.value.code == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "w").exists()


def test_a_base_without_a_model_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--data", str(tmp_path), "--base", f"toy={tmp_path / 'none'}", "--out", str(tmp_path / "o")])
    assert exc.value.code == 2
    assert "no model directory" in capsys.readouterr().err
