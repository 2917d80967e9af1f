"""Counting asyncpg protocol calls, each one network round trip (shared by the
PostgreSQL store and inbox tests)."""

from __future__ import annotations

from typing import Any

from asyncpg import Connection

_ROUND_TRIPS = frozenset(
    {
        "prepare",
        "bind_execute",
        "bind_execute_many",
        "bind",
        "execute",
        "query",
        "close_statement",
        "copy_in",
        "copy_out",
    }
)


class Trips:
    """Protocol calls seen, as ``(name, statement name for prepare / None)``."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str | None]] = []

    @property
    def names(self) -> list[str]:
        return [name for name, _ in self.calls]

    def clear(self) -> None:
        self.calls.clear()


class _CountingProtocol:
    def __init__(self, inner: Any, trips: Trips) -> None:
        object.__setattr__(self, "_inner", inner)
        object.__setattr__(self, "_trips", trips)

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._inner, name)
        if name not in _ROUND_TRIPS:
            return attr

        def counted(*args: Any, **kwargs: Any) -> Any:
            stmt_name = args[0] if name == "prepare" and args else None
            self._trips.calls.append((name, stmt_name))
            return attr(*args, **kwargs)

        return counted

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._inner, name, value)


def counting_connection_class(trips: Trips) -> type[Connection]:
    class CountingConnection(Connection):
        _protocol: Any  # a slot of Connection; asyncpg-stubs give it no type

        def __init__(self, protocol: Any, *args: Any, **kwargs: Any) -> None:
            super().__init__(protocol, *args, **kwargs)
            self._protocol = _CountingProtocol(self._protocol, trips)

    return CountingConnection
