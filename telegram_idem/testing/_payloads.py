"""Update payloads without any I/O library: the shipped recorded updates, reading Update
JSON files, and the second tap of a double tap.

The real update payloads under ``fixtures/updates/`` ship with the package (their README
lists what each one exercises): `load_fixture` reads one by name, `fixture_names` lists
them, `load_update` reads any file. `make_double_tap` turns a callback query update into
the second tap on the same button (Bot API "CallbackQuery").
"""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = [
    "FIXTURES",
    "fixture_names",
    "load_fixture",
    "load_update",
    "make_double_tap",
    "update_id_of",
]

FIXTURES: Path = Path(__file__).resolve().parent / "fixtures" / "updates"
"""Directory of the shipped update payloads (``<name>.json`` plus a README)."""


def update_id_of(update: Mapping[str, Any]) -> int:
    """The integer ``update_id`` of ``update``.

    Raises:
        ValueError: none, or not an integer (a bool is not one).
    """
    update_id = update.get("update_id")
    if not isinstance(update_id, int) or isinstance(update_id, bool):
        raise ValueError("an update needs an integer update_id")
    return update_id


def make_double_tap(
    callback_update: Mapping[str, Any],
    new_update_id: int | None = None,
    *,
    new_callback_query_id: str | None = None,
) -> dict[str, Any]:
    """The second tap on the same inline button, as Telegram would send it.

    A deep copy of ``callback_update`` with a new ``update_id`` (default: the original + 1) and
    a new ``callback_query.id`` (default: the original id as a number + 1, Telegram's ids are
    numeric strings); ``from``, ``message``/``inline_message_id``, ``chat_instance`` and
    ``data`` are unchanged.

    :class:`~telegram_idem.testing.UpdateFactory` never hands out a callback query's
    ``update_id`` + 1 to another update, so the default second tap of a factory-made
    tap is not mistaken for (nor drops) the test's next update.

    Args:
        callback_update: the first tap (a callback query update).
        new_update_id: the second tap's ``update_id``; default the first's + 1.
        new_callback_query_id: the second tap's ``callback_query.id``; default the first's +
            1.

    Raises:
        ValueError: the update is not a ``callback_query``.
    """
    original_id = update_id_of(callback_update)
    query = callback_update.get("callback_query")
    if not isinstance(query, Mapping) or "id" not in query:
        raise ValueError("not a callback_query update")
    second = copy.deepcopy(dict(callback_update))
    second["update_id"] = original_id + 1 if new_update_id is None else new_update_id
    if new_callback_query_id is None:
        old = str(query["id"])
        new_callback_query_id = str(int(old) + 1) if old.isdigit() else f"{old}-2"
    if second["update_id"] == original_id or new_callback_query_id == str(query["id"]):
        raise ValueError("a second tap has a new update_id and a new callback query id")
    second["callback_query"]["id"] = new_callback_query_id
    return second


def load_update(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read one Update JSON file.

    Args:
        path: the JSON file.

    Raises:
        ValueError: it is not an object with an int ``update_id``.
        OSError: the file cannot be read.
    """
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    if not isinstance(data, dict):
        raise ValueError(f"{path}: an update is a JSON object")
    update_id_of(data)
    return data


def fixture_names() -> list[str]:
    """Names accepted by `load_fixture` (file stems, sorted), e.g. ``"callback_delete"``."""
    return sorted(p.stem for p in FIXTURES.glob("*.json"))


def load_fixture(name: str) -> dict[str, Any]:
    """A fresh copy of the shipped fixture ``name`` (with or without ``.json``).

    Args:
        name: the fixture's name (:func:`fixture_names`), with or without ``.json``.

    Raises:
        FileNotFoundError: an unknown name (the message lists the fixtures).
    """
    stem = name.removesuffix(".json")
    if stem not in fixture_names():
        raise FileNotFoundError(f"no fixture {name!r}; available: {', '.join(fixture_names())}")
    return load_update(FIXTURES / f"{stem}.json")
