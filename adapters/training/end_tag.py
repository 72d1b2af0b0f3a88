"""``adapters add-end-tag``: make any Llama-style base able to emit ``<|end_of_conversation|>``.

The completion adapter predicts a dedicated end tag after a finished conversation. A stock base
(a Llama 3 8B, say) has no such token, and vLLM serves LoRA adapters without ``modules_to_save``,
so the adapter cannot add or train an embedding row: the base must already hold the token, with a
row from which a hidden state can make it the argmax. This command writes such a base:

- **present**: the tokenizer already has the end tag as a special token; files are copied.
- **reuse** (default when possible): the tokenizer has an unused reserved added token
  (``<|reserved_special_token_N|>``: Llama 3 has 250; ``<unusedN>``: Gemma has them, 6,242 in Gemma
  3); the lowest-numbered one is renamed to the end tag in ``tokenizer.json`` and
  ``tokenizer_config.json``. No resize: the embedding shape, and so every tensor-parallel layout,
  stays the base's own, and the sidecar can share the unmodified base with the agent.
- **add**: the end tag is appended as a special token and the embeddings (and an untied output
  head) are resized by one row.

Either way the end tag's row(s) are set to a random direction at the median norm of the model's
rows (:func:`init_rows`), as the bundled base does (``adapters.training.base.rescale_unseen_rows``): a
reserved or new row has a tiny or zero norm, and no hidden state could give it a large logit. The
rest of the model is unchanged; weights keep their dtype.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

import structlog
import torch
from tokenizers import AddedToken, Tokenizer

from adapters.data.tokenizer import END_TAG
from adapters.errors import DataError
from adapters.serving.manifest import write_manifest

log = structlog.get_logger()

# Reserved placeholders a vocabulary ships for later use, never seen in pretraining text: Llama 3's
# (special tokens) and Gemma's (special in a GGUF, where llama.cpp marks them CONTROL; plain added
# tokens in some tokenizer.json files). Llama 3's are preferred, then the lowest number.
RESERVED = (re.compile(r"<\|reserved_special_token_(\d+)\|>"), re.compile(r"<unused(\d+)>"))
_WEIGHT_FILES = re.compile(r"(model.*\.safetensors(\.index\.json)?|pytorch_model.*\.bin(\.index\.json)?)$")
_REWRITTEN = {
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "config.json",
    "generation_config.json",
    "manifest.json",
}


@torch.no_grad()
def init_rows(model: Any, token_ids: list[int], seed: int = 0) -> float:
    """Rows ``token_ids`` of the input embedding (and of an untied output head) become random
    directions at the median row norm of the matrix; returns that norm."""
    gen = torch.Generator().manual_seed(seed)
    matrices = [model.get_input_embeddings().weight]
    head = model.get_output_embeddings()
    if head is not None and head.weight.data_ptr() != matrices[0].data_ptr():
        matrices.append(head.weight)
    norm = 0.0
    for weight in matrices:
        keep = torch.ones(weight.shape[0], dtype=torch.bool)
        keep[token_ids] = False
        norm = float(weight[keep].float().norm(dim=1).median())
        for tid in token_ids:
            row = torch.randn(weight.shape[1], generator=gen)
            weight[tid] = (row / row.norm() * norm).to(weight.dtype)
    return round(norm, 4)


def _reserved_rank(entry: Any) -> tuple[int, int] | None:
    """Where an added token stands among the reusable ones (pattern, number); None if it is not one."""
    content = entry.get("content") if isinstance(entry, dict) else None
    if not isinstance(content, str) or not isinstance(entry.get("id"), int):
        return None
    for rank, pattern in enumerate(RESERVED):
        if (m := pattern.fullmatch(content)) is not None:
            return rank, int(m.group(1))
    return None


def _reserved_token(raw: dict[str, Any]) -> dict[str, Any] | None:
    """The added token to rename to the end tag: the first reserved placeholder, None without one."""
    ranked = [(rank, t) for t in raw.get("added_tokens", []) if (rank := _reserved_rank(t)) is not None]
    return min(ranked, key=lambda pair: pair[0])[1] if ranked else None


def _rename(raw: dict[str, Any], entry: dict[str, Any]) -> None:
    """The added token ``entry`` becomes the end tag, special, matched verbatim, at the same id."""
    old = entry["content"]
    entry.update(content=END_TAG, special=True, normalized=False, lstrip=False, rstrip=False, single_word=False)
    vocab = raw.get("model", {}).get("vocab")
    if isinstance(vocab, dict) and old in vocab:
        vocab[END_TAG] = vocab.pop(old)
    elif isinstance(vocab, list) and 0 <= entry["id"] < len(vocab) and isinstance(vocab[entry["id"]], list):
        vocab[entry["id"]][0] = END_TAG  # a Unigram vocabulary: [piece, score] rows, indexed by id


def _load_json(path: Path) -> dict[str, Any]:
    if not path.exists():
        return {}
    data = json.loads(path.read_text(encoding="utf-8"))
    return data if isinstance(data, dict) else {}


def _tokenizer_config(path: Path, token_id: int, renamed: str | None) -> dict[str, Any]:
    cfg = _load_json(path)
    decoder = cfg.setdefault("added_tokens_decoder", {})
    decoder[str(token_id)] = {
        "content": END_TAG,
        "lstrip": False,
        "normalized": False,
        "rstrip": False,
        "single_word": False,
        "special": True,
    }
    # transformers 5 writes extra_special_tokens where 4.x wrote additional_special_tokens: a renamed
    # token left in either would come back as a new token past the embedding rows.
    if isinstance(cfg.get("extra_special_tokens"), list):
        cfg["extra_special_tokens"] = [t for t in cfg["extra_special_tokens"] if t != renamed]
    extra = [t for t in cfg.get("additional_special_tokens", []) if t != renamed]
    cfg["additional_special_tokens"] = [*extra, END_TAG] if END_TAG not in extra else extra
    return cfg


def _copy_side_files(base: Path, out: Path) -> None:
    for p in base.iterdir():
        if p.is_file() and p.name not in _REWRITTEN and not _WEIGHT_FILES.fullmatch(p.name):
            shutil.copy2(p, out / p.name)


def _stamp(out: Path) -> dict[str, tuple[int, int]]:
    return {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in out.iterdir() if p.is_file()}


def _readable(out: Path, before: dict[str, tuple[int, int]]) -> None:
    """Give every file this run wrote in ``out`` the mode a plain write gets (0644 under the usual
    umask 022). safetensors writes its weights through a private temporary file (0600) and
    ``copy2`` keeps the base's modes, so a vLLM server run as another user could not read them."""
    umask = os.umask(0)
    os.umask(umask)
    for name, stamp in _stamp(out).items():
        if before.get(name) != stamp and not (out / name).is_symlink():
            (out / name).chmod(0o666 & ~umask)


