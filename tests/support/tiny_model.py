"""A tiny random-weights Llama, its tokenizer and a LoRA adapter, for protocol tests on real vLLM.

The model knows nothing: its answers are nonsense by design. What it gives the suite is a real
Llama-architecture checkpoint that vLLM's CPU build loads in seconds, with the special tokens the
sidecar relies on (``<|begin_of_text|>``, ``<|end_of_text|>`` = eos, ``<|end_of_conversation|>`` =
the completion end tag, ``<|pad|>``, and Llama-3-style chat header tokens), a chat template, and a
peft LoRA adapter (``r=8`` on ``q_proj``/``v_proj``) with non-zero weights, so that the adapter's
distribution really differs from the base model's.

The output layer is scaled up (``LOGIT_SCALE``) so next-token distributions are peaked rather than
uniform over the vocabulary: response trees then have a handful of branches at alpha in
0.05..0.2, which is what the tree tests need (a uniform model would give single-branch trees).
The rows of the end tokens (eos, end tag, eot) are scaled further (``END_SCALE``) so that
responses sometimes end and the end tag is sometimes the greedy next token.

Everything is deterministic for a given seed. Building needs ``torch``, ``transformers``, ``peft``
and ``tokenizers`` (the ``adapters`` extra); run it in a subprocess (``python -m
tests.support.tiny_model ROOT``) so that torch's import-time warnings and memory stay out of the
test process.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

BOS = "<|begin_of_text|>"
EOS = "<|end_of_text|>"
END_TAG = "<|end_of_conversation|>"
PAD = "<|pad|>"
HEADER_START = "<|start_header_id|>"
HEADER_END = "<|end_header_id|>"
EOT = "<|eot_id|>"
SPECIAL_TOKENS: tuple[str, ...] = (BOS, EOS, END_TAG, PAD, HEADER_START, HEADER_END, EOT)

VOCAB_SIZE = 512
HIDDEN_SIZE = 128
LOGIT_SCALE = 6.0
END_SCALE = 2.5

# Llama-3 shaped, minus the date lines: the header tokens around the role, content, <|eot_id|>.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + message['content'] }}"
    "{% if not (loop.last and continue_final_message) %}{{ '<|eot_id|>' }}{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)

# A few lines in the shape of the text the sidecar renders, so BPE merges cover it.
_CORPUS = [
    "TURN 1, STEP 1, user chat:\nI need a table for two tonight, somewhere quiet near the river.",
    "TURN 1, STEP 2, assistant chat:\nSure, which area of town would you like, and at what time?",
    "TURN 2, STEP 3, user chat:\nThe centre please, around 7pm. Can you also book a taxi?",
    'TURN 2, STEP 4, assistant action:\nTOOL CALLS: [{"name": "find_restaurant", "arguments": "{\\"people\\": 2}"}]',
    'TURN 2, STEP 5, tool (find_restaurant) chat:\n{"name": "The Riverside", "phone": "01223 356354"}',
    "I have booked it. Your reference number is 7GAWK763. Is there anything else I can help with?",
    "No, that is all, thank you. Goodbye!",
    "Concisely summarize the remaining tasks. If there are no more tasks, output <end of system logs>.",
    "The remaining tasks are: book a train to Cambridge on Friday and find a hotel with free parking.",
    "What is the weather like? Please change my flight to the later one and add a checked bag.",
]


@dataclass(frozen=True, slots=True)
class TinyModel:
    """Paths of a built tiny model: the base model dir (tokenizer included) and the adapter dir."""

    model_dir: Path
    adapter_dir: Path
    tokenizer_path: Path


def build_tokenizer(out_dir: Path) -> Path:
    """Train a byte-level BPE on the built-in corpus and save it with ``transformers``."""
    # Imported lazily (here and below): the pytest plugin imports this module for its constants.
    from adapters.data.tokenizer import train_tokenizer

    tok = train_tokenizer(_CORPUS * 4, VOCAB_SIZE, special_tokens=SPECIAL_TOKENS)
    tok.save(str(out_dir / "tokenizer.json"))
    # Written by hand rather than by ``transformers`` so the files do not depend on the writer's
    # version: the vLLM venv may carry another ``transformers`` than the project's.
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        "eos_token": EOS,
        "pad_token": PAD,
        "additional_special_tokens": [END_TAG, HEADER_START, HEADER_END, EOT],
        "model_max_length": 2048,
        "clean_up_tokenization_spaces": False,
        "chat_template": CHAT_TEMPLATE,
    }
    (out_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
    specials = {
        "bos_token": BOS,
        "eos_token": EOS,
        "pad_token": PAD,
        "additional_special_tokens": [END_TAG, HEADER_START, HEADER_END, EOT],
    }
    (out_dir / "special_tokens_map.json").write_text(json.dumps(specials, indent=2), encoding="utf-8")
    return out_dir / "tokenizer.json"


def build_tiny_model(root: Path, seed: int = 0) -> TinyModel:
    """Build (or reuse, if complete) the tiny model and its adapter under ``root``."""
    model_dir = root / "tiny-llama"
    adapter_dir = root / "tiny-lora"
    done = root / "BUILT"
    if done.exists():
        return TinyModel(model_dir, adapter_dir, model_dir / "tokenizer.json")

    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    model_dir.mkdir(parents=True, exist_ok=True)
    tokenizer_path = build_tokenizer(model_dir)
    vocab = len(json.loads(tokenizer_path.read_text(encoding="utf-8"))["model"]["vocab"])
    specials = len(SPECIAL_TOKENS)
    config = LlamaConfig(
        vocab_size=max(vocab + specials, VOCAB_SIZE),
        hidden_size=HIDDEN_SIZE,
        intermediate_size=2 * HIDDEN_SIZE,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        bos_token_id=0,
        eos_token_id=1,
        pad_token_id=3,
    )
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        model.lm_head.weight.mul_(LOGIT_SCALE / config.initializer_range / HIDDEN_SIZE**0.5)
        # Ends become plausible: some branches finish within a few dozen tokens, and the end tag is
        # sometimes the greedy next token (both completion verdicts occur).
        for token_id in (1, 2, 6):  # EOS, END_TAG, EOT
            model.lm_head.weight[token_id].mul_(END_SCALE)
    model.save_pretrained(str(model_dir), safe_serialization=True)

    lora = LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    peft_model = get_peft_model(model, lora)
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_" in name:
                param.normal_(0.0, 0.5)
    peft_model.save_pretrained(str(adapter_dir))
    done.write_text("ok\n", encoding="utf-8")
    return TinyModel(model_dir, adapter_dir, tokenizer_path)


def main(argv: list[str] | None = None) -> int:
    """``python -m tests.support.tiny_model ROOT``: build under ROOT, print the paths as JSON."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m tests.support.tiny_model ROOT", file=sys.stderr)
        return 2
    built = build_tiny_model(Path(args[0]))
    print(json.dumps({k: str(getattr(built, k)) for k in ("model_dir", "adapter_dir", "tokenizer_path")}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
