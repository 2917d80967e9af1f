"""Reading recorded updates for ``telegram-idem replay``: every file is read and checked
before anything is sent.

A file holds one Update (a JSON object), a JSON array of updates, or several objects one
after another (JSON Lines, or pretty-printed objects back to back); ``-`` is standard
input. Every entry must be a JSON object with an integer ``update_id`` (Bot API "Getting
updates" → ``Update``). A file that is not UTF-8 or not JSON, an empty file, or an entry
that is not an update is refused with the file's name and the line and column where the
problem is (:class:`UpdateFileError`).
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

__all__ = ["Recorded", "UpdateFileError", "parse_updates", "read_update_files"]

_WHITESPACE = re.compile(r"[ \t\n\r]*")
_DECODER = json.JSONDecoder()


class UpdateFileError(ValueError):
    """A file of updates that cannot be replayed; the message names the file and the
    position (``FILE:LINE:COLUMN: what is wrong``)."""


@dataclass(frozen=True, slots=True)
class Recorded:
    """One update read from a file.

    Attributes:
        update: the Update, as parsed (a JSON object with an integer ``update_id``).
        source: where it was read, ``FILE:LINE`` (``<stdin>`` for ``-``).
    """

    update: dict[str, Any]
    source: str

    @property
    def update_id(self) -> int:
        """The update's ``update_id``."""
        update_id: int = self.update["update_id"]
        return update_id


def read_update_files(paths: Iterable[str], *, stdin: TextIO | None = None) -> list[Recorded]:
    """Every update of every file in ``paths``, in order (a file given twice is read twice).

    Args:
        paths: file names; ``-`` reads ``stdin`` (default ``sys.stdin``), once.
        stdin: where ``-`` reads from.

    Raises:
        UpdateFileError: a file cannot be read, is not UTF-8, is not JSON, holds no update,
            or holds an entry without an integer ``update_id``; nothing of any file is
            returned.
    """
    recorded: list[Recorded] = []
    for path in paths:
        if path == "-":
            name = "<stdin>"
            text = (stdin or sys.stdin).read()
        else:
            name = path
            try:
                raw = Path(path).read_bytes()
            except OSError as exc:
                raise UpdateFileError(f"{name}: cannot be read: {exc.strerror or exc}") from None
            try:
                text = raw.decode("utf-8-sig")
            except UnicodeDecodeError as exc:
                raise UpdateFileError(f"{name}: not UTF-8 (byte {exc.start})") from None
        recorded.extend(parse_updates(text, name))
    return recorded


def parse_updates(text: str, name: str) -> list[Recorded]:
    """The updates in ``text`` (read from ``name``): one object, an array of objects, or
    objects one after another (JSON Lines).

    Raises:
        UpdateFileError: ``text`` is not JSON, holds nothing, or an entry is not an
            update; the message is ``name:LINE:COLUMN: …``.
    """
    text = text.removeprefix("\ufeff")
    start = _skip(text, 0)
    if start == len(text):
        raise UpdateFileError(f"{name}: no update in it (the file is empty)")
    if text[start] == "[":
        entries = _array(text, name, start)
        if not entries:
            raise UpdateFileError(f"{_at(name, text, start)}: an empty array, no update in it")
    else:
        entries = _sequence(text, name, start)
    return [_checked(value, name, text, pos) for value, pos in entries]


def _array(text: str, name: str, start: int) -> list[tuple[object, int]]:
    """The values of the array that opens at ``start`` (and nothing after it)."""
    entries: list[tuple[object, int]] = []
    pos = _skip(text, start + 1)
    if pos < len(text) and text[pos] == "]":
        pos += 1
    else:
        while True:
            value, end = _decode(text, name, pos)
            entries.append((value, pos))
            pos = _skip(text, end)
            if pos < len(text) and text[pos] == ",":
                pos = _skip(text, pos + 1)
                continue
            if pos < len(text) and text[pos] == "]":
                pos += 1
                break
            found = "the end of the file" if pos == len(text) else repr(text[pos])
            raise UpdateFileError(f"{_at(name, text, pos)}: expected ',' or ']', found {found}")
    pos = _skip(text, pos)
    if pos != len(text):
        raise UpdateFileError(f"{_at(name, text, pos)}: more after the array's closing ']'")
    return entries


def _sequence(text: str, name: str, start: int) -> list[tuple[object, int]]:
    """JSON values one after another from ``start`` to the end (one, or JSON Lines)."""
    entries: list[tuple[object, int]] = []
    pos = start
    while pos < len(text):
        value, end = _decode(text, name, pos, line_first=True)
        entries.append((value, pos))
        pos = _skip(text, end)
    return entries


def _decode(text: str, name: str, pos: int, *, line_first: bool = False) -> tuple[object, int]:
    """The JSON value at ``pos`` and where it ends. With ``line_first`` (JSON Lines), a
    value that does not parse is reported on its own line when that line does not parse
    alone either: the decoder would otherwise name the next line, where it gave up."""
    try:
        return _DECODER.raw_decode(text, pos)
    except json.JSONDecodeError as exc:
        error = exc
        if line_first:
            eol = text.find("\n", pos)
            line = text[: len(text) if eol < 0 else eol]
            try:
                _DECODER.raw_decode(line, pos)
            except json.JSONDecodeError as own:
                error = own
            except RecursionError:
                pass
        raise UpdateFileError(
            f"{name}:{error.lineno}:{error.colno}: not JSON ({error.msg})"
        ) from None
    except RecursionError:  # nesting deeper than the interpreter's stack: no update is
        raise UpdateFileError(
            f"{_at(name, text, pos)}: nested too deeply to be an update"
        ) from None


def _checked(value: object, name: str, text: str, pos: int) -> Recorded:
    where = _at(name, text, pos)
    if not isinstance(value, dict):
        raise UpdateFileError(f"{where}: not an update (a {_kind(value)}, not a JSON object)")
    update_id = value.get("update_id")
    if update_id is None:
        raise UpdateFileError(f"{where}: an update without 'update_id'")
    if not isinstance(update_id, int) or isinstance(update_id, bool):
        raise UpdateFileError(f"{where}: 'update_id' is not an integer ({update_id!r})")
    line = text.count("\n", 0, pos) + 1
    return Recorded(value, f"{name}:{line}")


def _skip(text: str, pos: int) -> int:
    match = _WHITESPACE.match(text, pos)
    return pos if match is None else match.end()


def _at(name: str, text: str, pos: int) -> str:
    """``name:LINE:COLUMN`` of offset ``pos`` (both counted from 1)."""
    line = text.count("\n", 0, pos) + 1
    column = pos - (text.rfind("\n", 0, pos) + 1) + 1
    return f"{name}:{line}:{column}"


def _kind(value: object) -> str:
    if isinstance(value, list):
        return "JSON array"
    if isinstance(value, str):
        return "string"
    if isinstance(value, bool):
        return "boolean"
    if value is None:
        return "null"
    return "number"