def add_end_tag(base: Path, out: Path, *, reuse_reserved: bool = True, seed: int = 0) -> dict[str, Any]:
    """Write ``out``: ``base`` with the end tag as a special token and its rows initialised."""
    from transformers import AutoModelForCausalLM

    if not (base / "tokenizer.json").exists() or not (base / "config.json").exists():
        raise DataError(f"{base} is not a model directory with tokenizer.json and config.json")
    if out.resolve() == base.resolve():
        raise DataError("--out must differ from --base")
    raw = _load_json(base / "tokenizer.json")
    tok = Tokenizer.from_file(str(base / "tokenizer.json"))
    existing = tok.token_to_id(END_TAG)
    renamed: str | None = None
    if existing is not None:
        method, token_id = "present", int(existing)
    elif reuse_reserved and (entry := _reserved_token(raw)) is not None:
        renamed = str(entry["content"])
        _rename(raw, entry)
        method, token_id = "reuse", int(entry["id"])
    else:
        tok.add_special_tokens([AddedToken(END_TAG, special=True, normalized=False)])
        raw = json.loads(tok.to_str())
        added = tok.token_to_id(END_TAG)
        if added is None:
            raise DataError("the tokenizer refused to add the end tag")
        method, token_id = "add", int(added)
    model: Any = AutoModelForCausalLM.from_pretrained(str(base), dtype="auto")
    rows_before = int(model.get_input_embeddings().weight.shape[0])
    if token_id >= rows_before:
        model.resize_token_embeddings(token_id + 1)
    norm = init_rows(model, [token_id], seed) if method != "present" else None
    out.mkdir(parents=True, exist_ok=True)
    before = _stamp(out)
    model.save_pretrained(str(out), safe_serialization=True)
    _copy_side_files(base, out)
    (out / "tokenizer.json").write_text(json.dumps(raw, ensure_ascii=False, indent=2), encoding="utf-8")
    cfg = _tokenizer_config(base / "tokenizer_config.json", token_id, renamed)
    (out / "tokenizer_config.json").write_text(json.dumps(cfg, ensure_ascii=False, indent=2), encoding="utf-8")
    specials = _load_json(base / "special_tokens_map.json")
    specials["additional_special_tokens"] = cfg["additional_special_tokens"]
    (out / "special_tokens_map.json").write_text(json.dumps(specials, ensure_ascii=False, indent=2), encoding="utf-8")
    check = Tokenizer.from_file(str(out / "tokenizer.json"))
    if check.token_to_id(END_TAG) != token_id or check.encode(END_TAG, add_special_tokens=False).ids != [token_id]:
        raise DataError("the written tokenizer does not encode the end tag as one special token")
    result = {
        "method": method,
        "end_tag": END_TAG,
        "end_tag_id": token_id,
        "renamed_token": renamed,
        "rows_before": rows_before,
        "rows_after": int(model.get_input_embeddings().weight.shape[0]),
        "row_norm": norm,
        "dtype": str(model.dtype).removeprefix("torch."),
    }
    write_manifest(out, "base-with-end-tag", base=base.name, **result)
    _readable(out, before)
    log.info("adapters.end_tag.done", **{k: v for k, v in result.items() if k != "end_tag"})
    return result
