"""``adapters import-gguf``: a GGUF file becomes a plain base directory with the GGUF model's logits,
and a file that is missing, not a GGUF, cut short or corrupt is refused in one line."""

from __future__ import annotations

import hashlib
import json
import struct
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from adapters.cli import main
from adapters.data.tokenizer import END_TAG
from adapters.training.end_tag import add_end_tag
from adapters.training.gguf_import import GEMMA_NOTICE, import_gguf
from tests.support.tiny_gguf import SPECIALS, write_tiny_gemma3_gguf

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::FutureWarning")

TEXT = "a rare see on the neat stars"
IDS = torch.tensor([[2, 40, 41, 77, 95, 120, 7, 250, 299]])


@pytest.fixture(scope="module")
def gguf_file(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    path = tmp_path_factory.mktemp("gguf") / "tiny-gemma3.gguf"
    source = write_tiny_gemma3_gguf(path)
    return path, source


def run_cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    try:
        code = main(argv)
    except SystemExit as exc:
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


@torch.no_grad()
def logits(model: Any) -> torch.Tensor:
    out: torch.Tensor = model(IDS).logits.float()
    return out


def test_imported_directory_gives_the_gguf_models_logits(
    tmp_path: Path, gguf_file: tuple[Path, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    path, source = gguf_file
    out = tmp_path / "base"
    code, stdout, err = run_cli(["import-gguf", str(path), str(out), "--dtype", "float32"], capsys)
    assert code == 0, err
    result = json.loads(stdout)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["kind"] == "imported-base"
    for key, value in result.items():
        assert manifest[key] == value
    assert result["source_file"] == path.name
    assert result["source_sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    assert result["architecture"] == "gemma3" and result["model_class"] == "Gemma3ForCausalLM"
    assert result["parameters"] == sum(p.numel() for p in source.parameters())
    assert (result["vocab_size"], result["tokenizer_size"], result["dtype"]) == (300, 300, "float32")
    assert result["licence"] == GEMMA_NOTICE and (out / "NOTICE").read_text().strip() == GEMMA_NOTICE
    config = json.loads((out / "config.json").read_text())
    assert "quantization_config" not in config and config["vocab_size"] == 300

    from_gguf: Any = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name)
    imported: Any = AutoModelForCausalLM.from_pretrained(str(out))
    assert not hasattr(imported.config, "quantization_config")
    expected = logits(from_gguf)
    assert torch.equal(logits(imported), expected)
    assert torch.allclose(expected, logits(source), atol=1e-5)  # and the GGUF held the source model

    tok_gguf = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    tok = AutoTokenizer.from_pretrained(str(out))
    assert tok.encode(TEXT) == tok_gguf.encode(TEXT) and len(tok.encode(TEXT)) > 3
    assert tok.convert_tokens_to_ids("<unused0>") == len(SPECIALS)
    assert not list(tmp_path.glob(".*partial"))
    assert out.stat().st_mode & 0o777 == 0o755
    assert {p.stat().st_mode & 0o777 for p in out.iterdir()} == {0o644}


def test_default_is_bf16_with_the_dequantised_weights_rounded(tmp_path: Path, gguf_file: tuple[Path, Any]) -> None:
    path, source = gguf_file
    result = import_gguf(path, tmp_path / "bf16", licence_note="CC-BY-4.0, attribution: the test suite")
    assert result["dtype"] == "bfloat16" and result["licence"] == "CC-BY-4.0, attribution: the test suite"
    saved = load_file(str(tmp_path / "bf16" / "model.safetensors"))
    assert {t.dtype for t in saved.values()} == {torch.bfloat16}
    emb = source.get_input_embeddings().weight.detach()
    assert torch.equal(saved["model.embed_tokens.weight"], emb.to(torch.bfloat16))
    norm = source.model.layers[0].input_layernorm.weight.detach()  # stored +1 in the GGUF, undone on load
    assert torch.allclose(saved["model.layers.0.input_layernorm.weight"].float(), norm, atol=1e-2)


def test_add_end_tag_reuses_an_unused_token_of_the_imported_base(tmp_path: Path, gguf_file: tuple[Path, Any]) -> None:
    path, _ = gguf_file
    import_gguf(path, tmp_path / "base", dtype="float32")
    result = add_end_tag(tmp_path / "base", tmp_path / "tagged")
    unused0 = len(SPECIALS)
    assert (result["method"], result["end_tag_id"], result["renamed_token"]) == ("reuse", unused0, "<unused0>")
    assert result["rows_before"] == result["rows_after"] == 300
    manifest = json.loads((tmp_path / "tagged" / "manifest.json").read_text())
    assert (manifest["renamed_token"], manifest["end_tag_id"]) == ("<unused0>", unused0)
    tok = AutoTokenizer.from_pretrained(str(tmp_path / "tagged"))
    assert len(tok) == 300
    assert tok.encode(END_TAG, add_special_tokens=False) == [unused0]
    assert tok.convert_tokens_to_ids("<unused1>") == unused0 + 1
    model: Any = AutoModelForCausalLM.from_pretrained(str(tmp_path / "tagged"))
    assert model.get_input_embeddings().weight.shape[0] == 300
    assert model(torch.tensor([[2, unused0]])).logits.shape[-1] == 300


def _header(tensor_count: int, kv_count: int, version: int = 3) -> bytes:
    return b"GGUF" + struct.pack("<IQQ", version, tensor_count, kv_count)


def hostile_files(root: Path, good: bytes) -> dict[str, tuple[Path, str]]:
    """Each bad input, with a fragment of the one-line error it must give."""
    files: dict[str, tuple[Path, str]] = {"missing": (root / "absent.gguf", "does not exist")}
    (root / "a-directory.gguf").mkdir()
    files["directory"] = (root / "a-directory.gguf", "not a file")
    contents = {
        "empty": (b"", "not a GGUF file"),
        "safetensors": (b"\x08\x00\x00\x00\x00\x00\x00\x00{}      ", "not a GGUF file"),
        "lowercase-magic": (b"gguf" + good[4:], "not a GGUF file"),
        "magic-only": (b"GGUF", "truncated or corrupt"),
        "cut-in-header": (good[:20], "truncated or corrupt"),
        "cut-in-metadata": (good[:1000], "truncated or corrupt"),
        "cut-in-tensors": (good[: len(good) // 2], "truncated"),
        "last-byte-missing": (good[:-1], "truncated"),
        "huge-counts": (_header(2**63, 2**63), "truncated or corrupt"),
        "huge-string": (_header(1, 1) + struct.pack("<Q", 2**62) + b"abc", "truncated or corrupt"),
        "future-version": (_header(0, 0, version=99), "truncated or corrupt"),
        "no-tensors": (_header(0, 0), "holds no tensors"),
    }
    for name, (data, message) in contents.items():
        (root / f"{name}.gguf").write_bytes(data)
        files[name] = (root / f"{name}.gguf", message)
    return files


def test_hostile_files_are_refused_in_one_line(
    tmp_path: Path, gguf_file: tuple[Path, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad"
    bad.mkdir()
    for name, (path, message) in hostile_files(bad, gguf_file[0].read_bytes()).items():
        out = tmp_path / f"out-{name}"
        code, stdout, err = run_cli(["import-gguf", str(path), str(out)], capsys)
        assert code == 2, (name, err)
        assert stdout == "" and err.count("\n") == 1 and err.startswith("adapters import-gguf: error:"), (name, err)
        assert message in err, (name, err)
        assert "Traceback" not in err and not out.exists(), name
    assert not list(tmp_path.glob(".*partial"))


def test_unsupported_architecture_is_refused(
    tmp_path: Path, gguf_file: tuple[Path, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    import gguf
    import numpy as np

    path = tmp_path / "other.gguf"
    writer = gguf.GGUFWriter(str(path), "not-an-architecture")
    writer.add_tensor("token_embd.weight", np.zeros((4, 4), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    code, _, err = run_cli(["import-gguf", str(path), str(tmp_path / "out")], capsys)
    assert code == 2 and "cannot load GGUF architecture 'not-an-architecture'" in err


@pytest.mark.parametrize("damage", ["omit", "transpose"])
def test_a_missing_or_misshapen_tensor_is_refused_not_filled_at_random(
    tmp_path: Path, damage: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """transformers would initialise a missing tensor at random with a warning: the import refuses."""
    key = "model.layers.1.mlp.up_proj.weight"
    path = tmp_path / "damaged.gguf"
    damaged = frozenset({key})
    if damage == "omit":
        write_tiny_gemma3_gguf(path, omit=damaged)
    else:
        write_tiny_gemma3_gguf(path, transpose=damaged)
    code, stdout, err = run_cli(["import-gguf", str(path), str(tmp_path / "out")], capsys)
    # transformers' own progress bar and load report come first; the command's error is one line
    assert code == 2 and stdout == "" and err.count("adapters import-gguf: error:") == 1, err
    assert err.splitlines()[-1].startswith("adapters import-gguf: error:"), err
    assert (key in err) if damage == "omit" else ("cannot load damaged.gguf" in err), err
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".*partial"))


def test_output_must_be_absent_or_empty(
    tmp_path: Path, gguf_file: tuple[Path, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    path, _ = gguf_file
    full = tmp_path / "full"
    full.mkdir()
    (full / "keep.txt").write_text("mine")
    a_file = tmp_path / "a-file"
    a_file.write_text("mine")
    for out in (full, a_file):
        code, _, err = run_cli(["import-gguf", str(path), str(out)], capsys)
        assert code == 2 and "is not an empty directory" in err, err
    assert (full / "keep.txt").read_text() == "mine" and a_file.read_text() == "mine"
    empty = tmp_path / "empty"
    empty.mkdir()
    assert import_gguf(path, empty, dtype="float32")["vocab_size"] == 300
    assert (empty / "model.safetensors").exists()


def test_bad_options_are_refused(
    tmp_path: Path, gguf_file: tuple[Path, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run_cli(["import-gguf", str(gguf_file[0]), str(tmp_path / "o"), "--dtype", "int4"], capsys)
    assert code == 2 and "invalid choice" in err
    with pytest.raises(Exception, match="--dtype must be one of"):
        import_gguf(gguf_file[0], tmp_path / "o", dtype="int4")
