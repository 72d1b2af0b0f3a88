"""argparse value types shared by every command line of the project (sidecar and adapters)."""

from __future__ import annotations

import argparse
from collections.abc import Callable


def whole_number(low: int, high: int | None = None) -> Callable[[str], int]:
    """An ``int`` option within ``low..high`` (no upper bound when ``high`` is None), with a usage error
    that names the value."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if high is None and value < low:
            raise argparse.ArgumentTypeError(f"{value} must be at least {low}")
        if high is not None and not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{value} is not in {low}..{high}")
        return value

    return parse


positive_int = whole_number(1)
non_negative_int = whole_number(0)
