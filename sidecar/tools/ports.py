"""Pick a free TCP port for a local server: the demo's vLLM, broker and ``/metrics``, the tests' servers.

``bind(("127.0.0.1", 0))`` hands out a port from the kernel's ephemeral range, the range outgoing
connections draw from too. A server that takes a while to bind (vLLM imports for a minute on a
small CPU) can find that port taken by someone's client connection by then: ``Address already in
use``. Ports below the ephemeral range are only ever taken by listeners that name them, so they are
picked from there when the range leaves room.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
# Linux's default ephemeral range; used where the file cannot be read (other systems).
DEFAULT_EPHEMERAL_RANGE = (32768, 60999)
# The lowest port picked: above the well-known ports and the registered ones most services use.
LOWEST_PORT = 20000
ATTEMPTS = 50
_rng = random.SystemRandom()


def ephemeral_range(path: Path = EPHEMERAL_RANGE_FILE) -> tuple[int, int]:
    """The kernel's ephemeral port range (``ip_local_port_range``), or Linux's default."""
    try:
        low, high = (int(part) for part in path.read_text().split())
    except (OSError, ValueError):
        return DEFAULT_EPHEMERAL_RANGE
    return low, high


def bindable(host: str, port: int) -> bool:
    """Whether a listener could bind ``host:port`` now (with ``SO_REUSEADDR``, as servers do)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
        return True


def free_port(host: str = "127.0.0.1", *, ephemeral: tuple[int, int] | None = None) -> int:
    """A port nothing listens on now, below the ephemeral range when it leaves room, else any."""
    if host in ("", "0.0.0.0", "::"):  # noqa: S104 - compared, not bound
        host = "127.0.0.1"
    low, _ = ephemeral or ephemeral_range()
    if low - LOWEST_PORT >= 1000:
        for _ in range(ATTEMPTS):
            port = _rng.randrange(LOWEST_PORT, low)
            if bindable(host, port):
                return port
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])
