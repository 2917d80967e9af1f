"""Serving an aiohttp app on a free loopback port: the shared base of the fake servers."""

from __future__ import annotations

from types import TracebackType
from typing import Self

from aiohttp import web

__all__ = ["LoopbackServer", "serve_app"]


async def serve_app(app: web.Application, *, host: str = "127.0.0.1") -> tuple[web.AppRunner, str]:
    """Serve ``app`` on a free port of ``host``; returns the runner and ``http://host:port``.

    Args:
        app: the aiohttp application.
        host: the address to bind.

    Raises:
        OSError: the port could not be bound.
    """
    runner = web.AppRunner(app, shutdown_timeout=1.0, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, 0)
    await site.start()
    bound_host, port = runner.addresses[0][:2]
    return runner, f"http://{bound_host}:{port}"


class LoopbackServer:
    """A fake server's lifecycle: ``start()`` / ``close()`` / ``async with`` / ``url``.

    Subclasses build their app in :meth:`make_app` and may act before closing in
    :meth:`before_close`.
    """

    def __init__(self) -> None:
        self._runner: web.AppRunner | None = None
        self._url: str | None = None

    def make_app(self) -> web.Application:
        raise NotImplementedError

    async def before_close(self) -> None:
        """Called once before the server stops (e.g. to answer pending long polls)."""

    async def start(self) -> None:
        """Bind ``127.0.0.1`` on a free port and serve.

        Raises:
            RuntimeError: it is started already.
        """
        if self._runner is not None:
            raise RuntimeError(f"{type(self).__name__} already started")
        self._runner, self._url = await serve_app(self.make_app())

    async def close(self) -> None:
        """Stop serving. Idempotent."""
        if self._runner is None:
            return
        await self.before_close()
        runner, self._runner = self._runner, None
        await runner.cleanup()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    @property
    def url(self) -> str:
        """Base URL, ``http://127.0.0.1:<port>``. Raises `RuntimeError` before start."""
        if self._url is None:
            raise RuntimeError(f"{type(self).__name__} not started")
        return self._url
