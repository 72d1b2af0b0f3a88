"""Scoring configuration (completion detection and response trees)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class ScoringConfig(BaseModel):
    """Which scorers run; filled in by the scoring package."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    enabled: bool = Field(False, description="Run the completion and response-tree scorers on vLLM.")
