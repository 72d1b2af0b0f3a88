"""The renderer: degenerate trees, hostile text, bounded output, well-formed SVG for any input."""

from __future__ import annotations

import math
import xml.etree.ElementTree as ET

from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.contract import TreeBranch
from sidecar.trees.shape import build_shape
from sidecar.trees.svg import SvgStyle, clip, escape, max_svg_bytes, render_svg
from tests.trees import trees

SVG = "{http://www.w3.org/2000/svg}"


def parse(svg: str) -> ET.Element:
    return ET.fromstring(svg.encode("utf-8"))


def leaves(root: ET.Element) -> list[ET.Element]:
    return [c for c in root.iter(f"{SVG}circle") if c.get("class") == "leaf"]


def render(branches: list[TreeBranch], *, text: bool = True, style: SvgStyle | None = None) -> ET.Element:
    shape = build_shape(branches, keep_text=text)
    svg = render_svg(shape, style or SvgStyle())
    assert len(svg.encode()) <= max_svg_bytes(len(shape.branches), style or SvgStyle())
    root = parse(svg)
    assert root.get("data-leaves") == str(len(branches))
    return root


def test_one_leaf() -> None:
    root = render(trees.one_leaf())
    [leaf] = leaves(root)
    [group] = [g for g in root.iter(f"{SVG}g") if "branch" in (g.get("class") or "")]
    assert group.get("class") == "branch best"
    title = group.find(f"{SVG}title")
    assert title is not None and "Sure, I can book that." in (title.text or "")
    assert leaf.get("fill") != "#ffffff"  # complete: filled


def test_budget_truncated_tree_draws_open_leaves_and_best_partial() -> None:
    root = render(trees.budget_truncated())
    assert len(leaves(root)) == 4
    assert all(c.get("fill") == "#ffffff" for c in leaves(root))  # none reached an end
    best = [g for g in root.iter(f"{SVG}g") if g.get("class") == "branch best"]
    assert [g.get("data-branch") for g in best] == ["0"]  # most probable partial branch
    titles = " ".join(t.text or "" for t in root.iter(f"{SVG}title"))
    assert "truncated (budget)" in titles and "truncated (depth)" in titles


def test_two_hundred_leaves() -> None:
    branches = trees.many_leaves(200)
    root = render(branches)
    assert len(leaves(root)) == 200
    # the most probable complete branch and its ancestors are highlighted, nothing else
    shape = build_shape(branches, keep_text=True)
    hot = {
        int(g.get("data-branch") or -1)
        for g in root.iter(f"{SVG}g")
        if g.get("class") in ("branch best", "branch on-best-path")
    }
    assert hot == shape.best_path()
    best = shape.branches[shape.best() or 0]
    assert best.complete and best.logprob == max(b.logprob for b in shape.branches if b.complete)
    # lanes: one row per branch, all inside the canvas
    height = float(root.get("height") or 0)
    assert all(0 < float(c.get("cy") or -1) < height for c in leaves(root))


def test_empty_texts_still_draw_every_branch() -> None:
    root = render(trees.empty_texts())
    assert len(leaves(root)) == 3
    width = float(root.get("width") or 0)
    assert all(0 <= float(c.get("cx") or -1) <= width for c in leaves(root))


def test_hostile_text_is_escaped_and_visible() -> None:
    branches = trees.hostile()
    svg = render_svg(build_shape(branches, keep_text=True))
    root = parse(svg)  # well-formed despite everything
    assert len(leaves(root)) == len(branches)
    assert "<script" not in svg and "<img" not in svg and "]]>" not in svg
    for bad in ("\u202e", "\u2066", "\u200b", "\ufeff", "\x00", "\x1b", "\ud800", "\ufffe"):
        assert bad not in svg
    assert "\\u202e" in svg and "\\u0000" in svg  # shown, not silently dropped
    titles = " ".join(t.text or "" for t in root.iter(f"{SVG}title"))
    assert "<script>alert(1)</script>" in titles  # as text, after unescaping by the parser


