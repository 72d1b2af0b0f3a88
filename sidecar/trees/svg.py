"""Response tree -> SVG, left to right (the paper's Figure 2).

Each branch is a horizontal lane, its x axis the characters of the response from the root; a
child leaves its parent's lane where it splits off. Stroke width and opacity grow with the
probability mass a stretch carries (``exp(logprob)`` of the leaves below it), the most probable
branch (and the path to it) is drawn in the highlight colour, every leaf ends in a circle
(``class="leaf"``, filled when the branch reached an end of response) whose ``<title>`` holds the
whole response on hover and its numbers.

All text is untrusted model output: it is XML-escaped, characters XML cannot carry and invisible
or direction-changing ones (every format character, bidi overrides, zero-width, soft hyphen, tags,
line separators) are shown as ``\\uXXXX`` (``\\UXXXXXXXX`` above U+FFFF) instead, and every
text is cut, so the output size is bounded: at most :func:`max_svg_bytes` for the given limits,
whatever the input.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from sidecar.trees.shape import TreeShape, probability

# Shown as a visible escape instead of raw, so that text can neither break the XML nor hide or
# reorder what the reader sees:
# - XML 1.0 cannot carry C0 controls (bar tab and newline), surrogates, U+FFFE/U+FFFF;
# - every Unicode format character (category Cf: soft hyphen, bidi marks, embeddings, overrides and
#   isolates, zero-width and word joiners, BOM, interlinear annotation, the Arabic number signs,
#   the tag characters U+E0000-U+E007F that can carry a hidden text); the U+2060-U+206F and tag
#   blocks whole, so a format character assigned later in them is covered too;
# - C1 controls and the line and paragraph separators U+2028/U+2029 (Zl, Zp);
# - noncharacters (U+FDD0-U+FDEF and the last two code points of every plane);
# - characters that are invisible without being format characters: the combining grapheme joiner,
#   Hangul and Khmer fillers, Mongolian and other variation selectors (which can smuggle a text
#   after a visible character), VS15/VS16 (U+FE0E/U+FE0F) excepted, since emoji use them.
# tests/trees/test_escape.py checks this against the Unicode database of the running Python.
_NONCHARACTERS = "".join(f"{chr(plane * 0x10000 + 0xFFFE)}{chr(plane * 0x10000 + 0xFFFF)}" for plane in range(17))
_UNSAFE = re.compile(
    "[\x00-\x08\x0b-\x1f\x7f-\x9f\xad\u034f\u0600-\u0605\u061c\u06dd\u070f\u0890\u0891\u08e2"
    "\u115f\u1160\u17b4\u17b5\u180b-\u180f\u200b-\u200f\u2028-\u202e\u2060-\u206f\u3164"
    "\ud800-\udfff\ufdd0-\ufdef\ufe00-\ufe0d\ufeff\uffa0\ufff9-\ufffb"
    "\U000110bd\U000110cd\U00013430-\U0001343f\U0001bca0-\U0001bca3\U0001d173-\U0001d17a"
    "\U000e0000-\U000e007f\U000e0100-\U000e01ef" + re.escape(_NONCHARACTERS) + "]"
)
_XML = str.maketrans({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;"})
_SPACES = re.compile(r"\s+")
ELLIPSIS = "\u2026"


def neutralize(text: str) -> str:
    """``text`` with CR/CRLF as LF and every unsafe character as a visible ``\\uXXXX`` (``\\UXXXXXXXX``
    above U+FFFF)."""
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    return _UNSAFE.sub(_visible, text)


def _visible(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


def escape(text: str) -> str:
    """Safe inside XML/HTML text and double- or single-quoted attributes."""
    return neutralize(text).translate(_XML)


def clip(text: str, limit: int) -> str:
    """At most ``limit`` characters: the head and the tail around an ellipsis when cut."""
    if len(text) <= limit:
        return text
    if limit < 3:
        return text[:limit]
    head = (limit - 1) // 2
    return text[:head] + ELLIPSIS + text[len(text) - (limit - 1 - head) :]


def one_line(text: str, limit: int) -> str:
    """A visible label: whitespace collapsed, cut at the end."""
    flat = _SPACES.sub(" ", text).strip()
    return flat if len(flat) <= limit else flat[: max(0, limit - 1)] + ELLIPSIS


@dataclass(frozen=True, slots=True)
class SvgStyle:
    """Geometry and limits of the drawing.

    Sized to be read at 100 % zoom: text is ``font_size`` px (snippets ``snippet_font_size``), the
    plot is ``plot_width`` px wide for a short tree and grows (the page scrolls horizontally) when
    ``min_px_per_char`` would not fit the longest branch, rather than shrinking the drawing."""

    plot_width: int = 980
    max_px_per_char: float = 9.0
    min_px_per_char: float = 2.5
    row_height: int = 34
    margin: int = 16
    label_width: int = 200
    font_size: int = 13
    snippet_font_size: int = 12
    max_title_chars: int = 600
    max_label_chars: int = 40
    color: str = "#4a6b8a"
    highlight: str = "#d9480f"


# Markup per drawn branch beyond its texts (group, two paths, circle, numbers), generously rounded.
_PER_BRANCH_BYTES = 900
_FIXED_BYTES = 2048
_ESCAPED_CHAR_BYTES = 10  # the longest a character becomes: "\U000e0041" (else "&quot;", "\u202e", 4 UTF-8 bytes)


def max_svg_bytes(branches: int, style: SvgStyle = SvgStyle()) -> int:
    """Upper bound of :func:`render_svg`'s output size in UTF-8 bytes for ``branches`` drawn."""
    texts = style.max_title_chars + 2 * style.max_label_chars + 64
    return _FIXED_BYTES + branches * (_PER_BRANCH_BYTES + texts * _ESCAPED_CHAR_BYTES)


