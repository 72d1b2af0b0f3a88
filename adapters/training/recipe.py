"""The LoRA recipe: what ``train-lora`` and ``onboard`` train with (no torch import here)."""

from __future__ import annotations

from dataclasses import dataclass

TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True, slots=True)
class LoraRecipe:
    rank: int = 8
    alpha: int = 16
    dropout: float = 0.05
    epochs: float = 3.0
    learning_rate: float = 2e-4
    weight_decay: float = 0.01
    batch_size: int = 8
    max_context_tokens: int = 512
    seed: int = 0
    target_modules: tuple[str, ...] = TARGET_MODULES
    loss_on: str = "target"  # "target": r_n + end tag (paper); "conversation": every token; "decisions"
    decision_weight: float = 1.0  # loss weight of the tokens that open a block or are the end tag
    decision_windows: int = 0  # extra sequences per conversation that end at an earlier turn boundary
    forgery_windows: int = 0  # extra sequences per conversation whose user message pastes a finished dialogue
    max_message_tokens: int | None = None  # cap on each message's ids (the sidecar's scoring.max_message_tokens)
    window_stride: int = 0  # > 0: windows as the sidecar's 'stride' truncation cuts them (its prompt_stride_tokens)
    # Sequences per forward/backward pass; None = batch_size. Gradients of the micro-batches are
    # accumulated into one optimiser step of ``batch_size`` sequences: the same update, less memory.
    # A property of the machine, not of the adapter: onboarding neither inherits it nor retrains for it.
    micro_batch_size: int | None = None

    def __post_init__(self) -> None:
        check_micro_batch(self.batch_size, self.micro_batch_size)


def check_micro_batch(batch_size: int, micro_batch_size: int | None) -> int:
    """The micro-batch size in use (``batch_size`` when None); ValueError unless 1 <= micro <= batch."""
    for name, value in (("batch size", batch_size), ("micro-batch size", micro_batch_size)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ValueError(f"the {name} must be a whole number of at least 1, not {value!r}")
    if micro_batch_size is None:
        return batch_size
    if micro_batch_size > batch_size:
        raise ValueError(
            f"the micro-batch size ({micro_batch_size}) exceeds the batch size ({batch_size}): "
            "a micro-batch is a slice of one optimiser step's batch"
        )
    return micro_batch_size


LOSS_MODES = ("target", "conversation", "decisions")
