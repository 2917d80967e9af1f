"""A loopback TCP proxy to a real store server that a test cuts and restores."""

from __future__ import annotations

import asyncio
import contextlib

__all__ = ["Proxy"]


class Proxy:
    """A TCP forwarder on loopback to a real server, that can be cut and restored on the
    same port (the store sees its server go away and come back)."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.port = 0
        self.server: asyncio.Server | None = None
        self.pipes: set[asyncio.Task[None]] = set()
        self.writers: list[asyncio.StreamWriter] = []

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)
        self.port = self.server.sockets[0].getsockname()[1]

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(*self.target)
        self.writers += [writer, up_writer]
        for source, sink in ((reader, up_writer), (up_reader, writer)):
            task = asyncio.create_task(self._pipe(source, sink))
            self.pipes.add(task)
            task.add_done_callback(self.pipes.discard)

    @staticmethod
    async def _pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError):
            while data := await source.read(65536):
                sink.write(data)
                await sink.drain()
        sink.close()

    async def cut(self) -> None:
        assert self.server is not None
        self.server.close()
        for writer in self.writers:
            writer.close()
        self.writers.clear()
        await self.server.wait_closed()
        for task in list(self.pipes):
            task.cancel()
        await asyncio.gather(*self.pipes, return_exceptions=True)
