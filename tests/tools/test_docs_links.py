"""Every relative link in the README and docs/ points at a file of the repository, and every
``#anchor`` into a markdown file names one of its headings (GitHub's slug rules).

Links to other sites (any ``scheme:``) are not followed: the suite runs offline.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# Inline links and images: [text](target "title") or ![alt](<target>); reference definitions.
INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*(<[^>]*>|[^)\s]+)(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE_DEFINITION = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*(<[^>]*>|\S+)", re.MULTILINE)
HTML_ANCHOR = re.compile(r"<a\s+(?:name|id)=\"([^\"]+)\"", re.IGNORECASE)
HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
FENCE = re.compile(r"^\s{0,3}(`{3,}|~{3,})")
SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


def documents(root: Path = ROOT) -> list[Path]:
    """The files whose links this test checks."""
    return [root / "README.md", *sorted((root / "docs").glob("*.md")), root / "sidecar" / "source" / "README.md"]


def _prose(text: str) -> str:
    """``text`` with fenced code blocks and inline code spans blanked: links there are examples."""
    out: list[str] = []
    fence: str | None = None
    for line in text.split("\n"):
        m = FENCE.match(line)
        if fence is None and m:
            fence = m.group(1)[0] * 3
            out.append("")
        elif fence is not None:
            if line.lstrip().startswith(fence):
                fence = None
            out.append("")
        else:
            out.append(re.sub(r"(`+)(?:(?!\1).)+?\1", lambda s: " " * len(s.group(0)), line))
    return "\n".join(out)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: the rendered text, lower-cased, with everything but letters,
    digits, underscores, hyphens and spaces removed and each space turned into a hyphen."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link renders as its text
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML renders nothing of its own
    text = text.replace("`", "").replace("*", "")
    text = re.sub(r"(?<!\w)_+|_+(?!\w)", "", text)  # _emphasis_, not snake_case
    text = re.sub(r"[^\w\- ]", "", text.strip().lower())
    return text.replace(" ", "-")


def anchors(markdown: str) -> set[str]:
    """Every anchor a markdown file offers: one per heading (repeats get -1, -2, ...) and HTML anchors."""
    seen: dict[str, int] = {}
    out: set[str] = set()
    fence: str | None = None
    for line in markdown.split("\n"):
        m = FENCE.match(line)
        if fence is None and m:
            fence = m.group(1)[0] * 3
            continue
        if fence is not None:
            if line.lstrip().startswith(fence):
                fence = None
            continue
        h = HEADING.match(line)
        if h:
            base = slug(h.group(2))
            n = seen.get(base, 0)
            seen[base] = n + 1
            out.add(base if n == 0 else f"{base}-{n}")
    out.update(HTML_ANCHOR.findall(markdown))
    return out


def links(markdown: str) -> list[str]:
    """The link targets of a markdown text, outside code."""
    prose = _prose(markdown)
    found = [m.group(1) for m in INLINE_LINK.finditer(prose)]
    found += [m.group(1) for m in REFERENCE_DEFINITION.finditer(prose)]
    return [t[1:-1] if t.startswith("<") else t for t in found]


def broken_links(doc: Path, root: Path = ROOT) -> list[str]:
    """Why each relative link of ``doc`` is broken (empty when none is)."""
    problems: list[str] = []
    for target in links(doc.read_text(encoding="utf-8")):
        if SCHEME.match(target):
            continue
        path, _, anchor = target.partition("#")
        dest = (doc.parent / path).resolve() if path else doc
        if not dest.is_relative_to(root.resolve()):
            problems.append(f"{target}: outside the repository")
            continue
        if not dest.exists():
            problems.append(f"{target}: no such file")
            continue
        checkable = anchor and dest.suffix == ".md" and dest.is_file()
        if checkable and anchor not in anchors(dest.read_text(encoding="utf-8")):
            problems.append(f"{target}: no heading '#{anchor}' in {dest.relative_to(root.resolve())}")
    return problems


@pytest.mark.parametrize("doc", documents(), ids=lambda p: str(p.relative_to(ROOT)))
def test_links_resolve(doc: Path) -> None:
    assert doc.is_file(), f"{doc.relative_to(ROOT)} is missing"
    assert broken_links(doc) == []


def test_docs_have_links_to_check() -> None:
    """Guard against a parser that finds nothing (and so passes everything)."""
    readme = links((ROOT / "README.md").read_text(encoding="utf-8"))
    assert any(t.startswith("docs/") for t in readme)
    assert any("#" in t for d in documents() for t in links(d.read_text(encoding="utf-8")))


@pytest.mark.parametrize(
    ("heading", "expected"),
    [
        ("Nothing lost, nothing twice (restart safety)", "nothing-lost-nothing-twice-restart-safety"),
        ("Onboarding a new agent: `adapters onboard`", "onboarding-a-new-agent-adapters-onboard"),
        (
            'Does the tree\'s uncertainty mean anything? Measured, mostly "no signal"',
            "does-the-trees-uncertainty-mean-anything-measured-mostly-no-signal",
        ),
        ("Event contract v1", "event-contract-v1"),
        ("`state.max_memory_bytes` and **RSS**", "statemax_memory_bytes-and-rss"),
        ("A real base model on a GPU: `adapters add-end-tag`", "a-real-base-model-on-a-gpu-adapters-add-end-tag"),
        ("See [the guide](guide.md) -- twice", "see-the-guide----twice"),
    ],
)
def test_slug_follows_github(heading: str, expected: str) -> None:
    assert slug(heading) == expected


def test_repeated_headings_get_numbered_anchors() -> None:
    assert anchors("# Notes\n## Notes\n```\n# not a heading\n```\n### Notes\n") == {"notes", "notes-1", "notes-2"}


def test_broken_links_are_found(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# Alpha\n\n## Second part\n", encoding="utf-8")
    doc = tmp_path / "README.md"
    doc.write_text(
        "[ok](docs/a.md) [ok](docs/a.md#second-part) [ok](#top) [ok](https://example.com/x)\n"
        "# Top\n"
        "[gone](docs/b.md) [bad anchor](docs/a.md#third-part) [self](#nowhere) [up](../outside.md)\n"
        "`[in code](docs/c.md)`\n\n```\n[in a fence](docs/d.md)\n```\n\n[ref]: docs/e.md\n",
        encoding="utf-8",
    )
    problems = broken_links(doc, tmp_path)
    assert [p.split(":")[0] for p in problems] == [
        "docs/b.md",
        "docs/a.md#third-part",
        "#nowhere",
        "../outside.md",
        "docs/e.md",
    ]
