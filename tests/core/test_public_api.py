"""``telegram_idem.__all__`` lists exactly the public names the package exports (httpx style)."""

from __future__ import annotations

import inspect

import telegram_idem
from telegram_idem import errors


def public_names() -> set[str]:
    return {
        name
        for name, value in vars(telegram_idem).items()
        if not name.startswith("_") and not inspect.ismodule(value)
    }


def test_all_is_exactly_the_public_names() -> None:
    assert set(telegram_idem.__all__) == public_names()


def test_all_is_sorted_and_unique() -> None:
    assert telegram_idem.__all__ == sorted(telegram_idem.__all__)
    assert len(set(telegram_idem.__all__)) == len(telegram_idem.__all__)


def test_every_exported_name_resolves_and_belongs_to_the_package() -> None:
    for name in telegram_idem.__all__:
        value = getattr(telegram_idem, name)
        module = getattr(value, "__module__", "")
        assert module.startswith("telegram_idem"), (name, module)


def test_every_error_is_exported_and_derives_from_idem_error() -> None:
    for name in errors.__all__:
        assert name in telegram_idem.__all__, name
        assert issubclass(getattr(telegram_idem, name), telegram_idem.IdemError)


def test_version() -> None:
    assert isinstance(telegram_idem.__version__, str)
    assert telegram_idem.__version__.count(".") >= 2
