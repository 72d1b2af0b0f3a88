"""Configuration of the live tree view (``GET /trees/{alert id}``, ``GET /escalations``)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class TreeViewConfig(BaseModel):
    """Recently flagged response trees and escalations, kept in memory and served as pages.

    Memory is bounded by ``max_trees`` x (``max_branches`` x ~200 bytes + 4 x
    ``max_tree_text_chars`` bytes) plus ``max_escalations`` small records. Text is kept only with
    ``alerting.include_text``; otherwise the page draws the tree's shape and numbers alone.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    enabled: bool = Field(
        True,
        description="Keep the trees of uncertain-turn alerts and the recent escalations in memory and serve "
        "them at /trees/{alert id} (what alerts link to) and /escalations; text only with alerting.include_text.",
    )
    max_trees: int = Field(256, ge=1, le=100_000, description="Trees kept; the least recently used is dropped first.")
    max_escalations: int = Field(500, ge=1, le=100_000, description="Most recent escalations listed at /escalations.")
    max_branches: int = Field(256, ge=1, le=4096, description="Branches kept and drawn per tree.")
    max_branch_text_chars: int = Field(
        1000, ge=0, le=100_000, description="Characters of text kept per branch (with alerting.include_text)."
    )
    max_tree_text_chars: int = Field(
        20_000, ge=0, le=1_000_000, description="Characters of text kept per tree, all branches together."
    )
