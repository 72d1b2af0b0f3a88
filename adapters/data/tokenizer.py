"""The byte-level BPE tokenizer and THE tokenisation of rendered transcripts.

Special tokens (each one id, never produced from message content):

- ``<|begin_of_text|>`` (bos), ``<|end_of_text|>`` (eos), ``<|pad|>``,
- ``<|end_of_conversation|>``: the end tag the completion adapter predicts.

Tokenisation is *segment-wise*: the renderer yields trusted segments (step headers, block
separators) and untrusted segments (message content, already escaped at text level); each segment
is encoded on its own and the ids are concatenated. Two reasons:

1. Token-level injection safety: content is encoded with special-token matching disabled, so no
   content can ever become a special id, whatever the text-level escaping misses.
2. Prefix stability: a byte-level pre-tokenizer splits ``"\\n\\n"`` differently at the end of a
   text than before ``"TURN"``. Encoding the whole rendered text at once would give the final
   block separator of a *prompt* c_k different ids from the same separator inside the training
   text, leaking "this is the end of the text" to the model. Encoded per segment, the ids of
   c_k are exactly a prefix of the ids of any longer conversation.

:func:`encode_messages` is the single function to swap for ``sidecar.transcript`` tokenisation if
the sidecar provides one with the same contract.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from sidecar.transcript.model import Message
from sidecar.transcript.render import render_segments
from sidecar.transcript.tokenize import ELISION, cap_ids

BOS = "<|begin_of_text|>"
EOS = "<|end_of_text|>"
PAD = "<|pad|>"
END_TAG = "<|end_of_conversation|>"
SPECIAL_TOKENS: tuple[str, ...] = (BOS, EOS, PAD, END_TAG)


def train_tokenizer(texts: Iterable[str], vocab_size: int, special_tokens: Sequence[str] = SPECIAL_TOKENS) -> Tokenizer:
    """Train a byte-level BPE on ``texts``; the special tokens get the first ids, in order."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(special_tokens),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def save_tokenizer(tok: Tokenizer, out_dir: Path, model_max_length: int) -> None:
    """Write ``tokenizer.json`` plus the transformers config files vLLM and HF read."""
    out_dir.mkdir(parents=True, exist_ok=True)
    tok.save(str(out_dir / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        "eos_token": EOS,
        "pad_token": PAD,
        "additional_special_tokens": [END_TAG],
        "model_max_length": model_max_length,
        "clean_up_tokenization_spaces": False,
        "add_bos_token": False,
        "add_eos_token": False,
    }
    (out_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    specials = {"bos_token": BOS, "eos_token": EOS, "pad_token": PAD, "additional_special_tokens": [END_TAG]}
    (out_dir / "special_tokens_map.json").write_text(json.dumps(specials, indent=2) + "\n")


def load_tokenizer(model_dir: Path) -> Tokenizer:
    """Load ``tokenizer.json`` from a model directory."""
    return Tokenizer.from_file(str(Path(model_dir) / "tokenizer.json"))


def special_id(tok: Tokenizer, token: str) -> int:
    """The id of a special token; raises if the tokenizer lacks it."""
    tid = tok.token_to_id(token)
    if tid is None:
        raise KeyError(f"tokenizer has no token {token!r}")
    return int(tid)


def padding_id(tok: Tokenizer, model_dir: Path) -> int:
    """An id to pad batches with (never attended to, never in the loss).

    ``<|pad|>`` when the tokenizer has it (the project's own models); else the pad or eos token of
    ``tokenizer_config.json`` (a stock base such as Llama 3 has no pad token); else id 0.
    """
    if tok.token_to_id(PAD) is not None:
        return special_id(tok, PAD)
    try:
        config = json.loads((Path(model_dir) / "tokenizer_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        config = {}
    for key in ("pad_token", "eos_token"):
        value = config.get(key) if isinstance(config, dict) else None
        if isinstance(value, dict):
            value = value.get("content")
        tid = tok.token_to_id(value) if isinstance(value, str) else None
        if tid is not None:
            return int(tid)
    return 0


def encode_plain(tok: Tokenizer, text: str) -> list[int]:
    """Encode untrusted text: special-token strings inside it are ordinary bytes."""
    tok.encode_special_tokens = True
    try:
        return list(tok.encode(text, add_special_tokens=False).ids)
    finally:
        tok.encode_special_tokens = False


def encode_messages(tok: Tokenizer, messages: Sequence[Message], max_message_tokens: int | None = None) -> list[int]:
    """Token ids of ``render_text(messages)``, segment-wise (see the module docstring).

    ``max_message_tokens`` caps each message's content with the sidecar's own
    :func:`sidecar.transcript.tokenize.cap_ids` (``scoring.max_message_tokens`` when served).
    """
    return encode_messages_with_offsets(tok, messages, max_message_tokens)[0]


def encode_messages_with_offsets(
    tok: Tokenizer, messages: Sequence[Message], max_message_tokens: int | None = None
) -> tuple[list[int], list[int]]:
    """Like :func:`encode_messages`, also returning the id offset where each message's block starts."""
    ids: list[int] = []
    starts: list[int] = []
    marker = encode_plain(tok, ELISION) if max_message_tokens is not None else []
    for i, seg in enumerate(render_segments(messages, forbidden=SPECIAL_TOKENS)):
        if i % 3 == 0:  # header, content, separator per message
            starts.append(len(ids))
        piece = encode_plain(tok, seg.text)
        ids.extend(cap_ids(piece, max_message_tokens, marker) if not seg.trusted else piece)
    return ids, starts
