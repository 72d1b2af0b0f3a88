"""``python -m adapters.evaluation.lodo`` on the suite's tiny model: points, intervals, report, resume, bad input."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from adapters.evaluation import lodo
from adapters.serving.manifest import recorded_command
from tests.adapters.conftest import synthetic_conversation
from tests.support.tiny_model import TinyModel

pytestmark = pytest.mark.filterwarnings("ignore:.*is_gradient_checkpointing.*:FutureWarning")

DATASETS = ("alpha", "beta")


def _prepared(root: Path, *, cut_examples: bool = True) -> Path:
    """Two data sets in ``prepare``'s layout: train side (whole conversations), test side (whole + cut)."""
    for k, name in enumerate(DATASETS):
        d = root / name
        d.mkdir(parents=True)
        with (d / "train.jsonl").open("w") as fh:
            for i in range(6):
                rec = synthetic_conversation(100 * k + i, 2 + i % 3)
                fh.write(
                    json.dumps(
                        {
                            "conversation_id": f"{name}/train/{i}",
                            "dataset": name,
                            "messages": rec["turns"],
                            "target_start": len(rec["turns"]) - 1,
                        }
                    )
                    + "\n"
                )
        with (d / "test.jsonl").open("w") as fh:
            for i in range(5):
                turns = synthetic_conversation(100 * k + 50 + i, 3)["turns"]
                cid = f"{name}/test/{i}"
                fh.write(json.dumps({"conversation_id": cid, "complete": True, "messages": turns}) + "\n")
                if cut_examples:
                    fh.write(json.dumps({"conversation_id": cid, "complete": False, "messages": turns[:3]}) + "\n")
    (root / "manifest.json").write_text("{}\n")
    return root


def _argv(tiny: TinyModel, data: Path, tmp: Path, *extra: str) -> list[str]:
    return [
        "--data",
        str(data),
        "--base",
        f"one={tiny.model_dir}",
        "--base",
        f"two={tiny.model_dir}",
        "--datasets",
        ",".join(DATASETS),
        "--per-dataset",
        "4",
        "--test",
        "3",
        "--epochs",
        "1",
        "--calibrate",
        "3",
        "--recipe-from",
        str(tiny.adapter_dir),
        "--work",
        str(tmp / "work"),
        "--out",
        str(tmp / "out"),
        *extra,
    ]


def test_every_base_is_trained_without_the_held_out_set_and_scored_on_it(tiny_model: TinyModel, tmp_path: Path) -> None:
    data = _prepared(tmp_path / "data")
    assert lodo.main(_argv(tiny_model, data, tmp_path)) == 0
    doc: dict[str, Any] = json.loads((tmp_path / "out" / "lodo.json").read_text())
    assert set(doc["points"]) == {f"{b}/{d}" for b in ("one", "two") for d in DATASETS}
    for key, p in doc["points"].items():
        held_out = key.split("/")[1]
        assert held_out not in p["trained_on"]  # never trained on what it is scored on
        assert sum(p["trained_on"].values()) == 4
        assert p["examples"] == 6 and p["steps"] >= 1
        assert len(p["scores"]["p_end"]) == 6 and all(0.0 <= x <= 1.0 for x in p["scores"]["p_end"])
        # calibrated on 3 of the held-out set's own train-side conversations, unlabelled
        assert p["calibration"]["conversations"] == 3
        assert p["calibration"]["recommended_rule"] in {"greedy", "threshold"}
        if p["calibration"]["p_end_threshold"] is not None:
            assert p["threshold"]["roc_auc"] == p["roc_auc"]  # one ranking, two rules
        for metric in ("f1_complete", "roc_auc"):
            lo_hi = p["interval"][metric]
            if p[metric] is not None and lo_hi is not None:
                assert lo_hi[0] <= lo_hi[1]
        manifest = json.loads((tmp_path / "work" / key / "manifest.json").read_text())
        assert manifest["data"]["datasets"] == [d for d in DATASETS if d != held_out]
    # Same data, seed and recipe on the same base: the two "bases" agree exactly.
    for d in DATASETS:
        assert doc["points"][f"one/{d}"]["roc_auc"] == doc["points"][f"two/{d}"]["roc_auc"]
    md = (tmp_path / "out" / "lodo.md").read_text()
    assert "| alpha |" in md and "one: F1(c) greedy" in md and "two: ROC-AUC" in md
    assert (tmp_path / "out" / "lodo.png").stat().st_size > 0

    # A rerun skips done stages: a marked point survives, a removed one is measured again, and one
    # that lacks its calibration is calibrated without being trained again.
    doc["points"]["one/alpha"]["marker"] = "kept"
    del doc["points"]["two/beta"]
    del doc["points"]["one/beta"]["calibration"]
    doc["points"]["one/beta"]["steps"] = -1
    (tmp_path / "out" / "lodo.json").write_text(json.dumps(doc))
    assert lodo.main(_argv(tiny_model, data, tmp_path)) == 0
    again = json.loads((tmp_path / "out" / "lodo.json").read_text())
    assert again["points"]["one/alpha"]["marker"] == "kept"
    assert "two/beta" in again["points"]
    assert again["points"]["one/beta"]["steps"] == -1 and "calibration" in again["points"]["one/beta"]


def test_a_test_side_without_cut_examples_is_a_clear_error(
    tiny_model: TinyModel, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = _prepared(tmp_path / "data", cut_examples=False)
    assert lodo.main(_argv(tiny_model, data, tmp_path)) == 2
    assert "needs complete and cut examples" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"--base": "no-equals-sign"}, "expected NAME=DIR"),
        ({"--base": "=dir"}, "expected NAME=DIR"),
        ({"--base": "x=/nonexistent/model"}, "no model directory"),
        ({"--datasets": "alpha"}, "at least two data sets"),
        ({"--datasets": "alpha,../../etc"}, "not prepared"),
        ({"--per-dataset": "0"}, "at least 1"),
        ({"--test": "-3"}, "at least 1"),
        ({"--calibrate": "0"}, "at least 1"),
        ({"--per-dataset": "many"}, "invalid int value"),
    ],
)
def test_bad_arguments_are_refused_before_any_training(
    tiny_model: TinyModel, tmp_path: Path, capsys: pytest.CaptureFixture[str], change: dict[str, str], message: str
) -> None:
    data = _prepared(tmp_path / "data")
    argv = _argv(tiny_model, data, tmp_path)
    for flag, value in change.items():
        argv[argv.index(flag) + 1] = value
    with pytest.raises(SystemExit) as exc:
        lodo.main(argv)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "work").exists()


def test_two_bases_may_not_share_a_name(
    tiny_model: TinyModel, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = _prepared(tmp_path / "data")
    argv = _argv(tiny_model, data, tmp_path)
    argv[argv.index("two=" + str(tiny_model.model_dir))] = "one=" + str(tiny_model.model_dir)
    with pytest.raises(SystemExit):
        lodo.main(argv)
    assert "names must differ" in capsys.readouterr().err


def test_the_recorded_command_names_the_home_directory_as_a_tilde(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("sys.argv", ["lodo", "--base", f"g={Path.home()}/models/g", "--out", "x y"])
    command = recorded_command("python -m adapters.evaluation.lodo")
    assert str(Path.home()) not in command
    assert command == "python -m adapters.evaluation.lodo --base g=~/models/g --out 'x y'"
    assert recorded_command("adapters", ["eval", "--out", f"{Path.home()}/r"]) == "adapters eval --out ~/r"


def test_a_root_home_directory_leaves_paths_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", "/")
    assert recorded_command("adapters", ["eval", "--out", "/data/r"]) == "adapters eval --out /data/r"
