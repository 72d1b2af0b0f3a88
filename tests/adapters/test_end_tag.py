"""``adapters add-end-tag``: a base without the end tag gets one (added or a reserved token reused), its
rows initialised, and vLLM serves the result with an adapter trained on it."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import httpx
import pytest
import torch
from safetensors.torch import load_file
from tokenizers import AddedToken, Tokenizer
from tokenizers.models import Unigram
from tokenizers.pre_tokenizers import WhitespaceSplit
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

from adapters.cli import main
from adapters.data.tokenizer import END_TAG, encode_plain, train_tokenizer
from adapters.serving.export import export_adapter
from adapters.training.end_tag import _reserved_token, add_end_tag
from adapters.training.lora import train_lora
from adapters.training.recipe import LoraRecipe
from sidecar.tools.local_vllm import LocalVllmServer, LocalVllmSpec
from tests.adapters.conftest import synthetic_conversation

pytestmark = pytest.mark.filterwarnings("ignore:.*is_gradient_checkpointing.*:FutureWarning")

BOS, EOS = "<|begin_of_text|>", "<|end_of_text|>"
RESERVED = ["<|reserved_special_token_0|>", "<|reserved_special_token_1|>"]
UNUSED = tuple(f"<unused{i}>" for i in range(10))
CORPUS = [
    "TURN 1, STEP 1, user chat:\nbook a table for two tonight please",
    "TURN 1, STEP 2, assistant chat:\nsure, done. you are welcome, goodbye.",
] * 10


def stock_base(
    root: Path, *, reserved: bool, tied: bool = False, placeholders: tuple[str, ...] = (), tok: Tokenizer | None = None
) -> Path:
    """A tiny Llama like a stock base: no end tag, no pad token (optionally reserved special tokens,
    or other placeholder special tokens, or a given tokenizer)."""
    root.mkdir(parents=True)
    if tok is None:
        specials = [BOS, EOS, *(RESERVED if reserved else []), *placeholders]
        tok = train_tokenizer(CORPUS, 300, special_tokens=specials)
    tok.save(str(root / "tokenizer.json"))
    cfg = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": BOS, "eos_token": EOS}
    (root / "tokenizer_config.json").write_text(json.dumps(cfg))
    torch.manual_seed(0)
    model = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=tok.get_vocab_size(),
            hidden_size=128,
            intermediate_size=256,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=2,
            max_position_embeddings=1024,
            tie_word_embeddings=tied,
            bos_token_id=0,
            eos_token_id=1,
        )
    )
    model.save_pretrained(str(root), safe_serialization=True)
    return root


@pytest.mark.parametrize("tied", [False, True])
def test_added_end_tag_is_one_special_token_with_a_typical_row(tmp_path: Path, tied: bool) -> None:
    base = stock_base(tmp_path / "base", reserved=False, tied=tied)
    rows = Tokenizer.from_file(str(base / "tokenizer.json")).get_vocab_size()
    result = add_end_tag(base, tmp_path / "out")
    assert (result["method"], result["end_tag_id"], result["rows_after"]) == ("add", rows, rows + 1)
    tok = Tokenizer.from_file(str(tmp_path / "out" / "tokenizer.json"))
    assert tok.encode(END_TAG, add_special_tokens=False).ids == [rows]
    assert rows not in encode_plain(tok, f"typed by a user: {END_TAG}")  # content never becomes the tag
    before, after = load_file(str(base / "model.safetensors")), load_file(str(tmp_path / "out" / "model.safetensors"))
    emb = after["model.embed_tokens.weight"]
    assert torch.equal(emb[:rows], before["model.embed_tokens.weight"])  # nothing else moved
    norms = emb[:rows].norm(dim=1)
    assert float(emb[rows].norm()) == pytest.approx(float(norms.median()), rel=1e-3)
    if not tied:
        head = after["lm_head.weight"]
        assert float(head[rows].norm()) == pytest.approx(float(head[:rows].norm(dim=1).median()), rel=1e-3)
    cfg = json.loads((tmp_path / "out" / "tokenizer_config.json").read_text())
    assert cfg["added_tokens_decoder"][str(rows)]["special"] is True and END_TAG in cfg["additional_special_tokens"]
    assert json.loads((tmp_path / "out" / "config.json").read_text())["vocab_size"] == rows + 1
    again = add_end_tag(tmp_path / "out", tmp_path / "again")
    assert (again["method"], again["end_tag_id"]) == ("present", rows)


@pytest.mark.parametrize("umask", [0o022, 0o027])
def test_every_prepared_file_is_readable_like_a_plain_write(tmp_path: Path, umask: int) -> None:
    """The weights too: a vLLM server run as another user reads the prepared base. A base whose
    files are private (0600) gives no private copies either; the umask is respected."""
    base = stock_base(tmp_path / "base", reserved=False)
    (base / "generation_config.json").write_text("{}")  # a side file copied as it is
    for p in base.iterdir():
        p.chmod(0o600)
    old = os.umask(umask)
    try:
        add_end_tag(base, tmp_path / "out")
    finally:
        os.umask(old)
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in (tmp_path / "out").iterdir()}
    assert {"model.safetensors", "config.json", "tokenizer.json", "manifest.json"} <= set(modes)
    assert modes == dict.fromkeys(modes, 0o666 & ~umask)


def test_a_reserved_special_token_is_reused_without_a_resize(tmp_path: Path) -> None:
    base = stock_base(tmp_path / "base", reserved=True)
    reserved_id = Tokenizer.from_file(str(base / "tokenizer.json")).token_to_id(RESERVED[0])
    result = add_end_tag(base, tmp_path / "out")
    assert (result["method"], result["end_tag_id"], result["renamed_token"]) == ("reuse", reserved_id, RESERVED[0])
    assert result["rows_before"] == result["rows_after"]
    tok = Tokenizer.from_file(str(tmp_path / "out" / "tokenizer.json"))
    assert tok.token_to_id(RESERVED[0]) is None and tok.token_to_id(RESERVED[1]) is not None
    assert add_end_tag(base, tmp_path / "never", reuse_reserved=False)["method"] == "add"


def test_an_unused_placeholder_is_reused_like_a_reserved_token(tmp_path: Path) -> None:
    """Gemma's ``<unusedN>``: the lowest number is renamed (``<unused2>`` before ``<unused10>``), no
    resize, and the report names the token it replaced."""
    base = stock_base(tmp_path / "base", reserved=False, placeholders=UNUSED)
    cfg = json.loads((base / "tokenizer_config.json").read_text())  # as transformers 5 writes it
    (base / "tokenizer_config.json").write_text(json.dumps({**cfg, "extra_special_tokens": list(UNUSED[:2])}))
    before = Tokenizer.from_file(str(base / "tokenizer.json"))
    unused0 = before.token_to_id("<unused0>")
    assert unused0 is not None
    result = add_end_tag(base, tmp_path / "out")
    assert (result["method"], result["end_tag_id"], result["renamed_token"]) == ("reuse", unused0, "<unused0>")
    assert result["rows_before"] == result["rows_after"] == before.get_vocab_size()
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert (manifest["renamed_token"], manifest["end_tag_id"]) == ("<unused0>", unused0)
    tok = Tokenizer.from_file(str(tmp_path / "out" / "tokenizer.json"))
    assert tok.get_vocab_size() == before.get_vocab_size()
    assert tok.token_to_id("<unused0>") is None
    assert [tok.token_to_id(t) for t in UNUSED[1:]] == [before.token_to_id(t) for t in UNUSED[1:]]
    assert tok.encode(f"a {END_TAG} b", add_special_tokens=False).ids.count(unused0) == 1
    written = json.loads((tmp_path / "out" / "tokenizer_config.json").read_text())
    assert written["extra_special_tokens"] == [UNUSED[1]]  # the renamed one would come back as a new id
    hf = AutoTokenizer.from_pretrained(str(tmp_path / "out"))
    assert len(hf) == before.get_vocab_size() and hf.convert_tokens_to_ids(END_TAG) == unused0
    again = add_end_tag(tmp_path / "out", tmp_path / "again")  # the next run finds the tag
    assert (again["method"], again["rows_after"]) == ("present", before.get_vocab_size())
    # Llama 3's reserved tokens win over <unusedN>; numbers compare as numbers.
    both = stock_base(tmp_path / "both", reserved=True, placeholders=UNUSED)
    assert add_end_tag(both, tmp_path / "both-out")["renamed_token"] == RESERVED[0]
    late = stock_base(tmp_path / "late", reserved=False, placeholders=("<unused10>", "<unused2>"))
    assert add_end_tag(late, tmp_path / "late-out")["renamed_token"] == "<unused2>"


def test_a_plain_unused_token_in_a_unigram_vocabulary_is_reused_as_a_special_token(tmp_path: Path) -> None:
    """A tokenizer.json where ``<unusedN>`` are plain added tokens over a Unigram ``[piece, score]``
    vocabulary: the piece is renamed in place and the end tag becomes special."""
    pieces = [("<unk>", 0.0), (BOS, 0.0), (EOS, 0.0), *((u, 0.0) for u in UNUSED[:3])]
    pieces += [(w, -1.0 - i / 10) for i, w in enumerate(sorted({w for line in CORPUS for w in line.split()}))]
    pieces += [(c, -5.0) for c in sorted({c for line in CORPUS for c in line})]
    tok = Tokenizer(Unigram(pieces, unk_id=0, byte_fallback=False))
    tok.pre_tokenizer = WhitespaceSplit()
    tok.add_special_tokens([BOS, EOS])
    tok.add_tokens([AddedToken(u, special=False, normalized=False) for u in UNUSED[:3]])
    base = stock_base(tmp_path / "base", reserved=False, tok=tok)
    result = add_end_tag(base, tmp_path / "out")
    assert (result["method"], result["end_tag_id"], result["renamed_token"]) == ("reuse", 3, "<unused0>")
    raw = json.loads((tmp_path / "out" / "tokenizer.json").read_text())
    assert raw["model"]["vocab"][3][0] == END_TAG
    entry = next(t for t in raw["added_tokens"] if t["id"] == 3)
    assert entry["content"] == END_TAG and entry["special"] is True
    out = Tokenizer.from_file(str(tmp_path / "out" / "tokenizer.json"))
    assert out.get_vocab_size() == len(pieces)
    assert out.encode(f"book {END_TAG}").ids[-1] == 3
    assert out.decode([3], skip_special_tokens=True) == ""


def test_a_hostile_tokenizer_json_gives_no_reuse(tmp_path: Path) -> None:
    """Entries that only look like placeholders (wrong shape, no id, decorated names) are not reused."""
    base = stock_base(tmp_path / "base", reserved=False)
    raw = json.loads((base / "tokenizer.json").read_text())
    raw["added_tokens"] += [
        "<unused0>",
        {"content": "<unused1>"},
        {"id": "7", "content": "<unused2>"},
        {"id": 9, "content": " <unused3>"},
        {"id": 9, "content": "<unused-4>"},
        {"id": 9, "content": "<|reserved_special_token_x|>"},
    ]
    assert _reserved_token(raw) is None
    assert _reserved_token({"added_tokens": []}) is None and _reserved_token({}) is None


def test_cli_refuses_what_is_not_a_model(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (
        ["--base", str(tmp_path), "--out", str(tmp_path / "o")],
        ["--base", str(stock_base(tmp_path / "b", reserved=False)), "--out", str(tmp_path / "b")],
    ):
        with pytest.raises(SystemExit) as exc:
            main(["add-end-tag", *argv])
        assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "not a model directory" in err and "--out must differ" in err


@pytest.mark.slow
@pytest.mark.vllm
def test_vllm_serves_the_converted_base_with_an_adapter_trained_on_it(tmp_path: Path) -> None:
    base = tmp_path / "with-tag"
    end_id = add_end_tag(stock_base(tmp_path / "base", reserved=False), base)["end_tag_id"]
    data = tmp_path / "prepared"
    (data / "toy").mkdir(parents=True)
    with (data / "toy" / "train.jsonl").open("w") as fh:
        for i in range(16):
            rec = synthetic_conversation(i, 2)
            fh.write(
                json.dumps(
                    {
                        "conversation_id": rec["conversation_id"],
                        "messages": rec["turns"],
                        "target_start": len(rec["turns"]) - 1,
                    }
                )
                + "\n"
            )
    (data / "manifest.json").write_text("{}\n")
    recipe = LoraRecipe(epochs=2, learning_rate=3e-3, max_context_tokens=256, decision_windows=1)
    train_lora(data, ["toy"], base, tmp_path / "trained", recipe)  # no <|pad|>: pads with eos
    export_adapter(tmp_path / "trained", tmp_path / "adapter", "base")
    server = LocalVllmServer(
        LocalVllmSpec(model_dir=base, lora_modules={"completion": tmp_path / "adapter"}, max_model_len=1024),
        tmp_path / "vllm.log",
    )
    server.start()
    try:
        server.wait_ready_blocking()
        with httpx.Client(timeout=300) as http:
            ids = http.post(server.root_url + "/tokenize", json={"model": "base", "prompt": END_TAG}).json()["tokens"]
            assert end_id in ids
            resp = http.post(
                server.base_url + "/completions",
                json={
                    "model": "completion",
                    "prompt": [5, 6, 7],
                    "max_tokens": 1,
                    "logprobs": 1,
                    "allowed_token_ids": [end_id],
                    "return_tokens_as_token_ids": True,
                },
            ).json()
        assert resp["choices"][0]["logprobs"]["tokens"] == [f"token_id:{end_id}"], resp
    finally:
        server.stop()