def _fmt(v: float) -> str:
    return f"{v:.1f}"


def _stroke(mass: float) -> tuple[str, str]:
    return f"{0.75 + 7.0 * mass:.2f}", f"{0.2 + 0.8 * mass:.2f}"


def render_svg(shape: TreeShape, style: SvgStyle = SvgStyle(), title: str = "response tree") -> str:
    """The tree as a standalone SVG document (also valid inline in HTML)."""
    rows = shape.rows()
    extent = max((b.start + b.length for b in shape.branches), default=0)
    scale = max(style.min_px_per_char, min(style.max_px_per_char, style.plot_width / max(1, extent)))
    lane_of = {b: r for r, b in enumerate(rows)}
    width = style.margin * 2 + max(style.plot_width, math.ceil(extent * scale) + 16) + style.label_width
    height = style.margin * 2 + style.row_height * max(1, len(rows)) + 8
    best = shape.best()
    path = shape.best_path()
    mass = shape.subtree_mass()

    def x(chars: int) -> float:
        return style.margin + chars * scale

    def y(row: int) -> float:
        return style.margin + style.row_height * row + style.row_height / 2

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="rtree" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" aria-label="{escape(clip(title, 200))}" '
        f'data-leaves="{shape.leaves}" font-family="sans-serif" font-size="{style.font_size}">',
        f"<title>{escape(clip(title, 200))}</title>",
    ]
    # The highlighted path last, so it is drawn on top of its siblings.
    for i in sorted(rows, key=lambda i: i in path):
        b = shape.branches[i]
        hot = i in path
        color = style.highlight if hot else style.color
        cls = "branch best" if i == best else ("branch on-best-path" if hot else "branch")
        yb = y(lane_of[i])
        p = probability(b.logprob)
        lp = "-inf" if math.isinf(b.logprob) else f"{b.logprob:.3f}"
        state = "complete" if b.complete else f"truncated ({b.truncated})" if b.truncated else "open"
        full = shape.full_text(i)
        tip = f"branch {i}: logprob {lp}, p {p:.4f}, {state}"
        if full is not None:
            tip += "\n" + clip(full, style.max_title_chars)
        out.append(f'<g class="{cls}" data-branch="{i}" data-logprob="{lp}"><title>{escape(tip)}</title>')
        if b.parent is not None:
            py = y(lane_of[b.parent])
            x0 = x(b.start)
            w, o = _stroke(mass[i])
            out.append(
                f'<path d="M{_fmt(x0)} {_fmt(py)} C{_fmt(x0 + 6)} {_fmt(py)} {_fmt(x0)} {_fmt(yb)} '
                f'{_fmt(x0 + 8)} {_fmt(yb)}" fill="none" stroke="{color}" stroke-width="{w}" stroke-opacity="{o}"/>'
            )
        for a, z, m in shape.segments(i, mass):
            xa = x(a) + (8 if b.parent is not None and a == b.start else 0)
            xz = max(x(z), xa + 4)
            w, o = _stroke(m)
            out.append(
                f'<path d="M{_fmt(xa)} {_fmt(yb)} H{_fmt(xz)}" stroke="{color}" stroke-width="{w}" '
                f'stroke-opacity="{o}" stroke-linecap="round"/>'
            )
        end = max(x(b.start + b.length), x(b.start) + (12 if b.parent is not None else 4))
        fill = color if b.complete else "#ffffff"
        out.append(
            f'<circle class="leaf" cx="{_fmt(end)}" cy="{_fmt(yb)}" r="3.5" fill="{fill}" stroke="{color}" '
            f'stroke-width="1.2"/>'
        )
        label = f"{lp}  p={p:.3f}" if p >= 0.001 else f"{lp}"
        out.append(f'<text x="{_fmt(end + 7)}" y="{_fmt(yb + style.font_size / 3)}" fill="#333">{escape(label)}</text>')
        if b.text:
            snippet = one_line(b.text, style.max_label_chars)
            out.append(
                f'<text class="snippet" x="{_fmt(x(b.start) + 10)}" y="{_fmt(yb - 6)}" fill="#555" '
                f'font-size="{style.snippet_font_size}">{escape(snippet)}</text>'
            )
        out.append("</g>")
    if shape.dropped:
        out.append(
            f'<text x="{style.margin}" y="{height - 4}" fill="#a00">{shape.dropped} more branches not drawn</text>'
        )
    out.append("</svg>")
    return "".join(out)
