"""A loopback TCP proxy in front of the real vLLM server, to make it go down, slow, and come back."""

from __future__ import annotations

import asyncio
import contextlib
import socket


class ToggleProxy:
    """Listens on ``port`` when up; forwards to ``upstream``, each connection delayed by ``delay``."""

    def __init__(self, upstream_host: str, upstream_port: int) -> None:
        self.upstream = (upstream_host, upstream_port)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = int(s.getsockname()[1])
        self.delay_seconds = 0.0
        self._server: asyncio.Server | None = None
        self._conns: set[asyncio.Task[None]] = set()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    async def up(self) -> None:
        if self._server is None:
            self._server = await asyncio.start_server(self._handle, "127.0.0.1", self.port, reuse_address=True)

    async def down(self) -> None:
        """Stop listening and cut every open connection (connection refused from now on)."""
        server, self._server = self._server, None
        if server is not None:
            server.close()
        for t in list(self._conns):
            t.cancel()
        for t in list(self._conns):
            with contextlib.suppress(asyncio.CancelledError):
                await t
        if server is not None:
            await server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._conns.add(task)
        up_writer: asyncio.StreamWriter | None = None
        try:
            if self.delay_seconds:
                await asyncio.sleep(self.delay_seconds)
            up_reader, up_writer = await asyncio.open_connection(*self.upstream)
            await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            self._conns.discard(task)
            for w in (writer, up_writer):
                if w is not None:
                    w.close()

    @staticmethod
    async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
        with contextlib.suppress(OSError):
            writer.write_eof()
