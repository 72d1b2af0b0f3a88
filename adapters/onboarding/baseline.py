"""The drift baseline an exported adapter's manifest carries (``validation.baseline``).

The sidecar compares each agent's recent *final* verdicts (one per ended conversation) with it
(``sidecar/scoring/drift.py``), so it describes the adapter on the held-back slice's *whole*
conversations: their P(end) at evenly spaced quantile levels, and the share the serving rule calls
complete. Its fields are those of ``scoring.agents.<name>.baseline``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

QUANTILE_LEVELS = 21  # 0, 0.05, ..., 1: a KS distance resolved to about 0.05 needs no finer grid


def quantiles(values: Sequence[float], levels: int = QUANTILE_LEVELS) -> list[float]:
    """Values at levels 0, 1/(levels-1), ..., 1 (linear interpolation between order statistics)."""
    xs = sorted(min(1.0, max(0.0, v)) for v in values if math.isfinite(v))
    if not xs:
        return []
    out = []
    for i in range(levels):
        pos = i / (levels - 1) * (len(xs) - 1)
        lo = math.floor(pos)
        hi = min(lo + 1, len(xs) - 1)
        out.append(xs[lo] + (xs[hi] - xs[lo]) * (pos - lo))
    return out


def drift_baseline(validation: dict[str, Any]) -> dict[str, Any]:
    """The baseline of a validation result (``onboard.validate``'s document)."""
    complete = [float(p) for p in validation["p_end"]["complete"]]
    if validation["rule"] == "threshold":
        t = validation["p_end_threshold"]
        rate = sum(p >= t for p in complete) / len(complete) if complete else None
    else:
        rate = validation["after"]["greedy"]["complete"]["recall"] if complete else None
    return {
        "completion_rate": rate,
        "p_end_quantiles": quantiles(complete),
        "untrusted_share": 0.0 if validation["trusted"] else 1.0,
    }
