"""The memory bound, measured on a real process: ``sidecar run`` holding conversations up to its
caps stays within its configured bound, read from the kernel (VmHWM, the peak resident set).

The conversations are built to defeat text-length accounting: mostly ASCII with one emoji, so
CPython stores every character in 4 bytes while the UTF-8 text is ~1 byte per character (the
previous cap counted the latter, per partition, and a 64 MiB cap used 258 MiB). They never end and
never idle out during the test, so only the budget can bound them.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import aiohttp

from sidecar.tools.demo.mock_cluster import MockKafkaCluster
from sidecar.tools.ports import free_port
from tests.integration.kafka_support import SidecarProcess, produce_raw, write_config

MIB = 1_048_576
BUDGET = 48 * MIB
QUEUE = 2 * MIB
FETCH = 4 * MIB
# What the process may add on top of the state budget: the bounded fetch buffers (the client's
# and each partition's queue), records being decoded, the results producer's buffer, and the
# allocator's slack. Derived in docs/guarantees.md (Bounded memory); the test checks the sum.
ALLOWANCE = FETCH + 4 * QUEUE + 24 * MIB


def proc_status(pid: int) -> dict[str, int]:
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = int(value.split()[0]) * 1024
    return out


def events(cid: str, messages: int, chars: int) -> list[tuple[bytes, bytes]]:
    out = []
    for seq in range(messages):
        content = "a" * chars + "\U0001f600"  # 4 bytes per character in memory, ~1 in UTF-8
        ev = {
            "conversation_id": cid,
            "event_id": f"{cid}-{seq}",
            "seq": seq,
            "ts": 1.0,
            "type": "message",
            "message": {"role": "user" if seq % 2 == 0 else "assistant", "content": content},
        }
        out.append((cid.encode(), json.dumps(ev).encode()))
    return out


async def metric(port: int, name: str) -> float:
    try:
        async with aiohttp.ClientSession() as http, http.get(f"http://127.0.0.1:{port}/metrics") as resp:
            text = await resp.text()
    except aiohttp.ClientConnectionError:
        return 0.0  # not listening yet
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return 0.0


async def test_process_memory_stays_within_the_configured_budget(tmp_path: Path) -> None:
    with MockKafkaCluster(1) as kafka:
        bs = kafka.bootstrap_servers
        port = free_port()
        cfg = write_config(
            tmp_path / "mem.yaml",
            bs,
            "mem",
            kafka={"fetch_max_bytes": FETCH, "max_queued_bytes_per_partition": QUEUE, "fetch_max_records": 50},
            state={
                "max_memory_bytes": BUDGET,
                "idle_ttl_seconds": 3600,
                "turn_debounce_seconds": 3600,
                "max_conversation_bytes": 8 * MIB,
            },
            http={"port": port},
        )
        sidecar = SidecarProcess(cfg, tmp_path / "mem.log")
        sidecar.start()
        try:
            await produce_raw(bs, "mem", events("warm-up", 2, 100))
            deadline = time.monotonic() + 60
            while await metric(port, "sidecar_events_consumed_total") < 2:
                assert time.monotonic() < deadline and sidecar.alive(), (tmp_path / "mem.log").read_text()[-2000:]
                await asyncio.sleep(0.5)
            assert sidecar.proc is not None
            baseline = proc_status(sidecar.proc.pid)["VmRSS"]
            # 240 conversations x 16 messages x ~64 K characters = 240 MiB of characters, ~1 GiB as
            # CPython strings; produced in steps the consumer keeps up with (the mock broker keeps
            # only a few MiB per partition).
            total = 0
            for step in range(24):
                batch = [e for i in range(10) for e in events(f"c{step}-{i}", 16, 64_000)]
                await produce_raw(bs, "mem", batch)
                total += len(batch)
                while await metric(port, "sidecar_events_consumed_total") < total - 40:
                    assert sidecar.alive(), (tmp_path / "mem.log").read_text()[-2000:]
                    await asyncio.sleep(0.2)
            await asyncio.sleep(2)
            status = proc_status(sidecar.proc.pid)
            held = await metric(port, "sidecar_state_memory_bytes")
            evicted = await metric(port, 'sidecar_conversations_finalised_total{reason="evicted"}')
        finally:
            assert sidecar.terminate() == 0
    growth = status["VmHWM"] - baseline
    print(
        f"baseline {baseline / MIB:.0f} MiB, peak growth {growth / MIB:.0f} MiB, "
        f"state {held / MIB:.1f} MiB (budget {BUDGET / MIB:.0f}), evicted {evicted:.0f}"
    )
    assert evicted > 100  # the budget did the bounding, not the workload
    assert held <= BUDGET
    assert growth <= BUDGET + ALLOWANCE, f"peak RSS grew {growth / MIB:.0f} MiB"
