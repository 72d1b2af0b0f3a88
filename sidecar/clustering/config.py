"""Goal clustering configuration."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class ClusteringConfig(BaseModel):
    """Periodic goal re-clustering; filled in by the clustering package."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    enabled: bool = Field(False, description="Keep goal clusters live and label metrics with them.")
