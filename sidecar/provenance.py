"""The evaluator's identity every verdict carries: this package's name and installed version.

A score exported to a results topic, an OpenTelemetry backend, Langfuse or Phoenix is only
comparable with another one when both came from the same evaluator, model, adapter and rule; the
rest of a verdict's :class:`~sidecar.contract.Provenance` is filled in where the verdict is made
(:mod:`sidecar.scoring.hooks`).
"""

from __future__ import annotations

import importlib.metadata
from functools import cache

EVALUATOR_NAME = "llm-agent-sidecar"
UNKNOWN_VERSION = "unknown"


@cache
def evaluator_version() -> str:
    """The installed distribution's version (``unknown`` when run from a tree that is not installed)."""
    try:
        return importlib.metadata.version(EVALUATOR_NAME)
    except importlib.metadata.PackageNotFoundError:
        return UNKNOWN_VERSION
