"""The live tree view: flagged turns' trees and recent escalations, bounded, served as pages.

:meth:`TreeView.observe` is registered with :meth:`Escalations.observe
<sidecar.alerting.escalation.Escalations.observe>`: it is called on the event loop for every alert
decided, with the effect that caused it. An ``uncertain_turn`` alert's tree (the effect's
:class:`~sidecar.contract.TreeScored`) is kept under the alert's id in an LRU of
``tree_view.max_trees`` entries, every alert in a ring of the last ``tree_view.max_escalations``.
Text is kept only when ``alerting.include_text`` allows alerts to carry it; otherwise the branches
keep their lengths and numbers and the page draws the shape alone.

Routes (on :class:`~sidecar.telemetry.http.HttpServer`): ``GET /trees/{alert id}`` (the id is
exactly 32 lowercase hex digits, anything else is 400), ``GET /escalations`` and the pages'
stylesheet ``GET /pages.css``. Each tree page answered is logged as ``operator.tree_viewed`` (the
alert id, the status, who asked: never the content), each listing as
``operator.escalations_viewed``. Nothing here survives a restart: a link in an old alert answers
404 once its tree has been dropped.
"""

from __future__ import annotations

import re
from collections import OrderedDict, deque

from sidecar.alerting.alert import Alert, Detail
from sidecar.contract import Effect, TreeScored
from sidecar.telemetry.http import Page, PageRoute
from sidecar.trees.config import TreeViewConfig
from sidecar.trees.pages import (
    CSS,
    STYLESHEET,
    Escalation,
    StoredTree,
    escalations_page,
    message_page,
    tree_page,
)
from sidecar.trees.shape import build_shape

ALERT_ID = re.compile(r"[0-9a-f]{32}")
_TREE_FACTS = (
    "leaves",
    "complete_leaves",
    "max_logprob",
    "mean_token_logprob",
    "uncertainty_score",
    "threshold",
    "rule",
    "generated_tokens",
)


class TreeView:
    """The bounded store behind the pages; an alert observer."""

    def __init__(self, config: TreeViewConfig, *, include_text: bool) -> None:
        self._cfg = config
        self._text = include_text
        self._trees: OrderedDict[str, StoredTree] = OrderedDict()
        self._recent: deque[Escalation] = deque(maxlen=config.max_escalations)

    def __len__(self) -> int:
        return len(self._trees)

    def observe(self, alert: Alert, effect: Effect) -> None:
        """Keep ``alert`` (and, for an uncertain turn, its tree). Never raises for odd input."""
        cfg = self._cfg
        escalation = Escalation.of(alert, cfg.max_branch_text_chars if self._text else None)
        self._recent.append(escalation)
        if alert.kind != "uncertain_turn":
            return
        tree = effect.first(TreeScored)
        if not isinstance(tree, TreeScored) or not tree.branches:
            return
        shape = build_shape(
            tree.branches,
            keep_text=self._text,
            max_branches=cfg.max_branches,
            max_text_chars=cfg.max_branch_text_chars,
            max_total_text_chars=cfg.max_tree_text_chars,
        )
        facts: dict[str, Detail] = {k: alert.details[k] for k in _TREE_FACTS if k in alert.details}
        self._trees[alert.id] = StoredTree(escalation, shape, tree.model[:200], tree.budget_hit, facts)
        self._trees.move_to_end(alert.id)
        while len(self._trees) > cfg.max_trees:
            self._trees.popitem(last=False)

    def get(self, alert_id: str) -> StoredTree | None:
        """The tree of alert ``alert_id`` (marked recently used), or None."""
        tree = self._trees.get(alert_id)
        if tree is not None:
            self._trees.move_to_end(alert_id)
        return tree

    def has(self, alert_id: str) -> bool:
        """Whether a tree is kept for ``alert_id`` (without marking it used)."""
        return alert_id in self._trees

    def recent(self) -> list[Escalation]:
        """Kept escalations, newest first."""
        return list(reversed(self._recent))

    # -- pages --------------------------------------------------------------------------------

    def tree_page(self, alert_id: str | None) -> Page:
        if alert_id is None:
            return self.escalations_page(None)
        tree = self.get(alert_id)
        if tree is None:
            return Page(
                message_page(
                    "tree not found",
                    "No tree is kept for this alert id: it was never flagged "
                    "here, or it has been dropped (the view keeps the most recent ones).",
                ),
                404,
            )
        return Page(tree_page(tree))

    def escalations_page(self, _param: str | None) -> Page:
        return Page(escalations_page(self.recent(), set(self._trees), self._cfg.max_escalations))

    def routes(self) -> dict[str, PageRoute]:
        """The page routes to give :class:`~sidecar.telemetry.http.HttpServer`."""
        return {
            "trees": PageRoute(
                self.tree_page, param=ALERT_ID, index=False, audit="operator.tree_viewed", param_field="alert_id"
            ),
            "escalations": PageRoute(self.escalations_page, audit="operator.escalations_viewed"),
            STYLESHEET: PageRoute(_stylesheet),
        }


def _stylesheet(_param: str | None) -> Page:
    return Page(CSS, content_type="text/css")
