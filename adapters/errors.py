"""The errors ``adapters`` reports to its user: one line each, exit status 2, no traceback.

Anything else that escapes a command is a bug and keeps its traceback.
"""

from __future__ import annotations


class AdaptersError(Exception):
    """Root of the errors a command explains instead of crashing on."""


class DataError(AdaptersError):
    """The conversations given cannot be used: missing, empty, too few, too large, wrong format."""


class ServeError(AdaptersError):
    """The adapter could not be handed to the vLLM server as asked."""
