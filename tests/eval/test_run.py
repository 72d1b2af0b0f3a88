"""score_all's scheduling: adapter verdicts and base-model trees never in flight together, rows
appended per chunk, concurrency bounded."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from sidecar.tools.eval.dataset import EvalConversation
from sidecar.tools.eval.run import CHUNK_CONVERSATIONS, ResultsFile, score_all
from sidecar.transcript.model import Message


class PhaseRecorder:
    def __init__(self) -> None:
        self.active = {"verdicts": 0, "trees": 0}
        self.mixed = 0
        self.peak = 0

    async def _phase(self, name: str) -> None:
        self.active[name] += 1
        self.peak = max(self.peak, sum(self.active.values()))
        if all(self.active.values()):
            self.mixed += 1
        await asyncio.sleep(0.001)
        self.active[name] -= 1

    async def verdicts(self, conv: EvalConversation) -> dict[str, Any]:
        await self._phase("verdicts")
        return {"full": {"p_end": 0.5, "complete": True}, "truncated": None}

    async def trees_and_judge(self, conv: EvalConversation) -> tuple[list[dict[str, Any]], None]:
        await self._phase("trees")
        return [{"turn": 1, "leaves": 1, "max_logprob": -1.0}], None

    def row(
        self, conv: EvalConversation, completion: dict[str, Any], trees: list[dict[str, Any]], judge: None
    ) -> dict[str, Any]:
        return {"id": conv.conversation_id, "completion": completion, "trees": trees}


async def test_phases_never_overlap_and_rows_come_per_chunk(tmp_path: Path) -> None:
    convs = [EvalConversation(f"c{i}", (Message("user", "hi"),), "s", "") for i in range(CHUNK_CONVERSATIONS + 7)]
    rec = PhaseRecorder()
    results = ResultsFile(tmp_path / "results.jsonl")
    seen: list[str] = []
    await score_all(rec, convs, results, concurrency=5, on_done=lambda r: seen.append(r["id"]))  # type: ignore[arg-type]
    assert rec.mixed == 0 and rec.peak == 5
    assert seen == [c.conversation_id for c in convs]
    assert set(results.load()) == set(seen)
