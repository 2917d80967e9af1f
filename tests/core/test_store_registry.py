"""The scheme registry: the built-in table, the ``schemes=`` class keyword, and entry
points of the group ``telegram_idem.stores`` found in real distribution metadata
(``*.dist-info`` directories on a temporary ``sys.path`` entry), loaded only when an
unknown scheme is asked."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Iterator
from importlib import import_module
from pathlib import Path

import pytest

from telegram_idem import ConfigurationError, store_from_url
from telegram_idem.backends import SCHEMES, known_schemes
from telegram_idem.backends._base import Store
from telegram_idem.backends._registry import BUILTIN_STORES, ENTRY_POINT_GROUP
from telegram_idem.backends.memory import MemoryStore

STORE_MODULE = '''
from telegram_idem.backends.memory import MemoryStore


class {name}(MemoryStore{keyword}):
    """A third-party store (records kept as the memory store keeps them)."""

    made_from = ""

    @classmethod
    def from_url(cls, url, *, clock=None):
        store = cls()
        store.made_from = url
        return store
'''


def distribution(root: Path, name: str, entry_points: dict[str, str]) -> None:
    """An installed distribution ``name`` under ``root``: its ``dist-info`` with the
    ``telegram_idem.stores`` entry points (scheme → ``module:Class``)."""
    info = root / f"{name.replace('-', '_')}-1.0.dist-info"  # as a wheel installs it
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    lines = [f"[{ENTRY_POINT_GROUP}]"] + [f"{k} = {v}" for k, v in entry_points.items()]
    (info / "entry_points.txt").write_text("\n".join(lines) + "\n")


def store_module(root: Path, module: str, cls: str, *, schemes: tuple[str, ...] = ()) -> None:
    keyword = f", schemes={schemes!r}" if schemes else ""
    (root / f"{module}.py").write_text(STORE_MODULE.format(name=cls, keyword=keyword))


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A directory on ``sys.path`` (like site-packages); modules imported from it are
    forgotten afterwards."""
    monkeypatch.syspath_prepend(str(tmp_path))
    before = set(sys.modules)
    yield tmp_path
    for name in set(sys.modules) - before:
        module = sys.modules[name]
        if str(getattr(module, "__file__", "") or "").startswith(str(tmp_path)):
            del sys.modules[name]


# ----------------------------------------------------------------- built-in table


def test_each_built_in_store_gets_its_schemes_from_the_table() -> None:
    for builtin in BUILTIN_STORES:
        cls = getattr(import_module(builtin.module), builtin.name)
        assert cls.schemes == builtin.schemes
        for scheme in builtin.schemes:
            assert SCHEMES[scheme] == (builtin.module, builtin.name, builtin.extra or "")
    assert set(SCHEMES) <= set(known_schemes())


def test_a_built_in_class_declaring_other_schemes_is_refused() -> None:
    namespace = {
        "__module__": "telegram_idem.backends.memory._shadow",
        "__qualname__": "MemoryStore",
    }
    with pytest.raises(ConfigurationError, match="BUILTIN_STORES gives it"):
        type("MemoryStore", (Store,), namespace, schemes=("memory", "memory2"))

    assert type(store_from_url("memory://")).__module__ == "telegram_idem.backends.memory._records"


