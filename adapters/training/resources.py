"""What training costs the machine: the CUDA allocator's setting, peak memory, throughput.

Measured on one H100 with an 8B Llama-3-shaped base, a batch of 8 x 1,024 tokens peaked at 25.9 GiB
allocated but 59.9 GiB *reserved*: the caching allocator's fixed-size segments fragment as
sequence lengths vary. Expandable segments grow one mapping instead, so reserved stays near
allocated. With micro-batches of 1-2 (``LoraRecipe.micro_batch_size``) that measurement peaked at
18.5 GiB allocated, which leaves an 8B onboarding room on a 24 GiB card; the report's figures are
what to check there.
"""

from __future__ import annotations

import os
import resource
import sys
from collections.abc import MutableMapping
from typing import Any

import torch

ALLOC_ENV = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")  # torch reads both; the second is the newer name
DEFAULT_ALLOC_CONF = "expandable_segments:True"
GIB = 1024**3


def configure_cuda_allocator(environ: MutableMapping[str, str] | None = None) -> dict[str, str]:
    """Ask for expandable segments unless the user configured the allocator; say which applies.

    Must run before CUDA's caching allocator is first used (it reads the variable once): call it
    before the first tensor is put on the GPU.
    """
    env = os.environ if environ is None else environ
    for name in ALLOC_ENV:
        if env.get(name):
            return {"variable": name, "value": env[name], "source": "environment"}
    env[ALLOC_ENV[0]] = DEFAULT_ALLOC_CONF
    return {"variable": ALLOC_ENV[0], "value": DEFAULT_ALLOC_CONF, "source": "adapters default"}


def reset_peak_memory(device: str) -> None:
    """Start the peak GPU memory counters afresh (the CPU's peak RSS cannot be reset)."""
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats(device)


def peak_memory(device: str) -> dict[str, Any]:
    """Peak memory since :func:`reset_peak_memory`: GPU allocated and reserved, or the CPU's RSS.

    On CUDA, *allocated* is what tensors held at most, *reserved* what the caching allocator took
    from the card at most (what ``nvidia-smi`` shows, and what runs out). On CPU there is no such
    split: the process's peak resident set size over its whole life, model loading included.
    """
    if device.startswith("cuda"):
        props = torch.cuda.get_device_properties(device)
        return {
            "kind": "gpu",
            "device": props.name,
            "peak_allocated_gib": round(torch.cuda.max_memory_allocated(device) / GIB, 2),
            "peak_reserved_gib": round(torch.cuda.max_memory_reserved(device) / GIB, 2),
            "device_total_gib": round(props.total_memory / GIB, 2),
        }
    # ru_maxrss is in KiB on Linux, in bytes on macOS.
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * (1 if sys.platform == "darwin" else 1024)
    return {"kind": "cpu", "device": "cpu", "peak_rss_gib": round(rss / GIB, 3)}
