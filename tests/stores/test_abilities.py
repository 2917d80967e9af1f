"""Abilities (inbox, migrate, purge) are asked through the protocols of
``telegram_idem.backends._abilities``; ``Store.inbox()`` agrees with them on every store.

The stores are made from URLs pointing nowhere (port 1): asking an ability connects to
nothing."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from telegram_idem import ConfigurationError, store_from_url
from telegram_idem._cli import cli
from telegram_idem.backends._abilities import (
    HasInbox,
    Migratable,
    Purgeable,
    as_migratable,
    as_purgeable,
    has_inbox,
    inbox_of,
)
from telegram_idem.backends.memory import MemoryStore
from telegram_idem.inbox._base import Inbox

# store → (URL, has an inbox, migratable, purgeable): the table of docs/stores.md.
ABILITIES = {
    "memory": ("memory://", True, False, False),
    "sqlite": ("sqlite:///{tmp}/a.db", True, False, True),
    "postgres": ("postgresql://postgres@127.0.0.1:1/test", True, True, True),
    "redis": ("redis://127.0.0.1:1/0", True, False, False),
    "dynamodb": (
        "dynamodb://abilities?region=us-east-1&endpoint_url=http://127.0.0.1:1",
        False,
        True,
        False,
    ),
}


@pytest.mark.parametrize("name", sorted(ABILITIES))
async def test_each_store_has_the_abilities_the_docs_list(name: str, tmp_path: Path) -> None:
    url, inbox, migratable, purgeable = ABILITIES[name]
    store = store_from_url(url.format(tmp=tmp_path))
    try:
        assert has_inbox(store) is inbox
        assert isinstance(store, Migratable) is migratable
        assert isinstance(store, Purgeable) is purgeable
        if inbox:
            assert isinstance(inbox_of(store), Inbox)
            assert inbox_of(store) is store.inbox()  # one inbox per store
        else:
            with pytest.raises(ConfigurationError) as asked:
                inbox_of(store)
            with pytest.raises(ConfigurationError) as called:
                store.inbox()
            assert str(asked.value) == str(called.value)
            assert repr(store) in str(asked.value) and "HasInbox" in str(asked.value)
    finally:
        await store.close()


def test_every_store_answers_inbox_so_isinstance_alone_does_not_tell() -> None:
    store = store_from_url("dynamodb://abilities?region=us-east-1&endpoint_url=http://127.0.0.1:1")
    assert isinstance(store, HasInbox) and not has_inbox(store)


class Duck:
    """Not a Store: abilities are structural."""

    def __init__(self) -> None:
        self.box = MemoryStore().inbox()

    def inbox(self) -> Inbox:
        return self.box

    async def purge(self) -> int:
        return 7


async def test_any_object_with_the_method_has_the_ability() -> None:
    duck = Duck()
    assert has_inbox(duck) and inbox_of(duck) is duck.box
    assert await as_purgeable(duck).purge() == 7
    with pytest.raises(ConfigurationError, match=r"has no migrate\(\).*Migratable"):
        as_migratable(duck)
    assert not has_inbox(object())
    with pytest.raises(ConfigurationError, match="has no inbox"):
        inbox_of(object())


async def test_as_purgeable_hands_back_the_store(tmp_path: Path) -> None:
    store = store_from_url(f"sqlite:///{tmp_path / 'p.db'}")
    try:
        purgeable: object = as_purgeable(store)  # a Purgeable, seen as any object
        assert purgeable is store
        assert await as_purgeable(store).purge() == 0
        with pytest.raises(ConfigurationError, match=r"SQLiteStore\(.*\) has no migrate\(\)"):
            as_migratable(store)
    finally:
        await store.close()
    with pytest.raises(ConfigurationError, match=r"MemoryStore\(\) has no purge\(\)"):
        as_purgeable(MemoryStore())


class MigratingStore(MemoryStore, schemes=("idem-migrating",)):
    """A third-party store with the Migratable ability."""

    migrated = 0

    @classmethod
    def from_url(cls, url: str, *, clock: object = None) -> MigratingStore:
        return cls()

    async def migrate(self) -> bool:
        type(self).migrated += 1
        return True


def test_cli_migrate_asks_the_migratable_protocol() -> None:
    runner = CliRunner()
    result = runner.invoke(cli, ["migrate", "idem-migrating://x"])
    assert result.exit_code == 0, result.output
    assert MigratingStore.migrated == 1
    assert "migrated MigratingStore()" in result.output
    result = runner.invoke(cli, ["migrate", "memory://"])
    assert result.exit_code == 0 and "nothing to migrate" in result.output
