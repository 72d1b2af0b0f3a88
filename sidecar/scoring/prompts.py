"""Token-id prompts for the scorers, built injection-safe from a conversation prefix.

* Completion, adapter variant: ``render(c_k)`` in the paper format, every segment encoded with
  special-token matching off (what the project's adapters are trained on: input = render(p_1, r_1,
  ..., p_n), target = r_n + end tag; no BOS unless ``paper_bos``). The next token is the
  end tag iff the model thinks the conversation is over.
* Completion, instruct variant (paper Appendix B.2, for agents without an adapter): the rendered
  transcript as one user message followed by the instruction, then the assistant's (empty)
  response, through the model's chat template; without a template, the same in the paper format
  (``TURN i, STEP j, user chat:`` instruction, then an assistant header).
* Response tree (Appendix B.3): the conversation up to the user message plus a partial assistant
  response (Listing 2): the chat template with a final assistant message to be continued, or the
  paper format with the next ``assistant chat:`` header.

Long conversations keep their preamble (system prompt) and drop whole turns from the front until
the prompt fits ``max_prompt_tokens``; the most recent turn is never dropped (the request then
fails as a permanent ``prompt_too_long`` error instead).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from sidecar.transcript.model import Message
from sidecar.transcript.render import Segment, next_step_header, render_segments
from sidecar.transcript.tokenize import ChatMessage, SafeTokenizer


class PromptTooLong(ValueError):
    """Even the last turn alone does not fit the prompt budget."""


def _turn_starts(messages: Sequence[Message]) -> list[int]:
    return [i for i, m in enumerate(messages) if m.role == "user"]


def fit(
    messages: Sequence[Message],
    build: Callable[[Sequence[Message]], list[int]],
    max_tokens: int,
) -> tuple[list[int], int]:
    """Encode with ``build`` and make it fit ``max_tokens``; returns (ids, turns dropped).

    The oldest turns are dropped (the preamble is kept) until it fits: the fewest turns that make
    it fit, found by bisection (a prompt's length falls as turns are dropped), so a conversation of
    n turns costs O(log n) encodings, not n.
    """
    ids = build(messages)
    if len(ids) <= max_tokens:
        return ids, 0
    starts = _turn_starts(messages)
    head = list(messages[: starts[0]]) if starts else []
    best: tuple[list[int], int] | None = None
    lo, hi = 1, len(starts) - 1
    while lo <= hi:
        mid = (lo + hi) // 2
        ids = build(head + list(messages[starts[mid] :]))
        if len(ids) <= max_tokens:
            best, hi = (ids, mid), mid - 1
        else:
            lo = mid + 1
    if best is None:
        raise PromptTooLong(f"prompt of {len(ids)} tokens exceeds {max_tokens} even with one turn")
    return best


class PromptBuilder:
    """Builds the three prompt kinds for one tokenizer."""

    def __init__(
        self,
        tokenizer: SafeTokenizer,
        *,
        end_tag: str,
        instruct_prompt: str,
        use_chat_template: bool = True,
        max_prompt_tokens: int = 1900,
        paper_bos: bool = False,
        tree_use_chat_template: bool = True,
        tail_truncation: bool = False,
        max_message_tokens: int | None = None,
        stride_tokens: int | None = None,
    ) -> None:
        self.tok = tokenizer
        self.end_tag = end_tag
        self.instruct_prompt = instruct_prompt
        self.use_chat = use_chat_template and tokenizer.chat_template is not None
        self.tree_chat = tree_use_chat_template and tokenizer.chat_template is not None
        self.max_prompt_tokens = max_prompt_tokens
        self.paper_bos = paper_bos
        self.tail = tail_truncation
        if stride_tokens is not None and not 0 < stride_tokens < max_prompt_tokens:
            raise ValueError("stride_tokens must be between 1 and max_prompt_tokens - 1")
        self.stride = stride_tokens if tail_truncation else None
        self.max_message_tokens = max_message_tokens
        self.forbidden = (*tokenizer.special_strings, end_tag)

    def _window(self, messages: Sequence[Message], tail: Sequence[Segment] = ()) -> list[int]:
        """The tail window of the whole rendering: the last ``max_prompt_tokens`` ids, or with a
        stride, the ids from the last multiple of ``stride`` that leaves at most that many.

        A stride window starts at the same absolute position for ``stride`` ids of growth, so the
        prompts of successive turns share their prefix and the server's prefix cache keeps it;
        the window is between ``max_prompt_tokens - stride`` and ``max_prompt_tokens`` ids long.
        It needs the length of the whole rendering: every segment is encoded (as ``turns`` does).
        """
        if self.stride is None:
            return self._paper(messages, tail, keep_last=self.max_prompt_tokens)
        ids = self._paper(messages, tail)
        over = len(ids) - self.max_prompt_tokens
        start = 0 if over <= 0 else -(-over // self.stride) * self.stride
        return ids[start:]

    def _paper(
        self, messages: Sequence[Message], tail: Sequence[Segment] = (), *, keep_last: int | None = None
    ) -> list[int]:
        segments = render_segments(messages, self.forbidden) + list(tail)
        return self.tok.encode_segments(
            segments,
            add_bos=self.paper_bos,
            specials_in_markup=False,
            keep_last=keep_last,
            max_content_tokens=self.max_message_tokens,
        )

    def _chat(self, chat: Sequence[ChatMessage], *, partial: bool) -> list[int]:
        segments = self.tok.render_chat(chat, add_generation_prompt=not partial, continue_final_message=partial)
        return self.tok.encode_segments(segments, add_bos=not self.tok.starts_with_bos(segments))

    def completion_adapter(self, messages: Sequence[Message]) -> tuple[list[int], int]:
        """``render(c_k)``: the adapter's training input format.

        With ``tail`` the prompt is the last ``max_prompt_tokens`` ids of the whole rendering, no
        turn dropped: the window the project's adapters are trained on (ids of the full rendering,
        left-truncated). Dropping turns would renumber them (``TURN 1`` again) and start the window
        at a block header, a text the adapter never saw in training.
        """
        if self.tail:
            return self._window(messages), 0
        return fit(messages, self._paper, self.max_prompt_tokens)

    def completion_instruct(self, messages: Sequence[Message]) -> tuple[list[int], int]:
        """Appendix B.2: transcript + instruction as a user message; the assistant answers."""

        def build(msgs: Sequence[Message]) -> list[int]:
            transcript = render_segments(msgs, self.forbidden)
            if self.use_chat:
                user = ChatMessage("user", (*transcript, Segment(self.instruct_prompt, trusted=True)))
                return self._chat([user, ChatMessage.trusted("assistant", "")], partial=True)
            instr = Message("user", self.instruct_prompt)
            head = next_step_header(msgs, "user")
            tail = [
                Segment(head, trusted=True),
                Segment(self.instruct_prompt, trusted=True),
                Segment("\n\n" + next_step_header([*msgs, instr], "assistant"), trusted=True),
            ]
            return self._paper(msgs, tail)

        return fit(messages, build, self.max_prompt_tokens)

    def tree(self, messages: Sequence[Message], assistant_prefix: str = "") -> tuple[list[int], int]:
        """The conversation so far plus a partial assistant response (paper Listing 2)."""

        def paper_tail(msgs: Sequence[Message]) -> list[Segment]:
            tail = [Segment(next_step_header(msgs, "assistant"), trusted=True)]
            if assistant_prefix:
                tail.append(Segment(assistant_prefix, trusted=False))
            return tail

        def build(msgs: Sequence[Message]) -> list[int]:
            if self.tree_chat:
                chat = [ChatMessage.untrusted(m.role, _chat_content(m)) for m in msgs]
                chat.append(ChatMessage.untrusted("assistant", assistant_prefix))
                return self._chat(chat, partial=True)
            return self._paper(msgs, paper_tail(msgs))

        if self.tail and not self.tree_chat:
            return self._window(messages, paper_tail(messages)), 0
        return fit(messages, build, self.max_prompt_tokens)


def _chat_content(m: Message) -> str:
    if not m.tool_calls:
        return m.content
    calls = "; ".join(f"{c.name}({c.arguments})" for c in m.tool_calls)
    return (m.content + "\n" if m.content else "") + "TOOL CALLS: " + calls
