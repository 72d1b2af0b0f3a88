"""Authentication of a listener: basic auth (bcrypt hashes), bearer tokens (SHA-256 digests), and a
per-client limit on failed attempts.

:class:`Authenticator` is an aiohttp middleware. A request passes when the listener demands nothing
(no users, no tokens), when its path is open (the health endpoints, by default), or when it carries
``Authorization: Basic`` credentials of a configured user or ``Authorization: Bearer`` a token whose
SHA-256 is configured. Otherwise it gets 401 with ``WWW-Authenticate: Basic realm="sidecar"`` (and
``Bearer realm="sidecar"`` when tokens are configured).

Guarantees:

* Constant time: token digests are compared with :func:`hmac.compare_digest`, each against every
  configured one; passwords with bcrypt's own check. An unknown user's password is checked against
  a hash of the same cost, so the answer's timing does not tell which user names exist.
* bcrypt is slow on purpose (tens to hundreds of ms a check), so it runs in a worker thread, never
  on the event loop, at most :data:`BCRYPT_SLOTS` at once, and results are cached in a bounded LRU
  keyed by a SHA-256 of user, password and hash (the exporter-toolkit caches likewise): a scraper's
  repeated credentials cost one check.
* Failures are counted in ``sidecar_http_auth_failures_total{listener,reason}`` (reason
  ``missing``, ``malformed``, ``invalid``, ``rate_limited``). A client address that fails (malformed
  or invalid credentials) ``max_failures`` times within ``window_seconds`` gets 429 with
  ``Retry-After`` for the rest of the window, before any bcrypt work. Missing credentials do not
  count towards the limit (a browser's first request carries none). The table of addresses is
  bounded (:data:`MAX_TRACKED_CLIENTS`, least recently failing dropped first).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import hmac
import math
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Collection, Mapping
from typing import Final

import bcrypt
import structlog
from aiohttp import web
from prometheus_client import Counter

log = structlog.get_logger()

REALM: Final = "sidecar"
BCRYPT_SLOTS: Final = 2
CACHE_ENTRIES: Final = 1024
MAX_TRACKED_CLIENTS: Final = 4096
# bcrypt only reads the first 72 bytes of a password (and the bcrypt package refuses longer ones);
# a longer password is refused outright rather than silently cut.
MAX_PASSWORD_BYTES: Final = 72
_BCRYPT_COST: Final = slice(4, 6)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class FailureLimiter:
    """Failed attempts per client address in a fixed window, for at most ``max_clients`` addresses."""

    def __init__(
        self,
        max_failures: int,
        window_seconds: float,
        *,
        max_clients: int = MAX_TRACKED_CLIENTS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._max = max_failures
        self._window = window_seconds
        self._max_clients = max_clients
        self._clock = clock
        self._clients: OrderedDict[str, tuple[float, int]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._clients)

    def retry_after(self, client: str) -> int | None:
        """Whole seconds until ``client`` may try again, or None when it is not limited."""
        entry = self._clients.get(client)
        if entry is None:
            return None
        start, failures = entry
        left = start + self._window - self._clock()
        if left <= 0:
            del self._clients[client]
            return None
        return max(1, math.ceil(left)) if failures >= self._max else None

    def failed(self, client: str) -> bool:
        """Record a failure; True when it is the one that puts ``client`` over the limit."""
        now = self._clock()
        start, failures = self._clients.pop(client, (now, 0))
        if now - start >= self._window:
            start, failures = now, 0
        self._clients[client] = (start, failures + 1)
        while len(self._clients) > self._max_clients:
            self._clients.popitem(last=False)
        return failures + 1 == self._max


class _Lru:
    """A bounded mapping that forgets the least recently used entry first."""

    def __init__(self, size: int) -> None:
        self._size = size
        self._items: OrderedDict[bytes, bool] = OrderedDict()

    def get(self, key: bytes) -> bool | None:
        value = self._items.get(key)
        if value is not None:
            self._items.move_to_end(key)
        return value

    def put(self, key: bytes, value: bool) -> None:
        self._items[key] = value
        self._items.move_to_end(key)
        while len(self._items) > self._size:
            self._items.popitem(last=False)

    def __len__(self) -> int:
        return len(self._items)


class Authenticator:
    """The middleware of one listener; see the module docstring for what it guarantees."""

    def __init__(
        self,
        listener: str,
        *,
        users: Mapping[str, bytes],
        token_sha256: Collection[str],
        open_paths: Collection[str],
        limiter: FailureLimiter,
        failures: Counter,
    ) -> None:
        self._listener = listener
        self._users = dict(users)
        self._tokens = [bytes.fromhex(t) for t in token_sha256]
        self._open = frozenset(open_paths)
        self._limiter = limiter
        self._failures = failures
        self._cache = _Lru(CACHE_ENTRIES)
        self._slots = asyncio.Semaphore(BCRYPT_SLOTS)
        # An unknown user is checked against a hash of the configured cost, so it takes as long.
        cost = max((int(h[_BCRYPT_COST]) for h in self._users.values()), default=4)
        self._decoy = bcrypt.hashpw(b"decoy", bcrypt.gensalt(rounds=cost)) if self._users else b""
        challenges = [f'Basic realm="{REALM}"'] if self._users else []
        challenges += [f'Bearer realm="{REALM}"'] if self._tokens else []
        self._challenges = tuple(challenges)
        for reason in ("missing", "malformed", "invalid", "rate_limited"):
            failures.labels(listener, reason)  # every series exists from the start, at 0

    @property
    def required(self) -> bool:
        """Whether this listener demands credentials at all."""
        return bool(self._challenges)

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if not self.required or request.path in self._open:
            return await handler(request)
        client = request.remote or "unknown"
        wait = self._limiter.retry_after(client)
        if wait is not None:
            self._failures.labels(self._listener, "rate_limited").inc()
            return web.Response(status=429, text="too many failed attempts\n", headers={"Retry-After": str(wait)})
        header = request.headers.get("Authorization")
        if header is None:
            self._failures.labels(self._listener, "missing").inc()
            return self._unauthorized()
        verdict = await self._check(header)
        if verdict is None:
            return await handler(request)
        self._failures.labels(self._listener, verdict).inc()
        if self._limiter.failed(client):
            log.warning("http.auth_rate_limited", listener=self._listener, client=client)
        else:
            log.info("http.auth_failed", listener=self._listener, client=client, reason=verdict)
        return self._unauthorized()

    def _unauthorized(self) -> web.Response:
        response = web.Response(status=401, text="unauthorized\n")
        for challenge in self._challenges:
            response.headers.add("WWW-Authenticate", challenge)
        return response

    async def _check(self, header: str) -> str | None:
        """None when the credentials are good, else the failure reason."""
        scheme, _, value = header.strip().partition(" ")
        scheme, value = scheme.lower(), value.strip()
        if scheme == "bearer" and self._tokens and value:
            return None if self._token_ok(value) else "invalid"
        if scheme != "basic" or not self._users:
            return "malformed"
        try:
            decoded = base64.b64decode(value, validate=True)
            user_bytes, sep, password = decoded.partition(b":")
            user = user_bytes.decode("utf-8")
        except (binascii.Error, ValueError):
            return "malformed"
        if not sep:
            return "malformed"
        return None if await self._password_ok(user, password) else "invalid"

    def _token_ok(self, token: str) -> bool:
        digest = hashlib.sha256(token.encode("utf-8", "surrogateescape")).digest()
        ok = False
        for known in self._tokens:  # no early exit: the time does not say which entry matched
            ok |= hmac.compare_digest(digest, known)
        return ok

    async def _password_ok(self, user: str, password: bytes) -> bool:
        hashed = self._users.get(user)
        target = hashed if hashed is not None else self._decoy
        if len(password) > MAX_PASSWORD_BYTES:
            return False
        key = hashlib.sha256(b"\0".join((user.encode(), password, target))).digest()
        ok = self._cache.get(key)
        if ok is None:
            async with self._slots:
                ok = await asyncio.to_thread(bcrypt.checkpw, password, target)
            self._cache.put(key, ok)
        return ok and hashed is not None


__all__ = ["BCRYPT_SLOTS", "CACHE_ENTRIES", "MAX_TRACKED_CLIENTS", "REALM", "Authenticator", "FailureLimiter"]
