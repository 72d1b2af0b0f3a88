"""Rebalance pause: how long a departed replica's partitions go unconsumed, and how much work is redone.

Three ``sidecar run`` processes in one group on Tansu (``at_least_once``), hooks that answer after a
random delay (``tests.integration.fault_sidecar``: a backlog of slow scorers, so work is in flight
at every moment), a producer streaming the bundled conversations at a steady rate. Then, per
round: one replica leaves with SIGTERM, and later one dies with SIGKILL; each is restarted after.

The pause is measured from the signal to the moment the survivors own every partition again, each
recovered and polling (read from their ``/readyz`` and ``/metrics`` every 100 ms, as a watcher
outside the process would). The redone share is hook calls fired across all replicas (their last
scrapes) over the distinct outcomes in the results topic, minus one.

    python -m tests.bench.bench_rebalance --session-timeout-ms 6000 --rounds 2
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from sidecar.tools.demo.replay import conversation_events, encode, interleave, load_sample
from tests.integration.kafka_support import produce_raw, read_topic, result_keys
from tests.replicas.fleet import Fleet, Replica
from tests.support.tansu import TansuBroker

PARTITIONS = 6
TOPIC = "rebalance"


async def _stream(bootstrap: str, rate: float, stop: asyncio.Event) -> int:
    """Replay the bundled sample under fresh ids at ``rate`` events/s until ``stop``."""
    sample = load_sample()
    sent = 0
    copy = 0
    while not stop.is_set():
        convs = [conversation_events(r, conversation_id=f"rb{copy}-{i}") for i, r in enumerate(sample)]
        stream = list(interleave(convs, concurrency=40, seed=copy))
        for batch_start in range(0, len(stream), 50):
            events = stream[batch_start : batch_start + 50]
            if stop.is_set():
                break
            sent += await produce_raw(bootstrap, TOPIC, [encode(e) for e in events])
            await asyncio.sleep(len(events) / rate)
        copy += 1
    return sent


async def _pause(fleet: Fleet, gone: Replica, signal_name: str) -> dict[str, float]:
    """Seconds from the signal to the process gone, and to the survivors consuming everything."""
    began = time.monotonic()
    if signal_name == "SIGTERM":
        await asyncio.to_thread(gone.proc.terminate, 60)
    else:
        gone.proc.kill()
    exited = time.monotonic() - began
    await fleet.settled(within=300, poll_seconds=0.1)
    return {"exited": round(exited, 2), "consuming_again": round(time.monotonic() - began, 2)}


def _recovery(replicas: list[Replica]) -> dict[str, float]:
    """Recoveries of the survivors: how many, mean seconds, journal records read per recovery."""
    scrapes = [r.last for r in replicas if r.last is not None]
    n = sum(s.value("sidecar_partition_recovery_seconds_count") for s in scrapes)
    seconds = sum(s.value("sidecar_partition_recovery_seconds_sum") for s in scrapes)
    records = sum(s.value("sidecar_partition_recovery_journal_records_total") for s in scrapes)
    return {
        "recoveries": n,
        "mean_seconds": round(seconds / n, 3) if n else 0.0,
        "journal_records_per_recovery": round(records / n) if n else 0,
    }


def _fired(replicas: list[Replica]) -> float:
    return sum(r.last.value("sidecar_hooks_fired_total") for r in replicas if r.last is not None)


async def run(
    session_timeout_ms: int, rounds: int, rate: float, delay_max: float, workdir: str | None
) -> dict[str, Any]:
    with contextlib.ExitStack() as stack:
        tmp = workdir or stack.enter_context(tempfile.TemporaryDirectory())
        broker = TansuBroker(Path(tmp) / "tansu.log")
        broker.start()
        try:
            await broker.create_topics([TOPIC, f"{TOPIC}.results", f"{TOPIC}.dlq"], PARTITIONS)
            heartbeat = max(100, session_timeout_ms // 6)
            fleet = Fleet(
                Path(tmp),
                broker.bootstrap_servers,
                TOPIC,
                PARTITIONS,
                {"kafka": {"session_timeout_ms": session_timeout_ms, "heartbeat_interval_ms": heartbeat}},
                argv=["-m", "tests.integration.fault_sidecar", "--delay-max", str(delay_max)],
            )
            stop = asyncio.Event()
            producer = asyncio.create_task(_stream(broker.bootstrap_servers, rate, stop))
            ended: list[Replica] = []
            pauses: dict[str, list[dict[str, float]]] = {"SIGTERM": [], "SIGKILL": []}
            try:
                for name in ("r0", "r1", "r2"):
                    fleet.start(name)
                await fleet.settled(within=300)
                generation = 3
                for _ in range(rounds):
                    for signal_name in ("SIGTERM", "SIGKILL"):
                        await asyncio.sleep(5)  # work in flight everywhere
                        victim = fleet.live()[0]
                        victim.scrape()
                        pauses[signal_name].append(await _pause(fleet, victim, signal_name))
                        ended.append(victim)
                        fleet.start(f"r{generation}")
                        generation += 1
                        await fleet.settled(within=300)
                await asyncio.sleep(5)
            finally:
                stop.set()
                sent = await producer
                for r in fleet.live():
                    r.scrape()
                fired = _fired(list(fleet.replicas.values()))
                recovery = _recovery(fleet.live())
                fleet.stop_all()
            # Let the survivors' last outcomes land before counting (they were stopped gracefully).
            keys = result_keys(await read_topic(broker.bootstrap_servers, f"{TOPIC}.results"))
        finally:
            broker.stop()
    distinct = len(set(keys))
    return {
        "session_timeout_ms": session_timeout_ms,
        "events_sent": sent,
        "pause_seconds": pauses,
        "survivors_recovery": recovery,
        "hook_calls": int(fired),
        "distinct_outcomes": distinct,
        "outcome_records": len(keys),
        "redone_share": round(fired / distinct - 1, 4) if distinct else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--session-timeout-ms", type=int, nargs="+", default=[6000, 12000])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--rate", type=float, default=300.0, help="events per second")
    parser.add_argument("--delay-max", type=float, default=0.5, help="hooks answer after U(0, this) seconds")
    parser.add_argument("--workdir", help="keep the replicas' configurations and logs here")
    args = parser.parse_args()
    for timeout_ms in args.session_timeout_ms:
        workdir = f"{args.workdir}/{timeout_ms}" if args.workdir else None
        if workdir:
            Path(workdir).mkdir(parents=True, exist_ok=True)
        result = asyncio.run(run(timeout_ms, args.rounds, args.rate, args.delay_max, workdir))
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        main()
