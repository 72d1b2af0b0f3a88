"""librdkafka's in-process mock Kafka cluster, hosted in a helper process.

The mock cluster lives inside a librdkafka client object. Hosting it in its own process lets
several processes (the sidecar, a producer, a test harness) reach it over loopback, and lets a
test SIGKILL the sidecar without taking the broker down with it.

Run ``python -m sidecar.tools.demo.mock_cluster``: it prints one line, ``BOOTSTRAP host:port,...``, then
serves until its standard input closes or it receives SIGTERM/SIGINT.
"""

from __future__ import annotations

import argparse
import os
import select
import signal
import subprocess
import sys
from types import TracebackType

READY_PREFIX = "BOOTSTRAP "


def _serve(num_brokers: int, rtt_ms: int = 0) -> int:
    from confluent_kafka import Producer

    settings: dict[str, object] = {"test.mock.num.brokers": num_brokers, "log_level": 3}
    if rtt_ms:
        settings["test.mock.broker.rtt"] = rtt_ms  # every broker answers this much later: a slow cluster
    holder = Producer(settings)
    md = holder.list_topics(timeout=10)
    bootstrap = ",".join(f"{b.host}:{b.port}" for b in md.brokers.values())
    sys.stdout.write(READY_PREFIX + bootstrap + "\n")
    sys.stdout.flush()
    stop = False

    def _on_signal(_sig: int, _frame: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    while not stop:
        # The mock cluster's threads do the serving; this loop only waits for a reason to stop.
        ready, _, _ = select.select([sys.stdin], [], [], 0.5)
        if ready and not os.read(sys.stdin.fileno(), 4096):
            break
        holder.poll(0)
    return 0


class MockKafkaCluster:
    """Start the helper process; ``bootstrap_servers`` is valid between enter and exit."""

    def __init__(self, num_brokers: int = 1, start_timeout_seconds: float = 30.0, rtt_ms: int = 0) -> None:
        self._num_brokers = num_brokers
        self._rtt_ms = rtt_ms
        self._timeout = start_timeout_seconds
        self._proc: subprocess.Popen[bytes] | None = None
        self.bootstrap_servers = ""

    def start(self) -> str:
        self._proc = subprocess.Popen(  # noqa: S603 - fixed argv, our own module
            [
                sys.executable,
                "-m",
                "sidecar.tools.demo.mock_cluster",
                "--brokers",
                str(self._num_brokers),
                "--rtt-ms",
                str(self._rtt_ms),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            # Out of the caller's process group: Ctrl-C in a terminal signals the whole group, and
            # the broker must outlive the sidecar's drain. Its owner stops it (stdin closes, also
            # when the owner dies).
            start_new_session=True,
        )
        assert self._proc.stdout is not None
        ready, _, _ = select.select([self._proc.stdout], [], [], self._timeout)
        line = self._proc.stdout.readline().decode() if ready else ""
        if not line.startswith(READY_PREFIX):
            self.stop()
            raise RuntimeError(f"mock Kafka cluster did not start (got {line!r})")
        self.bootstrap_servers = line[len(READY_PREFIX) :].strip()
        return self.bootstrap_servers

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.stdin is not None:
            proc.stdin.close()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()

    def __enter__(self) -> MockKafkaCluster:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--brokers", type=int, default=1, choices=range(1, 10))
    parser.add_argument(
        "--rtt-ms",
        type=int,
        default=0,
        choices=range(10_001),
        metavar="0..10000",
        help="simulated broker round-trip time",
    )
    args = parser.parse_args(argv)
    return _serve(args.brokers, args.rtt_ms)


if __name__ == "__main__":
    raise SystemExit(main())