def test_text_is_bounded_per_branch_and_in_all() -> None:
    style = SvgStyle()
    branches = trees.many_leaves(200, text="z" * 10_000)
    shape = build_shape(branches, keep_text=True)
    svg = render_svg(shape, style)
    assert len(svg.encode()) <= max_svg_bytes(200, style) < 2_500_000
    for t in parse(svg).iter(f"{SVG}title"):
        assert len(t.text or "") <= style.max_title_chars + 80
    capped = build_shape(branches, keep_text=True, max_text_chars=100, max_total_text_chars=1000)
    assert sum(len(b.text or "") for b in capped.branches) == 1000
    assert [b.length for b in capped.branches] == [b.length for b in shape.branches]  # the shape is kept


def test_numbers_only_when_text_is_not_kept() -> None:
    branches = trees.hostile()
    svg = render_svg(build_shape(branches, keep_text=False))
    root = parse(svg)
    assert len(leaves(root)) == len(branches)
    assert "script" not in svg and "xxxxx" not in svg and 'class="snippet"' not in svg
    assert "logprob -0.700" in svg


def test_branch_cap_reports_what_is_not_drawn() -> None:
    branches = trees.many_leaves(300)
    shape = build_shape(branches, keep_text=False, max_branches=100)
    svg = render_svg(shape)
    assert len(leaves(parse(svg))) == 100 and shape.dropped == 200
    assert "200 more branches not drawn" in svg


def test_stroke_follows_probability_mass() -> None:
    branches = [
        TreeBranch(None, 0, "The answer is yes.", math.log(0.6), True, None),
        TreeBranch(0, 14, "no.", math.log(0.3), True, None),
        TreeBranch(0, 4, "answer would be", math.log(0.01), False, "depth"),
    ]
    shape = build_shape(branches, keep_text=True)
    mass = shape.subtree_mass()
    assert mass[0] == 0.6 + 0.3 + 0.01 or math.isclose(mass[0], 0.91)
    # the root lane carries all three leaves up to the first split, then less
    segs = shape.segments(0, mass)
    assert [round(m, 3) for _, _, m in segs] == [0.91, 0.9, 0.6]
    widths = [float(p.get("stroke-width") or 0) for p in parse(render_svg(shape)).iter(f"{SVG}path")]
    assert max(widths) > 6 and min(widths) < 1


def test_garbage_structure_is_drawn_not_raised() -> None:
    branches = [
        TreeBranch(None, 0, "root", -0.1, True, None),
        TreeBranch(7, -5, "orphan", float("nan"), True, "weird"),
        TreeBranch(1, 10**9, "far", 3.0, False, None),
        TreeBranch(2, 0, "self", float("-inf"), False, None),
    ]
    shape = build_shape(branches, keep_text=True)
    assert [b.parent for b in shape.branches] == [None, 0, 1, 2]
    assert shape.branches[1].truncated is None and shape.branches[2].logprob == 0.0
    assert len(leaves(parse(render_svg(shape)))) == 4


def test_escape_and_clip() -> None:
    assert escape("a<b>&\"'") == "a&lt;b&gt;&amp;&quot;&#39;"
    assert escape("x\r\ny\rz") == "x\ny\nz"
    assert clip("abcdefghij", 5) == "ab\u2026ij" and clip("abc", 5) == "abc"


branch_st = st.builds(
    TreeBranch,
    parent=st.one_of(st.none(), st.integers(-3, 40)),
    split_text_chars=st.integers(-100, 500),
    text=st.text(max_size=200),
    logprob=st.floats(allow_nan=True, allow_infinity=True),
    complete=st.booleans(),
    truncated=st.sampled_from([None, "depth", "budget", "bogus"]),
)


@settings(max_examples=150, deadline=None)
@given(st.lists(branch_st, min_size=1, max_size=40), st.booleans())
def test_any_input_gives_well_formed_bounded_svg(branches: list[TreeBranch], text: bool) -> None:
    shape = build_shape(branches, keep_text=text)
    svg = render_svg(shape)
    root = parse(svg)
    assert len(leaves(root)) == len(branches)
    assert len(svg.encode()) <= max_svg_bytes(len(branches))
    assert len(shape.rows()) == len(branches) and set(shape.rows()) == set(range(len(branches)))
