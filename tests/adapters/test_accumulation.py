"""Gradient accumulation (micro-batches), the CUDA allocator setting and the training figures."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from adapters.cli import main
from adapters.data.tokenizer import BOS, END_TAG, EOS, PAD
from adapters.onboarding.report import training_line
from adapters.training.base import build_model
from adapters.training.loop import IGNORE, TrainSeq, accumulate_gradients, collate, lm_loss_sum, weighted_lm_loss
from adapters.training.lora import LoraRecipe, load_sequences, train_lora
from adapters.training.recipe import check_micro_batch
from adapters.training.resources import DEFAULT_ALLOC_CONF, configure_cuda_allocator, peak_memory
from tests.adapters.test_training import TINY, _tiny_base, _write_prepared

pytestmark = pytest.mark.filterwarnings("ignore:.*is_gradient_checkpointing.*:FutureWarning")


def _batch(weighted: bool) -> list[TrainSeq]:
    """Five sequences of uneven lengths and label counts; weighted: some with weights, some without."""
    gen = random.Random(1)
    out = []
    for i, n in enumerate((12, 5, 30, 9, 17)):
        ids = [gen.randrange(4, TINY.vocab_size) for _ in range(n)]
        cut = gen.randrange(0, n - 2)
        weights = [gen.choice((1.0, 20.0)) for _ in range(n)] if weighted and i % 2 == 0 else None
        out.append(TrainSeq(ids, [IGNORE] * cut + ids[cut:], weights))
    return out


def _grads(model: torch.nn.Module) -> list[torch.Tensor]:
    return [p.grad.detach().clone() for p in model.parameters() if p.grad is not None]


@pytest.mark.parametrize("weighted", [False, True])
def test_accumulated_gradient_equals_the_full_batch_gradient(weighted: bool) -> None:
    torch.manual_seed(0)
    model = build_model(TINY, {BOS: 0, EOS: 1, PAD: 2, END_TAG: 3})
    seqs = _batch(weighted)
    # The reference is the loss the loop took before accumulation existed: the model's own mean
    # (unweighted) or weighted_lm_loss, over the whole batch in one pass.
    whole = collate(seqs, pad_id=2)
    reference = weighted_lm_loss(model, whole) if weighted else model(**whole).loss
    reference.backward()
    reference_loss = float(reference.detach())
    expected = _grads(model)
    assert len(expected) == len(list(model.parameters()))
    for micro in (5, 3, 2, 1):  # 3: slices of 3 and 2; 2: 2, 2 and 1
        model.zero_grad(set_to_none=True)
        loss = accumulate_gradients(model, seqs, 2, micro)
        assert loss == pytest.approx(reference_loss, rel=1e-5)
        for got, want in zip(_grads(model), expected, strict=True):
            torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
    # Averaging each slice's own mean is not the same thing here (the test can tell them apart).
    model.zero_grad(set_to_none=True)
    slices = [seqs[i : i + 2] for i in range(0, len(seqs), 2)]
    for part in slices:
        batch = collate(part, pad_id=2)
        torch.autograd.backward(weighted_lm_loss(model, batch) / len(slices))
    naive = _grads(model)
    assert max(float((a - b).abs().max()) for a, b in zip(naive, expected, strict=True)) > 1e-3


def test_a_batch_without_labels_gives_no_gradient() -> None:
    torch.manual_seed(0)
    model = build_model(TINY, {BOS: 0, EOS: 1, PAD: 2, END_TAG: 3})
    seqs = [TrainSeq([5, 6, 7], [IGNORE] * 3), TrainSeq([8, 9], [IGNORE, IGNORE])]
    assert accumulate_gradients(model, seqs, 2, 1) == 0.0
    grads = _grads(model)
    assert len(grads) == len(list(model.parameters()))
    assert all(float(g.abs().max()) == 0.0 for g in grads)
    assert float(lm_loss_sum(model, collate(seqs, 2)).detach()) == 0.0


def test_training_with_micro_batches_gives_the_same_adapter(
    tmp_path: Path, toy_tokenizer: Any, toy_records: list[dict[str, Any]]
) -> None:
    base, _ = _tiny_base(tmp_path, toy_tokenizer, toy_records)
    data = _write_prepared(tmp_path, toy_records, count=13)  # batches of 8 and 5 (a partial last one)
    recipe = LoraRecipe(
        rank=4, alpha=8, dropout=0.0, epochs=3, learning_rate=1e-2, batch_size=8, max_context_tokens=128
    )
    whole = train_lora(data, ["toy"], base, tmp_path / "whole", recipe)
    micro = train_lora(
        data, ["toy"], base, tmp_path / "micro", LoraRecipe(**{**_fields(recipe), "micro_batch_size": 3})
    )
    assert whole["steps"] == micro["steps"] == 6
    assert (whole["micro_batch_size"], whole["gradient_accumulation_steps"]) == (8, 1)
    assert (micro["micro_batch_size"], micro["gradient_accumulation_steps"]) == (3, 3)
    a = load_file(tmp_path / "whole" / "adapter_model.safetensors")
    b = load_file(tmp_path / "micro" / "adapter_model.safetensors")
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(b[key], a[key], rtol=0, atol=1e-5)
    # B starts at zero: the adapter moved far more than the tolerance, so the comparison means something.
    assert max(float(a[k].abs().max()) for k in a if "lora_B" in k) > 1e-2
    assert micro["loss_first_10"] == pytest.approx(whole["loss_first_10"], abs=1e-4)

    # Throughput and memory, in the result and the manifest.
    seqs, _ = load_sequences(data, ["toy"], base, recipe, with_end_tag=True, max_per_dataset=None)
    assert whole["tokens"] == micro["tokens"] == 3 * sum(len(s.input_ids) for s in seqs)  # 3 epochs
    for result in (whole, micro):
        assert 0 < result["tokens_per_second"] < 1e7
        assert result["memory"]["kind"] == "cpu" and 0.01 < result["memory"]["peak_rss_gib"] < 256
        assert result["cuda_allocator"] is None
    manifest = json.loads((tmp_path / "micro" / "manifest.json").read_text())
    assert manifest["hyperparameters"]["micro_batch_size"] == 3
    assert manifest["metrics"]["tokens_per_second"] == micro["tokens_per_second"]
    assert manifest["metrics"]["memory"]["kind"] == "cpu"


def _fields(recipe: LoraRecipe) -> dict[str, Any]:
    return {name: getattr(recipe, name) for name in recipe.__dataclass_fields__}


@pytest.mark.parametrize(
    ("batch", "micro", "message"),
    [
        (8, 0, "at least 1"),
        (8, -2, "at least 1"),
        (8, 2.5, "whole number"),
        (8, True, "whole number"),
        (8, "2", "whole number"),
        (0, None, "batch size must be"),
        (4, 5, r"micro-batch size \(5\) exceeds the batch size \(4\)"),
    ],
)
def test_bad_micro_batch_sizes_are_refused(batch: Any, micro: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        check_micro_batch(batch, micro)
    with pytest.raises(ValueError, match=message):
        LoraRecipe(batch_size=batch, micro_batch_size=micro)


def test_good_micro_batch_sizes() -> None:
    assert check_micro_batch(8, None) == 8
    assert check_micro_batch(8, 8) == 8
    assert check_micro_batch(8, 1) == 1


@pytest.mark.parametrize("value", ["0", "-1", "1.5", "two", ""])
@pytest.mark.parametrize("command", ["train-lora", "onboard"])
def test_cli_refuses_bad_micro_batch_flags(command: str, value: str, capsys: pytest.CaptureFixture[str]) -> None:
    args = (
        ["--data", "d", "--base", "b", "--out", "o"]
        if command == "train-lora"
        else ["--agent", "a", "--source", "s", "--out", "o"]
    )
    with pytest.raises(SystemExit) as exc:
        main([command, *args, "--micro-batch-size", value])
    assert exc.value.code == 2
    assert "--micro-batch-size" in capsys.readouterr().err


def test_train_lora_refuses_a_micro_batch_larger_than_the_batch(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["train-lora", "--data", "d", "--base", "b", "--out", "o", "--batch-size", "4", "--micro-batch-size", "6"])
    assert exc.value.code == 2
    assert "micro-batch size (6) exceeds the batch size (4)" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--batch-size", "2", "--micro-batch-size", "3"], "micro-batch size (3) exceeds the batch size (2)"),
        # The bundled adapter's recipe has batch 8: its batch is inherited, a larger micro-batch refused.
        (["--micro-batch-size", "9"], "micro-batch size (9) exceeds the batch size (8)"),
    ],
)
def test_onboard_refuses_a_micro_batch_larger_than_the_batch(
    tmp_path: Path, flags: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["onboard", "--agent", "a", "--source", "x.jsonl", "--out", str(tmp_path), *flags])
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_the_allocator_gets_expandable_segments_unless_the_user_chose() -> None:
    env: dict[str, str] = {}
    assert configure_cuda_allocator(env)["source"] == "adapters default"
    assert env == {"PYTORCH_CUDA_ALLOC_CONF": DEFAULT_ALLOC_CONF}
    for name in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"):
        env = {name: "max_split_size_mb:128"}
        assert configure_cuda_allocator(env) == {
            "variable": name,
            "value": "max_split_size_mb:128",
            "source": "environment",
        }
        assert env == {name: "max_split_size_mb:128"}  # nothing added next to the user's choice


def test_cpu_peak_memory_is_the_process_rss() -> None:
    held = torch.ones(64 * 1024**2 // 4)  # 64 MiB resident now: the peak is at least that
    mem = peak_memory("cpu")
    assert mem["kind"] == "cpu" and mem["peak_rss_gib"] >= 64 / 1024
    del held


def test_the_report_names_gpu_figures_or_says_it_ran_on_cpu() -> None:
    train = {
        "steps": 40,
        "train_seconds": 12.5,
        "micro_batch_size": 2,
        "gradient_accumulation_steps": 4,
        "tokens_per_second": 2048.0,
        "memory": {
            "kind": "gpu",
            "device": "NVIDIA L4",
            "peak_allocated_gib": 18.5,
            "peak_reserved_gib": 19.1,
            "device_total_gib": 22.0,
        },
        "cuda_allocator": {
            "variable": "PYTORCH_CUDA_ALLOC_CONF",
            "value": DEFAULT_ALLOC_CONF,
            "source": "adapters default",
        },
    }
    line = training_line(train)
    assert "18.5 GiB allocated, 19.1 GiB reserved of 22.0 GiB (NVIDIA L4)" in line
    assert "micro-batches of 2 (4 per optimiser step)" in line and "2048 tokens/s" in line
    assert "expandable_segments:True" in line
    cpu = training_line(
        {**train, "memory": {"kind": "cpu", "device": "cpu", "peak_rss_gib": 0.7}, "cuda_allocator": None}
    )
    assert "on CPU, peak resident memory of the process 0.7 GiB" in cpu and "GPU memory" not in cpu
    assert training_line({"steps": 3, "train_seconds": 1.0}) == "Training: 3 steps in 1.0 s."
