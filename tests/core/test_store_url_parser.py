"""The one store-URL parser: typed options, unknown options refused, passwords never shown."""

from __future__ import annotations

import pytest

from telegram_idem.backends._url import StoreURL, redact
from telegram_idem.errors import ConfigurationError

SECRET = "pa55w0rd"


def parse(query: str, scheme: str = "redis") -> StoreURL:
    return StoreURL.parse(f"{scheme}://user:{SECRET}@host:6379/0?{query}", schemes=("redis",))


def test_typed_options_are_taken_and_defaults_fill_the_rest() -> None:
    url = parse("busy=2.5&n=7&flag=YES&name=x")
    assert url.take_seconds("busy", 5.0) == 2.5
    assert url.take_seconds("absent", 5.0) == 5.0
    assert url.take_int("n", 1, minimum=1) == 7
    assert url.take_bool("flag", False) is True
    assert url.take_bool("other", False) is False
    assert url.take_text("name") == "x"
    url.finish()


@pytest.mark.parametrize(
    ("query", "take", "needle"),
    [
        ("t=abc", lambda u: u.take_seconds("t", 1.0), "t must be seconds"),
        ("t=0", lambda u: u.take_seconds("t", 1.0), "t must be > 0 seconds"),
        ("t=-1", lambda u: u.take_seconds("t", 1.0, allow_zero=True), "≥ 0 seconds"),
        ("t=inf", lambda u: u.take_seconds("t", 1.0), "t must be > 0 seconds"),
        ("t=nan", lambda u: u.take_seconds("t", 1.0), "t must be > 0 seconds"),
        ("n=1.5", lambda u: u.take_int("n", 1), "n must be an integer"),
        ("n=0", lambda u: u.take_int("n", 1, minimum=1), "n must be an integer ≥ 1"),
        ("f=maybe", lambda u: u.take_bool("f", True), "f must be true or false"),
    ],
)
def test_a_bad_value_names_the_option_and_never_the_password(query, take, needle) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ConfigurationError) as info:
        take(parse(query))
    assert needle in str(info.value)
    assert SECRET not in str(info.value)
    assert "user:***@host" in str(info.value)


def test_zero_is_allowed_when_asked() -> None:
    assert parse("t=0").take_seconds("t", 1.0, allow_zero=True) == 0.0


def test_unknown_options_are_refused_sorted_without_the_password() -> None:
    url = parse("zeta=1&alpha=2")
    with pytest.raises(ConfigurationError) as info:
        url.finish()
    assert "['alpha', 'zeta']" in str(info.value)
    assert SECRET not in str(info.value)


def test_another_scheme_or_a_bad_port_is_refused_without_the_password() -> None:
    with pytest.raises(ConfigurationError) as info:
        StoreURL.parse(f"postgresql://u:{SECRET}@h/db", schemes=("redis", "rediss"))
    assert "redis://" in str(info.value) and SECRET not in str(info.value)
    with pytest.raises(ConfigurationError) as info:
        StoreURL.parse(f"redis://u:{SECRET}@h:notaport/0", schemes=("redis",))
    assert SECRET not in str(info.value)


def test_scheme_is_case_insensitive() -> None:
    assert StoreURL.parse("REDIS://h:1/0", schemes=("redis",)).scheme == "redis"


def test_passthrough_keeps_order_and_with_query_rebuilds_the_driver_url() -> None:
    url = parse("sslmode=require&table_prefix=t&application_name=a")
    assert url.take_text("table_prefix") == "t"
    rest = url.take_passthrough(["application_name", "sslmode"])
    assert rest == [("sslmode", "require"), ("application_name", "a")]
    url.finish()
    assert url.with_query(rest) == (
        f"redis://user:{SECRET}@host:6379/0?sslmode=require&application_name=a"
    )


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://h/0", "'redis://h/0'"),
        (f"redis://u:{SECRET}@h/0", "'redis://u:***@h/0'"),
        (f"redis://:{SECRET}@h/0", "'redis://:***@h/0'"),
        (f"postgresql://u:{SECRET}@[::1:5432/db", "'postgresql://…'"),
    ],
)
def test_redact(url: str, shown: str) -> None:
    assert redact(url) == shown


def test_multi_host_leaves_a_host_list_to_the_store() -> None:
    text = f"redis+cluster://:{SECRET}@h1:7000,h2:7001?key_prefix=p"
    with pytest.raises(ConfigurationError) as info:
        StoreURL.parse(text, schemes=("redis+cluster",))  # one port expected
    assert SECRET not in str(info.value)
    url = StoreURL.parse(text, schemes=("redis+cluster",), multi_host=True)
    assert url.parts.netloc.rpartition("@")[2] == "h1:7000,h2:7001"
    assert url.take_text("key_prefix") == "p"
    assert SECRET not in url.shown
