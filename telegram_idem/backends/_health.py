"""What a store's health check answers (:class:`StoreHealth`, the
:class:`~telegram_idem.backends.Checkable` ability's answer)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["StoreHealth"]


@dataclass(frozen=True, slots=True)
class StoreHealth:
    """A store's answer to ``await store.health()``: what serves it, what it expects to
    find there, what it found, and what is wrong.

    Attributes:
        server: the server (or library) and its version, e.g. ``"PostgreSQL 16.4"``,
            ``"Redis 7.2.4"``, ``"SQLite 3.45.1"`` (a cluster: each master's, joined).
        compared: what the check compares, in a few words (``"tables and their
            columns"``; a store without tables says what it checks instead, e.g.
            ``"server version and maxmemory-policy (Redis keeps no schema)"``).
        expected: the structures (tables) the store needs, in the store's order.
        found: those of ``expected`` that exist.
        schema_version: the schema version the store keeps, or ``None`` when it keeps
            none (then ``compared`` says what stands in for it).
        problems: what is wrong, one short sentence each (empty: nothing is).
    """

    server: str
    compared: str
    expected: tuple[str, ...] = ()
    found: tuple[str, ...] = ()
    schema_version: str | None = None
    problems: tuple[str, ...] = ()

    @property
    def missing(self) -> tuple[str, ...]:
        """The structures of ``expected`` not in ``found``, in ``expected`` order."""
        return tuple(name for name in self.expected if name not in self.found)

    @property
    def ok(self) -> bool:
        """True when nothing is wrong (no problem and nothing missing)."""
        return not self.problems and not self.missing
