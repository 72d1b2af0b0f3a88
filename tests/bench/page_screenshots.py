"""Regenerate the screenshots of the operator pages in ``docs/images/``.

    .venv/bin/python -m tests.bench.page_screenshots [--out docs/images] [--url http://127.0.0.1:9108]

Without ``--url`` the pages come from the app's own wiring (:mod:`tests.trees.live_app`: ``build_hooks`` and the
``HttpServer`` arguments ``run_app`` uses) after an hour of synthetic traffic played through the
real counters, goal metrics and alert observers; headless Chromium (``.ci/setup`` installs it)
loads each page from the real server and writes a PNG. With ``--url`` the pages are those of a
running sidecar (``sidecar demo`` serves them at http://127.0.0.1:9108); the tree is the first one
``/escalations`` links to. Printed: each file, its pixel size and bytes.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import sys
import urllib.request
from pathlib import Path

from tests.trees.browser import open_page, png_size
from tests.trees.live_app import live_app

REPO = Path(__file__).resolve().parents[2]
WIDTH = 1280
# (file, path, window height): heights fit each page's content at 100 % zoom.
SHOTS = (
    ("overview.png", "/", 1800),
    ("escalations.png", "/escalations", 1100),
    ("tree.png", "/trees/{tree}", 1500),
)


def _shrink(path: Path) -> None:
    """The PNG with a 64-colour palette: the pages are flat colours, the files a fraction of the size."""
    from PIL import Image  # matplotlib's dependency, in the dev environment

    with Image.open(path) as image:
        small = image.convert("RGB").quantize(colors=64)
    small.save(path, optimize=True)


def _take(root: str, tree: str | None, out: Path) -> list[tuple[Path, tuple[int, int], int]]:
    made = []
    for name, path, height in SHOTS:
        if "{tree}" in path and tree is None:
            continue
        target = out / name
        open_page(root + path.format(tree=tree), target, width=WIDTH, height=height)
        _shrink(target)
        made.append((target, png_size(target), target.stat().st_size))
    return made


async def shoot(out: Path) -> list[tuple[Path, tuple[int, int], int]]:
    live = live_app(hostile=False)
    async with live.server() as server:
        return await asyncio.to_thread(_take, f"http://127.0.0.1:{server.port}", live.big.id, out)


def shoot_running(url: str, out: Path) -> list[tuple[Path, tuple[int, int], int]]:
    """The pages of a running sidecar at ``url`` (no credentials: a local demo)."""
    root = url.rstrip("/")
    with urllib.request.urlopen(root + "/escalations", timeout=30) as response:
        listing = response.read().decode("utf-8")
    found = re.search(r'href="trees/([0-9a-f]{32})"', listing)
    return _take(root, found.group(1) if found else None, out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "images")
    parser.add_argument("--url", help="a running sidecar's operator listener instead of the synthetic hour")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    made = shoot_running(args.url, args.out) if args.url else asyncio.run(shoot(args.out))
    for path, (w, h), size in made:
        print(f"{path}: {w}x{h} px, {size / 1024:.0f} KiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
