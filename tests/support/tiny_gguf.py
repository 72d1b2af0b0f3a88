"""A tiny random Gemma-3-shaped GGUF, written with the ``gguf`` package's writer, for import tests.

What llama.cpp's converter writes for Gemma 3, scaled down: the ``gemma3`` architecture keys
``transformers`` maps to a config, a sentencepiece-style (``tokenizer.ggml.model = llama``)
vocabulary whose control tokens include ``<unused0>``..``<unusedN>`` (llama.cpp marks Gemma's
``<unusedN>`` as CONTROL), no output head (Gemma ties it to the embeddings), and norm weights
stored with the +1 Gemma's RMSNorm applies at run time (``transformers`` subtracts it on load).
Tensors are float32: the GGUF reader's dequantisation is ``transformers``' and ``gguf``'s own code,
not this project's; what the import adds is everything around it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

CONTROL, NORMAL, UNKNOWN = 3, 1, 2  # llama.cpp token types
SPECIALS = ("<pad>", "<eos>", "<bos>", "<unk>", "<mask>")
START_OF_TURN, END_OF_TURN = "<start_of_turn>", "<end_of_turn>"


@dataclass(frozen=True, slots=True)
class TinyGemmaSpec:
    """Shape of the tiny model; the defaults give ~300 tokens and ~60k parameters."""

    vocab_size: int = 300
    unused: int = 10
    hidden_size: int = 64
    intermediate_size: int = 128
    layers: int = 2
    heads: int = 2
    kv_heads: int = 1
    head_dim: int = 32
    context: int = 512
    sliding_window: int = 64
    seed: int = 0


def _tokens(spec: TinyGemmaSpec) -> tuple[list[str], list[int]]:
    unused = [f"<unused{i}>" for i in range(spec.unused)]
    specials = [*SPECIALS, *unused, START_OF_TURN, END_OF_TURN]
    letters = [chr(c) for c in range(ord("a"), ord("z") + 1)]
    pieces = ["\u2581", *letters, *(f"\u2581{c}" for c in letters), *(a + b for a in "aeiou" for b in "nrst")]
    tokens = [*specials, *pieces]
    tokens += [f"\u2581w{i}" for i in range(len(tokens), spec.vocab_size)]
    types = [CONTROL] * len(specials) + [NORMAL] * (len(tokens) - len(specials))
    types[SPECIALS.index("<unk>")] = UNKNOWN
    return tokens[: spec.vocab_size], types[: spec.vocab_size]


def write_tiny_gemma3_gguf(
    path: Path,
    spec: TinyGemmaSpec | None = None,
    *,
    omit: frozenset[str] = frozenset(),
    transpose: frozenset[str] = frozenset(),
) -> Any:
    """Write the GGUF at ``path``; returns the random ``Gemma3ForCausalLM`` its tensors came from.

    ``omit`` and ``transpose`` name state-dict keys to leave out or to write with a wrong shape (a
    damaged or mislabelled file)."""
    import gguf
    import numpy as np
    import torch
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    spec = spec or TinyGemmaSpec()
    tokens, types = _tokens(spec)
    torch.manual_seed(spec.seed)
    config = Gemma3TextConfig(
        vocab_size=len(tokens),
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.layers,
        num_attention_heads=spec.heads,
        num_key_value_heads=spec.kv_heads,
        head_dim=spec.head_dim,
        max_position_embeddings=spec.context,
        sliding_window=spec.sliding_window,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=2,
    )
    model: Any = Gemma3ForCausalLM(config)
    model.eval()
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.GEMMA3, spec.layers)
    writer = gguf.GGUFWriter(str(path), "gemma3")
    writer.add_name("tiny-gemma3-test")
    writer.add_context_length(spec.context)
    writer.add_block_count(spec.layers)
    writer.add_embedding_length(spec.hidden_size)
    writer.add_feed_forward_length(spec.intermediate_size)
    writer.add_head_count(spec.heads)
    writer.add_head_count_kv(spec.kv_heads)
    writer.add_key_length(spec.head_dim)
    writer.add_value_length(spec.head_dim)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    rope: Any = config.rope_parameters
    writer.add_rope_freq_base(float(rope["full_attention"]["rope_theta"]))
    writer.add_sliding_window(spec.sliding_window)
    writer.add_tokenizer_model("llama")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_scores([0.0] * len(tokens))
    writer.add_token_types(types)
    writer.add_bos_token_id(2)
    writer.add_eos_token_id(1)
    writer.add_unk_token_id(3)
    writer.add_pad_token_id(0)
    for name, tensor in model.state_dict().items():
        if name == "lm_head.weight" or name in omit:  # tied: a Gemma GGUF has no output.weight
            continue
        stem, suffix = name.rsplit(".", 1)
        gguf_name = names.get_name(stem)
        if gguf_name is None:
            raise ValueError(f"no GGUF name for {name}")
        array = tensor.float().numpy()
        if "norm" in stem:
            array = array + 1.0
        if name in transpose:
            array = array.T.copy()
        writer.add_tensor(f"{gguf_name}.{suffix}", array.astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return model