def test_the_core_imports_no_driver_and_a_missing_one_names_its_extra() -> None:
    script = textwrap.dedent(
        """
        import sys
        sys.modules["asyncpg"] = None  # as if not installed: importing it fails
        from telegram_idem import store_from_url, ConfigurationError
        store_from_url("memory://")
        store_from_url("sqlite:///:memory:")
        loaded = [m for m in ("telegram_idem.backends.postgres", "telegram_idem.backends.redis",
                              "telegram_idem.backends.dynamodb", "redis", "aiobotocore")
                  if m in sys.modules]
        assert loaded == [], loaded
        try:
            store_from_url("postgresql://bot@db/bot")
        except ConfigurationError as exc:
            print(exc)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True
    ).stdout
    assert "postgresql:// needs pip install 'telegram-idem[postgres]'" in out


# ----------------------------------------------------------------- class keyword


class KeywordStore(MemoryStore, schemes=("idemkw", "idemkw+b")):
    """Registered by the class keyword."""

    @classmethod
    def from_url(cls, url: str, *, clock: object = None) -> KeywordStore:
        return cls()


def test_the_schemes_keyword_registers_a_store() -> None:
    assert KeywordStore.schemes == ("idemkw", "idemkw+b")
    assert isinstance(store_from_url("idemkw://x"), KeywordStore)
    assert isinstance(store_from_url("IDEMKW+B://x"), KeywordStore)
    assert {"idemkw", "idemkw+b"} <= set(known_schemes())


def test_a_subclass_of_a_keyword_store_inherits_its_schemes_but_serves_none() -> None:
    class Quiet(KeywordStore):
        pass

    assert Quiet.schemes == KeywordStore.schemes
    assert type(store_from_url("idemkw://x")) is KeywordStore


def test_schemes_given_twice_or_as_one_string_are_refused() -> None:
    with pytest.raises(ConfigurationError, match="declare schemes once"):

        class Twice(MemoryStore, schemes=("idemtwice",)):
            schemes = ("idemtwice",)

    with pytest.raises(ConfigurationError, match="must be a tuple of strings"):

        class Text(MemoryStore, schemes="idemtext"):
            pass

    with pytest.raises(ConfigurationError, match="already served by"):

        class Taken(MemoryStore, schemes=("idemkw",)):
            pass

    for scheme in ("idemtwice", "idemtext", "i", "d"):
        assert scheme not in known_schemes()


# ----------------------------------------------------------------- entry points


def test_an_entry_point_store_is_imported_only_when_its_scheme_is_asked(site: Path) -> None:
    store_module(site, "idem_ep_lazy", "LazyStore")
    distribution(site, "idem-ep-lazy", {"ideplazy": "idem_ep_lazy:LazyStore"})

    assert isinstance(store_from_url("memory://"), MemoryStore)
    assert "ideplazy" in known_schemes()  # read from the metadata, not imported
    assert "idem_ep_lazy" not in sys.modules

    store = store_from_url("ideplazy://host/x?y=1")
    assert type(store).__name__ == "LazyStore" and isinstance(store, Store)
    assert store.made_from == "ideplazy://host/x?y=1"  # type: ignore[attr-defined]
    assert "idem_ep_lazy" in sys.modules
    assert type(store_from_url("ideplazy://again")) is type(store)


def test_an_entry_point_class_may_declare_its_schemes_too(site: Path) -> None:
    store_module(site, "idem_ep_declared", "DeclaredStore", schemes=("idepdeclared",))
    distribution(site, "idem-ep-declared", {"idepdeclared": "idem_ep_declared:DeclaredStore"})
    store = store_from_url("idepdeclared://x")
    assert type(store).schemes == ("idepdeclared",)


def test_an_entry_point_never_shadows_a_built_in_scheme(site: Path) -> None:
    distribution(site, "idem-ep-shadow", {"memory": "idem_ep_shadow:Nope"})
    assert isinstance(store_from_url("memory://"), MemoryStore)
    assert "idem_ep_shadow" not in sys.modules


def test_a_broken_entry_point_is_a_configuration_error_naming_it(site: Path) -> None:
    distribution(
        site,
        "idem-ep-broken",
        {"idepmissing": "idem_ep_no_such_module:Store", "idepnotastore": "json:JSONDecoder"},
    )
    with pytest.raises(ConfigurationError, match=r"idepmissing = idem_ep_no_such_module:Store"):
        store_from_url("idepmissing://x")
    with pytest.raises(ConfigurationError, match="not a Store class"):
        store_from_url("idepnotastore://x")


def test_two_distributions_declaring_one_scheme_are_refused(site: Path) -> None:
    store_module(site, "idem_ep_one", "OneStore")
    store_module(site, "idem_ep_two", "TwoStore")
    distribution(site, "idem-ep-one", {"ideptwice": "idem_ep_one:OneStore"})
    distribution(site, "idem-ep-two", {"ideptwice": "idem_ep_two:TwoStore"})
    with pytest.raises(ConfigurationError, match=r"several telegram_idem\.stores entry points"):
        store_from_url("ideptwice://x")
    assert "idem_ep_one" not in sys.modules and "idem_ep_two" not in sys.modules


def test_an_unknown_scheme_lists_every_known_one(site: Path) -> None:
    distribution(site, "idem-ep-listed", {"ideplisted": "idem_ep_listed:Store"})
    with pytest.raises(ConfigurationError, match=r"unknown store URL scheme") as info:
        store_from_url("nosuchstore://user:secret@x")
    message = str(info.value)
    assert "ideplisted://" in message and "sqlite://" in message and "idemkw://" in message
    assert "secret" not in message
