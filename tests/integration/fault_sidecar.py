"""``sidecar run`` with hooks that answer late, as a real process: the fault suite's subject.

Every hook returns an awaitable that completes after a delay drawn from a seeded distribution
(a backlog of slow scorers), so SIGTERM, SIGKILL and rebalances land while many effects are in
flight. The outcome records nothing but the message count, like :class:`RecordingHooks`.

    python -m tests.integration.fault_sidecar --config sidecar.yaml --delay-max 0.1
"""

from __future__ import annotations

from sidecar.lifecycle import catch_early_stop

catch_early_stop()  # as `python -m sidecar` does: a SIGTERM during start-up is a clean stop

import argparse  # noqa: E402
import asyncio  # noqa: E402
import random  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

from sidecar.app import run_forever  # noqa: E402
from sidecar.config import load_config  # noqa: E402
from sidecar.contract import Outcome, TurnContext  # noqa: E402
from sidecar.state.hooks import RecordingHooks  # noqa: E402


class LateHooks(RecordingHooks):
    def __init__(self, delay_max: float, seed: int) -> None:
        super().__init__()
        self._delay_max = delay_max
        self._rng = random.Random(seed)

    async def _late(self, ctx: TurnContext, delay: float) -> Outcome:
        await asyncio.sleep(delay)
        return self._record(ctx)

    def _answer(self, ctx: TurnContext) -> Any:
        return self._late(ctx, self._rng.uniform(0.0, self._delay_max))

    def on_user_message(self, ctx: TurnContext) -> Any:
        return self._answer(ctx)

    def on_turn_closed(self, ctx: TurnContext) -> Any:
        return self._answer(ctx)

    def on_conversation_ended(self, ctx: TurnContext) -> Any:
        return self._answer(ctx)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", required=True)
    parser.add_argument("--delay-max", type=float, default=0.1)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    return run_forever(load_config(Path(args.config)), hooks=LateHooks(args.delay_max, args.seed))


if __name__ == "__main__":
    raise SystemExit(main())
