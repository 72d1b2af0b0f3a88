"""Trees for the renderer and view tests: degenerate shapes and hostile text."""

from __future__ import annotations

import random

from sidecar.contract import TreeBranch

HOSTILE = (
    "<script>alert(1)</script>",
    "]]><![CDATA[ x ]]>",
    "\"quotes\" & 'apostrophes' &amp; &#x3c;",
    "".join(chr(i) for i in range(32)) + "\x7f\x85",
    "\u202eevil\u202c \u2066isolate\u2069 \u200bzero\ufeffbom",
    "\ud800 lone surrogate \udfff",
    "\ufffe\uffff non-characters",
    "</svg></div><img src=x onerror=alert(1)>",
    "x" * 10_000,
)


def one_leaf(text: str = "Sure, I can book that.") -> list[TreeBranch]:
    return [TreeBranch(None, 0, text, -0.2, True, None)]


def budget_truncated() -> list[TreeBranch]:
    """A tree whose expansion ran out of budget: branches cut before they ended."""
    return [
        TreeBranch(None, 0, "Let me check the", -1.1, False, "budget"),
        TreeBranch(0, 4, " see what", -1.9, False, "budget"),
        TreeBranch(0, 11, " look", -2.2, False, "budget"),
        TreeBranch(1, 9, " I", -2.3, False, "depth"),
    ]


def many_leaves(n: int = 200, seed: int = 7, text: str | None = None) -> list[TreeBranch]:
    """``n`` branches with random parents and split points (parents always earlier)."""
    rng = random.Random(seed)
    spans: list[tuple[int, int]] = []
    out: list[TreeBranch] = []
    for i in range(n):
        own = text if text is not None else f"option {i} " + "w" * rng.randint(0, 30)
        if i == 0:
            out.append(TreeBranch(None, 0, own, -0.5, True, None))
            spans.append((0, len(own)))
            continue
        parent = rng.randrange(i)
        start, length = spans[parent]
        split = rng.randint(start, start + length)
        lp = -rng.uniform(0.5, 12.0)
        out.append(TreeBranch(parent, split, own, lp, rng.random() < 0.6, None if rng.random() < 0.6 else "depth"))
        spans.append((split, len(own)))
    return out


def empty_texts() -> list[TreeBranch]:
    return [
        TreeBranch(None, 0, "", -0.3, True, None),
        TreeBranch(0, 0, "", -1.5, True, None),
        TreeBranch(0, 0, "", -2.5, False, "depth"),
    ]


def hostile(n_extra: int = 0) -> list[TreeBranch]:
    out = [TreeBranch(None, 0, HOSTILE[0], -0.7, True, None)]
    for i, t in enumerate(HOSTILE[1:] + tuple("y" * 10_000 for _ in range(n_extra))):
        out.append(TreeBranch(i % 2 * (i // 2), (i * 3) % 20, t, -1.0 - i, i % 2 == 0, None))
    return out
