"""Headless Chromium (Debian's ``chromium``, installed by ``.ci/setup``) for page tests.

:func:`open_page` loads a URL twice: once to dump the DOM after load (with the browser's console
written to stderr, so console errors and Content-Security-Policy violations are seen), once to
take a screenshot. No network beyond the URL itself, no first-run or component-update traffic, a
fresh profile per call. A missing browser is a test failure with the way to install it, never a
skip: the pages' claims are only proven in a real browser.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest

FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-default-apps",
    "--disable-extensions",
    "--disable-sync",
    "--no-first-run",
    "--no-default-browser-check",
    "--mute-audio",
    "--hide-scrollbars",
)
_CONSOLE = re.compile(r":CONSOLE(?:\(\d+\))?\]? ?(.*)")
TIMEOUT_SECONDS = 90


@dataclass(frozen=True)
class Loaded:
    dom: str
    console: list[str]
    screenshot: Path


def chromium() -> str:
    for name in ("chromium", "chromium-browser"):
        found = shutil.which(name)
        if found:
            return found
    pytest.fail("headless Chromium is missing: run `bash .ci/setup` (or `apt-get install -y chromium`)")


def _run(args: list[str], profile: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [chromium(), *FLAGS, f"--user-data-dir={profile}", "--enable-logging=stderr", "--v=0", *args],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_SECONDS,
        check=False,
    )


def open_page(url: str, screenshot: Path, *, width: int = 1280, height: int = 1600) -> Loaded:
    """Load ``url``: its DOM after load, the console lines it produced, and a PNG screenshot."""
    with tempfile.TemporaryDirectory(prefix="chromium-") as profile:
        dumped = _run(["--dump-dom", url], profile)
        if dumped.returncode != 0 or "<html" not in dumped.stdout:
            raise AssertionError(f"chromium --dump-dom failed ({dumped.returncode}): {dumped.stderr[-2000:]}")
        shot = _run([f"--screenshot={screenshot}", f"--window-size={width},{height}", url], profile)
        if shot.returncode != 0 or not screenshot.is_file():
            raise AssertionError(f"chromium --screenshot failed ({shot.returncode}): {shot.stderr[-2000:]}")
    console = [m.group(1) for line in (dumped.stderr + shot.stderr).splitlines() if (m := _CONSOLE.search(line))]
    return Loaded(dumped.stdout, console, screenshot)


def dump_dom(url: str) -> tuple[str, list[str]]:
    """Load ``url`` once: its DOM after load (after every script that ran) and its console lines."""
    with tempfile.TemporaryDirectory(prefix="chromium-") as profile:
        dumped = _run(["--dump-dom", url], profile)
    if dumped.returncode != 0 or "<html" not in dumped.stdout:
        raise AssertionError(f"chromium --dump-dom failed ({dumped.returncode}): {dumped.stderr[-2000:]}")
    return dumped.stdout, [m.group(1) for line in dumped.stderr.splitlines() if (m := _CONSOLE.search(line))]


def png_size(path: Path) -> tuple[int, int]:
    """Width and height from a PNG header."""
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    return int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")
