"""Conversation data on the network: served without credentials only on a loopback address.

The operator routes (``/escalations``, ``/trees/{id}``, ``/clusters``) show what was derived from
conversations. A listener that serves them on an address other than loopback (``127.0.0.1``,
``::1``, ``localhost``) without basic-auth users or bearer tokens would hand them to anyone who
reaches the port, which with the defaults (``0.0.0.0``, plain HTTP) is everyone on the network. Such
a listener does not serve them unless ``http.operator.allow_unauthenticated`` says so in so many
words (something else guards the port: a NetworkPolicy, a mesh, an authenticating proxy). Either
way the start logs one warning saying what happened and how to change it, and ``/readyz`` lists the
listener under the ``conversation-data`` check (never failing readiness).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

import structlog

from sidecar.lifecycle import Health

log = structlog.get_logger()

CHECK: Final = "conversation-data"


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a name: it may resolve to anything


@dataclass(frozen=True, slots=True)
class Exposure:
    """A listener that would serve conversation data without credentials on a non-loopback address."""

    listener: str
    host: str
    port: int
    served: bool

    def warn(self) -> None:
        where = f"{self.host}:{self.port}"
        if self.served:
            log.warning(
                "http.conversation_data_unauthenticated",
                listener=self.listener,
                address=where,
                detail="the operator routes are served without credentials (http.operator.allow_unauthenticated)",
            )
        else:
            log.warning(
                "http.conversation_data_withheld",
                listener=self.listener,
                address=where,
                detail="the operator routes are not served: set a web_config_file with basic_auth_users or "
                "bearer_token_sha256 for the listener that serves them, bind it to 127.0.0.1, or set "
                "http.operator.allow_unauthenticated: true if something else guards the port",
            )


def exposure(listener: str, host: str, port: int, *, protected: bool, allow: bool) -> Exposure | None:
    """What to do with the operator routes of a listener; None when it is protected or loopback."""
    if protected or is_loopback(host):
        return None
    return Exposure(listener, host, port, served=allow)


class ExposureReport:
    """The ``conversation-data`` line of ``/readyz``: listed, never gating readiness."""

    def __init__(self, exposures: Sequence[Exposure]) -> None:
        self._exposures = tuple(exposures)

    def health(self) -> Health:
        parts = [
            f"{e.listener} ({e.host}:{e.port}): "
            + ("served WITHOUT authentication" if e.served else "withheld (no authentication)")
            for e in self._exposures
        ]
        return Health(CHECK, True, "; ".join(parts))
