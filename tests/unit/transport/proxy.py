"""A TCP proxy on 127.0.0.1 that breaks its first connection once, after a given number of client bytes."""

from __future__ import annotations

import asyncio
import contextlib

Address = tuple[str, int]


class CuttingProxy:
    """Forwards every connection to ``upstream``; the first is broken once after ``cut_after`` client bytes.

    Exactly ``cut_after`` bytes from the client reach the upstream server on
    that first connection, then both sockets are closed; or, with ``inject``,
    those bytes are spliced into the stream there and forwarding goes on.
    Later connections are forwarded untouched. ``cuts`` counts the breaks (0 or 1).
    """

    def __init__(self, upstream: Address, cut_after: int, inject: bytes = b"") -> None:
        self.upstream = upstream
        self.cut_after = cut_after
        self.inject = inject
        self.cuts = 0
        self.connections = 0
        self.address: Address = ("127.0.0.1", 0)
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._handlers = 0
        self._idle = asyncio.Event()
        self._idle.set()

    async def __aenter__(self) -> CuttingProxy:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.address = ("127.0.0.1", self._server.sockets[0].getsockname()[1])
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        assert self._server is not None
        self._server.close()
        for writer in list(self._writers):
            writer.close()
        await self._server.wait_closed()
        await self._idle.wait()

    async def _handle(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        self._handlers += 1
        self._idle.clear()
        self.connections += 1
        limit = self.cut_after if self.connections == 1 else None
        writers = [client_writer]
        self._writers.add(client_writer)
        try:
            server_reader, server_writer = await asyncio.open_connection(*self.upstream)
            writers.append(server_writer)
            self._writers.add(server_writer)
            pipes = [
                asyncio.create_task(self._pipe(client_reader, server_writer, limit)),
                asyncio.create_task(self._pipe(server_reader, client_writer, None)),
            ]
            await asyncio.wait(pipes, return_when=asyncio.FIRST_COMPLETED)
            for writer in writers:
                writer.close()
            await asyncio.gather(*pipes)
        finally:
            for writer in writers:
                writer.close()
                with contextlib.suppress(OSError):
                    await writer.wait_closed()
                self._writers.discard(writer)
            self._handlers -= 1
            if not self._handlers:
                self._idle.set()

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, limit: int | None) -> None:
        """Copy ``reader`` to ``writer`` until EOF; break the stream once ``limit`` bytes are copied."""
        copied = 0
        with contextlib.suppress(OSError):
            while data := await reader.read(65536):
                if limit is not None and copied + len(data) >= limit:
                    writer.write(data[: limit - copied])
                    self.cuts += 1
                    if not self.inject:
                        await writer.drain()
                        return
                    data, limit = self.inject + data[limit - copied :], None
                copied += len(data)
                writer.write(data)
                await writer.drain()
