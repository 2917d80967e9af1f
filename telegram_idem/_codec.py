"""How results are stored: JSON, so ``None``, ``0``, ``""``, ``False``, ``{}`` replay exactly.

Pydantic models (aiogram's ``Message``…) and objects with ``to_dict()`` (PTB) are stored as
their JSON dict and replay as that dict. Tuples replay as lists.
"""

from __future__ import annotations

import json
from typing import Any, Protocol

from telegram_idem.errors import ResultEncodingError

__all__ = ["JsonCodec", "ResultCodec"]


class ResultCodec(Protocol):
    """Turns results into bytes and back."""

    def encode(self, value: Any) -> bytes:
        """Serialise ``value``; raises :class:`ResultEncodingError` if it cannot.

        Args:
            value: the handler's or step's result.
        """
        ...

    def decode(self, data: bytes) -> Any:
        """The value ``encode`` was given.

        Args:
            data: bytes :meth:`encode` made.
        """
        ...


def _default(obj: Any) -> Any:
    dump = getattr(obj, "model_dump", None)
    if callable(dump):
        return dump(mode="json", exclude_none=True, by_alias=True)
    to_dict = getattr(obj, "to_dict", None)
    if callable(to_dict):
        return to_dict()
    if isinstance(obj, (set, frozenset)):
        return sorted(obj)
    raise TypeError(f"{type(obj).__name__} is not JSON-serialisable")


class JsonCodec:
    """The default codec: compact UTF-8 JSON."""

    def encode(self, value: Any) -> bytes:
        """Serialise ``value``.

        Args:
            value: the handler's or step's result.

        Raises:
            ResultEncodingError: ``value`` is not JSON-serialisable.
        """
        try:
            return json.dumps(
                value, default=_default, ensure_ascii=False, separators=(",", ":")
            ).encode()
        except (TypeError, ValueError) as exc:
            raise ResultEncodingError(f"cannot store result: {exc}") from exc

    def decode(self, data: bytes) -> Any:
        """The stored value.

        Args:
            data: bytes :meth:`encode` made.
        """
        return json.loads(data)
