"""``telegram_idem.testing.__all__`` is the curated public surface (httpx style), and the
aiohttp-based helpers load lazily."""

from __future__ import annotations

import inspect

import telegram_idem.testing as testing


def test_all_is_sorted_unique_and_resolves() -> None:
    names = testing.__all__
    assert len(set(names)) == len(names)
    # constants, then classes, then functions, each alphabetical (ruff's RUF022 order)
    assert names == sorted(names, key=lambda n: (not n.isupper(), not n[0].isupper(), n))
    for name in names:
        value = getattr(testing, name)
        if inspect.isclass(value) or inspect.isfunction(value):
            # the webhook sender's results live beside it in telegram_idem._delivery, which
            # telegram-idem replay uses without the test toolkit
            home = value.__module__
            assert home.startswith("telegram_idem.testing.") or home == "telegram_idem._delivery", (
                name
            )

    assert set(names) <= set(dir(testing))


def test_every_public_name_is_in_all() -> None:
    public = {
        name
        for name, value in vars(testing).items()
        if not name.startswith("_") and not inspect.ismodule(value) and name != "annotations"
    }
    assert public <= set(testing.__all__)


def test_the_plugin_fixtures_are_documented_in_the_plugin_module() -> None:
    from telegram_idem.testing import plugin

    for fixture in (
        "idem",
        "idem_store",
        "idem_clock",
        "idem_store_name",
        "idem_store_url",
        "idem_store_url_factory",
        "idem_store_factory",
        "idem_key_prefix",
        "idem_keys",
        "update_factory",
        "fake_bot_api",
        "telegram_delivery",
        "replay",
    ):
        assert hasattr(plugin, fixture), fixture
        assert f"``{fixture}``" in (plugin.__doc__ or ""), fixture
