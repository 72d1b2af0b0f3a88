"""Token-level injection-safe encoding of transcripts, in the paper format or a chat template.

The scorers send vLLM token ids, never text. A prompt is built from *segments*
(:class:`sidecar.transcript.render.Segment`): trusted ones (headers, template markup the sidecar
itself writes) are encoded with special-token matching on, untrusted ones (message content) with
special-token matching **off** (``tokenizers``' ``encode_special_tokens``), so a user typing
``<|end_of_conversation|>`` or ``<|eot_id|>`` gets ordinary byte-level pieces, never the special
id. Every untrusted encoding is then checked: if a special id appears anyway, encoding fails with
:class:`UnsafeContentError` rather than sending the prompt. Text-level escaping
(:func:`sidecar.transcript.render.escape_content`) is applied as well, so the *text* of a prompt
(logs of a debugging session, a training file) cannot contain the strings either.

Segments are encoded one by one and concatenated. At a boundary this can differ from encoding the
joined text (a merge across the boundary is not made); the byte-level pre-tokenizer already splits
at the newline and space that end every header, so in practice the ids agree, and where they do
not the model still sees the same bytes.

Chat templates (for instruct models, paper Appendix B.3) are rendered with jinja2 in a sandbox.
Message contents are replaced by per-call random sentinels, the rendered text is split at the
sentinels into trusted markup and untrusted content, and the content is re-inserted as untrusted
segments: the template can never see (or mis-handle) the content itself. A *partial assistant
response* (paper Listing 2) is rendered as a final assistant message whose text is cut right after
its content, dropping the end-of-turn markup the template would add (what ``transformers`` calls
``continue_final_message``).
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer

from sidecar.errors import ConfigError, PermanentError
from sidecar.transcript.render import Segment, escape_content

# Marks the ids a capped message lost (see :func:`cap_ids`). Plain text, encoded as content.
ELISION = " [...] "


def cap_ids(ids: list[int], max_tokens: int | None, marker: Sequence[int]) -> list[int]:
    """At most ``max_tokens`` ids of one message: its head and tail around ``marker``.

    A cap on every message keeps the header of the last step inside any prompt window of more than
    ``max_tokens`` plus a header: a message, however long, can no longer push the real structure
    out of the window (and fill it with text of its own making). The head keeps how the message
    starts (a request is usually stated first), the tail how it ends (what a completion decision
    reads). Deterministic per message, so c_k's ids stay a prefix of c_{k+1}'s. Training and
    serving share this function.
    """
    if max_tokens is None or len(ids) <= max_tokens:
        return ids
    room = max_tokens - len(marker)
    if room < 2:
        raise ValueError(f"max_tokens {max_tokens} leaves no room beside the elision marker")
    head = room // 3
    return [*ids[:head], *marker, *ids[len(ids) - (room - head) :]]


class UnsafeContentError(PermanentError):
    """Untrusted content encoded to a special token id: the prompt is refused."""


@dataclass(frozen=True, slots=True)
class ChatMessage:
    """One chat-template message whose content is a run of trusted/untrusted segments."""

    role: str
    parts: tuple[Segment, ...]

    @classmethod
    def untrusted(cls, role: str, text: str) -> ChatMessage:
        return cls(role, (Segment(text, trusted=False),))

    @classmethod
    def trusted(cls, role: str, text: str) -> ChatMessage:
        return cls(role, (Segment(text, trusted=True),))


def _token_content(value: Any) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping) and isinstance(value.get("content"), str):
        return str(value["content"])
    return None


class SafeTokenizer:
    """A ``tokenizers`` tokenizer with separate trusted/untrusted encoding and a chat template."""

    def __init__(
        self,
        tokenizer_json: str,
        *,
        bos_token: str | None = None,
        eos_token: str | None = None,
        chat_template: str | None = None,
        extra_special: Iterable[str] = (),
    ) -> None:
        self._trusted = Tokenizer.from_str(tokenizer_json)
        self._untrusted = Tokenizer.from_str(tokenizer_json)
        self._untrusted.encode_special_tokens = True
        self.chat_template = chat_template
        added = self._trusted.get_added_tokens_decoder()
        specials = {tok.content: tid for tid, tok in added.items() if tok.special}
        for s in extra_special:
            tid = self._trusted.token_to_id(s)
            if tid is not None:
                specials[s] = tid
        self.special_ids: frozenset[int] = frozenset(specials.values())
        self.special_strings: tuple[str, ...] = tuple(sorted(specials, key=len, reverse=True))
        self.bos_token = bos_token
        self.eos_token = eos_token
        self.bos_id = self._single_id(bos_token) if bos_token else None
        self.eos_id = self._single_id(eos_token) if eos_token else None
        self._env: Any = None

    @classmethod
    def from_model_dir(cls, model_dir: Path, extra_special: Iterable[str] = ()) -> SafeTokenizer:
        """Load ``tokenizer.json`` and (optionally) ``tokenizer_config.json`` from a model dir."""
        tj = model_dir / "tokenizer.json"
        try:
            raw = tj.read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"cannot read {tj}: {exc.strerror}") from exc
        cfg: dict[str, Any] = {}
        cfg_path = model_dir / "tokenizer_config.json"
        if cfg_path.exists():
            cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
        template = cfg.get("chat_template")
        jinja = model_dir / "chat_template.jinja"
        if template is None and jinja.exists():
            template = jinja.read_text(encoding="utf-8")
        if isinstance(template, list):  # named templates: take "default"
            template = next((t.get("template") for t in template if t.get("name") == "default"), None)
        return cls(
            raw,
            bos_token=_token_content(cfg.get("bos_token")),
            eos_token=_token_content(cfg.get("eos_token")),
            chat_template=template if isinstance(template, str) else None,
            extra_special=extra_special,
        )

    def _single_id(self, token: str) -> int:
        tid = self._trusted.token_to_id(token)
        if tid is None:
            raise ConfigError(f"token {token!r} is not a single token of this tokenizer")
        return tid

    def token_id(self, token: str) -> int:
        """The id of a string that must be one token (the end tag, for instance)."""
        return self._single_id(token)

    @property
    def vocab_size(self) -> int:
        return int(self._trusted.get_vocab_size(with_added_tokens=True))

    def encode_trusted(self, text: str) -> list[int]:
        """Encode markup the sidecar wrote; special-token strings become their ids."""
        return list(self._trusted.encode(text, add_special_tokens=False).ids)

    def encode_untrusted(self, text: str) -> list[int]:
        """Encode message content: special strings stay plain text. Raises if a special id appears."""
        ids = list(self._untrusted.encode(text, add_special_tokens=False).ids)
        bad = self.special_ids.intersection(ids)
        if bad:
            raise UnsafeContentError(f"content encoded to special token ids {sorted(bad)}")
        return ids

    def encode_segments(
        self,
        segments: Sequence[Segment],
        *,
        add_bos: bool = True,
        specials_in_markup: bool = True,
        keep_last: int | None = None,
        max_content_tokens: int | None = None,
    ) -> list[int]:
        """Encode a rendered prompt; untrusted segments are also text-escaped first.

        ``max_content_tokens`` caps every untrusted segment (a message's content) with
        :func:`cap_ids`.

        ``specials_in_markup=False`` encodes the trusted segments with special-token matching off
        as well: the paper format needs no special token in its markup, so none can appear at all
        (this is also how the project's adapters tokenise their training text).

        ``keep_last=n`` returns the last ``n`` ids of the same encoding, encoding segments from the
        end only until ``n`` ids are known: the cost follows the window, not the conversation.
        """
        if keep_last is not None and keep_last <= 0:
            return []
        chunks: list[list[int]] = []
        have = 0
        for seg in reversed(segments):
            if keep_last is not None and have >= keep_last:
                break
            if not seg.text:
                continue
            ids = self._encode_segment(seg, specials_in_markup)
            if not seg.trusted and max_content_tokens is not None:
                ids = cap_ids(ids, max_content_tokens, self.encode_untrusted(ELISION))
            chunks.append(ids)
            have += len(ids)
        else:
            if add_bos and self.bos_id is not None:
                chunks.append([self.bos_id])
        out = [i for chunk in reversed(chunks) for i in chunk]
        return out if keep_last is None else out[-keep_last:]

    def _encode_segment(self, seg: Segment, specials_in_markup: bool) -> list[int]:
        if seg.trusted and specials_in_markup:
            return self.encode_trusted(seg.text)
        if seg.trusted:
            return self.encode_untrusted(seg.text)
        return self.encode_untrusted(escape_content(seg.text, self.special_strings))

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = False) -> str:
        return str(self._trusted.decode(list(ids), skip_special_tokens=skip_special_tokens))

    # -- chat templates ---------------------------------------------------------------------------

    def _jinja(self) -> Any:
        if self._env is None:

            def raise_exception(message: str) -> None:
                raise ConfigError(f"chat template error: {message}")

            env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
            env.globals["raise_exception"] = raise_exception
            env.globals["strftime_now"] = lambda _fmt: ""
            self._env = env
        return self._env

    def render_chat(
        self,
        messages: Sequence[ChatMessage],
        *,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
    ) -> list[Segment]:
        """Render a chat with the model's template as trusted/untrusted segments.

        ``continue_final_message``: the last message is a partial response to be continued, so the
        output ends right after its content (no generation prompt, no end-of-turn markup).
        """
        if self.chat_template is None:
            raise ConfigError("this tokenizer has no chat template")
        nonce = secrets.token_hex(8)
        sentinels = [f"\x02{nonce}:{i}\x03" for i in range(len(messages))]
        rendered = (
            self._jinja()
            .from_string(self.chat_template)
            .render(
                messages=[{"role": m.role, "content": s} for m, s in zip(messages, sentinels, strict=True)],
                add_generation_prompt=add_generation_prompt and not continue_final_message,
                continue_final_message=continue_final_message,
                bos_token=self.bos_token or "",
                eos_token=self.eos_token or "",
            )
        )
        if continue_final_message and messages:
            cut = rendered.rfind(sentinels[-1])
            if cut < 0:
                raise ConfigError("chat template dropped the final message")
            rendered = rendered[: cut + len(sentinels[-1])]
        out: list[Segment] = []
        pattern = re.compile("\x02" + nonce + r":(\d+)\x03")
        pos = 0
        for match in pattern.finditer(rendered):
            out.append(Segment(rendered[pos : match.start()], trusted=True))
            out.extend(messages[int(match.group(1))].parts)
            pos = match.end()
        out.append(Segment(rendered[pos:], trusted=True))
        return [s for s in out if s.text]

    def starts_with_bos(self, segments: Sequence[Segment]) -> bool:
        """Whether rendered segments already begin with the BOS string (chat templates add it)."""
        return bool(self.bos_token) and bool(segments) and segments[0].text.startswith(self.bos_token or "")
