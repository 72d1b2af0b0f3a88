"""Regenerate the screenshots of the operator pages in ``docs/images/``.

    .venv/bin/python -m tests.bench.page_screenshots [--out docs/images]

The pages come from the app's own wiring (:mod:`tests.trees.live_app`: ``build_hooks`` and the
``HttpServer`` arguments ``run_app`` uses) after an hour of synthetic traffic played through the
real counters, goal metrics and alert observers; headless Chromium (``.ci/setup`` installs it)
loads each page from the real server and writes a PNG. Printed: each file, its pixel size and bytes.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from tests.trees.browser import open_page, png_size
from tests.trees.live_app import live_app

REPO = Path(__file__).resolve().parents[2]
WIDTH = 1280
# (file, path, window height): heights fit each page's content at 100 % zoom.
SHOTS = (
    ("overview.png", "/", 1800),
    ("escalations.png", "/escalations", 1100),
    ("tree.png", "/trees/{big}", 1500),
)


def _shrink(path: Path) -> None:
    """The PNG with a 64-colour palette: the pages are flat colours, the files a fraction of the size."""
    from PIL import Image  # matplotlib's dependency, in the dev environment

    with Image.open(path) as image:
        small = image.convert("RGB").quantize(colors=64)
    small.save(path, optimize=True)


async def shoot(out: Path) -> list[tuple[Path, tuple[int, int], int]]:
    live = live_app(hostile=False)
    made = []
    async with live.server() as server:
        root = f"http://127.0.0.1:{server.port}"
        for name, path, height in SHOTS:
            target = out / name
            url = root + path.format(big=live.big.id)
            await asyncio.to_thread(open_page, url, target, width=WIDTH, height=height)
            _shrink(target)
            made.append((target, png_size(target), target.stat().st_size))
    return made


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "images")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    for path, (w, h), size in asyncio.run(shoot(args.out)):
        print(f"{path}: {w}x{h} px, {size / 1024:.0f} KiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
