"""Signed callback tokens: ≤ 64 bytes, verified, expiring, resolving to a stored payload."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest

from telegram_idem import (
    CallbackTokenError,
    CallbackTokens,
    ConfigurationError,
    ExpiredCallbackTokenError,
    ForgedCallbackTokenError,
    Idem,
    ManualClock,
    Store,
    UnknownCallbackTokenError,
)
from telegram_idem._callbacks import MAX_CALLBACK_DATA_BYTES, MAX_TOKEN_TTL
from telegram_idem.backends.memory import MemoryStore
from telegram_idem.backends.sqlite import SQLiteStore
from telegram_idem.testing._delivery import load_fixture

BOT = 7000000001
SECRET = "s3cret-for-tests-only-0123456789"
KOREAN = {
    "action": "delete",
    "path": "ko/tech/" + "웹훅-재시도와-멱등성-" * 12 + ".md",
    "title": "웹훅 재시도와 멱등성: 텔레그램 봇이 같은 업데이트를 두 번 받을 때",
}


@pytest.fixture
def idem(store: Store, clock: ManualClock) -> Idem:
    return Idem(store, clock=clock, heartbeat=False)


@pytest.fixture
def tokens(idem: Idem) -> CallbackTokens:
    return CallbackTokens(idem, SECRET, ttl=3600.0)


async def test_issue_fits_callback_data_even_for_a_long_korean_payload(
    tokens: CallbackTokens,
) -> None:
    assert len(str(KOREAN).encode()) > 5 * MAX_CALLBACK_DATA_BYTES
    data = await tokens.issue("del", KOREAN, bot_id=BOT)
    assert 1 <= len(data.encode("utf-8")) <= MAX_CALLBACK_DATA_BYTES
    assert data.startswith("del:")
    assert CallbackTokens.prefix_of(data) == "del"
    longest = await tokens.issue("p" * 16, KOREAN, bot_id=BOT, ttl=10 * 365 * 86400.0)
    assert len(longest.encode("utf-8")) <= MAX_CALLBACK_DATA_BYTES


async def test_resolve_returns_the_payload_and_is_not_consumed(tokens: CallbackTokens) -> None:
    data = await tokens.issue("del", KOREAN, bot_id=BOT)
    assert await tokens.resolve(data, bot_id=BOT) == KOREAN
    assert await tokens.resolve(data, bot_id=BOT) == KOREAN  # a double tap resolves twice
    assert tokens.verify(data)[0] == "del"


async def test_each_issue_is_a_new_token(tokens: CallbackTokens) -> None:
    a = await tokens.issue("del", {"post": 1}, bot_id=BOT)
    b = await tokens.issue("del", {"post": 2}, bot_id=BOT)
    assert a != b
    assert await tokens.resolve(a, bot_id=BOT) == {"post": 1}
    assert await tokens.resolve(b, bot_id=BOT) == {"post": 2}


@pytest.mark.parametrize("payload", [None, 0, "", False, {}, []])
async def test_falsy_payloads_resolve_exactly(tokens: CallbackTokens, payload: object) -> None:
    data = await tokens.issue("x", payload, bot_id=BOT)
    got = await tokens.resolve(data, bot_id=BOT)
    assert got == payload and type(got) is type(payload)


def _flip_last(text: str) -> str:
    return text[:-1] + ("A" if text[-1] != "A" else "B")


async def test_tampered_tokens_are_forged(tokens: CallbackTokens, idem: Idem) -> None:
    data = await tokens.issue("del", KOREAN, bot_id=BOT)
    prefix_rest = data.split(":", 1)
    token_id, expiry, sig = prefix_rest[1].split(".")
    tampered = [
        _flip_last(data),  # signature
        f"unpub:{token_id}.{expiry}.{sig}",  # another prefix, same signature
        f"del:{_flip_last(token_id)}.{expiry}.{sig}",  # another id
        f"del:{token_id}.{expiry}z.{sig}",  # a later expiry
        data + "x",
        data.replace(".", ":"),
    ]
    for bad in tampered:
        with pytest.raises(ForgedCallbackTokenError) as info:
            await tokens.resolve(bad, bot_id=BOT)
        assert info.value.data == bad
    other = CallbackTokens(idem, b"another-secret-0123456789abcdef")
    with pytest.raises(ForgedCallbackTokenError):
        await other.resolve(data, bot_id=BOT)


async def test_md5_style_callback_data_from_the_fixture_is_forged(tokens: CallbackTokens) -> None:
    data = load_fixture("callback_delete")["callback_query"]["data"]
    assert data == "del:8f3a1b2c9d"
    with pytest.raises(ForgedCallbackTokenError):
        await tokens.resolve(data, bot_id=BOT)
    assert CallbackTokens.prefix_of(data) is None
    for junk in ("", "del:", ":::", "del:" + "A" * 11 + ".0." + "A" * 16):
        with pytest.raises(ForgedCallbackTokenError):
            tokens.verify(junk)


async def test_a_guessed_token_with_a_fake_signature_is_forged(tokens: CallbackTokens) -> None:
    fake_sig = base64.urlsafe_b64encode(b"\0" * 12).rstrip(b"=").decode()
    guess = f"del:{'A' * 11}.zzzzzz.{fake_sig}"
    assert CallbackTokens.prefix_of(guess) == "del"  # right shape
    with pytest.raises(ForgedCallbackTokenError):
        await tokens.resolve(guess, bot_id=BOT)


async def test_expired_token(tokens: CallbackTokens, clock: ManualClock) -> None:
    data = await tokens.issue("del", KOREAN, bot_id=BOT, ttl=600.0)
    clock.advance(599)
    assert await tokens.resolve(data, bot_id=BOT) == KOREAN
    clock.advance(2)
    with pytest.raises(ExpiredCallbackTokenError) as info:
        await tokens.resolve(data, bot_id=BOT)
    assert isinstance(info.value, CallbackTokenError)
    with pytest.raises(ExpiredCallbackTokenError):
        tokens.verify(data)


async def test_default_ttl_expires(tokens: CallbackTokens, clock: ManualClock) -> None:
    data = await tokens.issue("del", 1, bot_id=BOT)
    clock.advance(tokens.ttl + 2)
    with pytest.raises(ExpiredCallbackTokenError):
        await tokens.resolve(data, bot_id=BOT)


async def test_unknown_token_with_a_valid_signature(clock: ManualClock, tmp_path: Path) -> None:
    issuing = Idem(SQLiteStore(tmp_path / "a.db", clock=clock), clock=clock, heartbeat=False)
    other_store = Idem(MemoryStore(clock=clock), clock=clock, heartbeat=False)
    try:
        data = await CallbackTokens(issuing, SECRET).issue("del", KOREAN, bot_id=BOT)
        with pytest.raises(UnknownCallbackTokenError) as info:
            await CallbackTokens(other_store, SECRET).resolve(data, bot_id=BOT)
        assert info.value.data == data
        # the same store, but the token was issued for another bot
        with pytest.raises(UnknownCallbackTokenError):
            await CallbackTokens(issuing, SECRET).resolve(data, bot_id=BOT + 1)
        assert await CallbackTokens(issuing, SECRET).resolve(data, bot_id=BOT) == KOREAN
    finally:
        await issuing.close()
        await other_store.close()


async def test_cleared_store_makes_tokens_unknown(clock: ManualClock, tmp_path: Path) -> None:
    path = tmp_path / "tokens.db"
    idem = Idem(SQLiteStore(path, clock=clock), clock=clock, heartbeat=False)
    data = await CallbackTokens(idem, SECRET).issue("del", KOREAN, bot_id=BOT)
    await idem.close()
    path.unlink()
    for extra in ("-wal", "-shm"):
        (tmp_path / f"tokens.db{extra}").unlink(missing_ok=True)
    fresh = Idem(SQLiteStore(path, clock=clock), clock=clock, heartbeat=False)
    try:
        with pytest.raises(UnknownCallbackTokenError):
            await CallbackTokens(fresh, SECRET).resolve(data, bot_id=BOT)
    finally:
        await fresh.close()


@pytest.mark.parametrize("secret", ["", "short", b"15-bytes-secret", "x" * 15])
def test_short_secret_is_a_configuration_error(idem: Idem, secret: str | bytes) -> None:
    with pytest.raises(ConfigurationError):
        CallbackTokens(idem, secret)


def test_sixteen_byte_secret_is_enough(idem: Idem) -> None:
    CallbackTokens(idem, b"x" * 16)
    CallbackTokens(idem, "한국어비밀번")  # 6 characters, 18 bytes in UTF-8
    with pytest.raises(ConfigurationError):
        CallbackTokens(idem, "한국어비밀")  # 5 characters, 15 bytes: bytes count, not characters


@pytest.mark.parametrize("prefix", ["", "del:", "a b", "x" * 17, "삭제", "del.x"])
async def test_bad_prefix_is_a_configuration_error(tokens: CallbackTokens, prefix: str) -> None:
    with pytest.raises(ConfigurationError):
        await tokens.issue(prefix, 1, bot_id=BOT)


@pytest.mark.parametrize("suffix", ["\n", "\r\n", " ", "\x00"])
async def test_a_genuine_token_with_anything_appended_is_forged(
    tokens: CallbackTokens, suffix: str
) -> None:
    data = await tokens.issue("del", {"post": 1}, bot_id=BOT)
    with pytest.raises(ForgedCallbackTokenError):
        tokens.verify(data + suffix)
    with pytest.raises(ForgedCallbackTokenError):
        await tokens.resolve(data + suffix, bot_id=BOT)
    assert CallbackTokens.prefix_of(data + suffix) is None
    with pytest.raises(ConfigurationError):
        await tokens.issue("del" + suffix, {"post": 1}, bot_id=BOT)


@pytest.mark.parametrize("ttl", [MAX_TOKEN_TTL * 2, 1e13, float("inf"), float("nan"), 0.0, -5.0])
async def test_a_ttl_out_of_range_is_refused_at_issue(
    tokens: CallbackTokens, idem: Idem, ttl: float
) -> None:
    with pytest.raises(ConfigurationError, match="ttl"):
        await tokens.issue("del", {"post": 1}, bot_id=BOT, ttl=ttl)
    with pytest.raises(ConfigurationError, match="ttl"):
        CallbackTokens(idem, SECRET, ttl=ttl)


async def test_the_longest_ttl_verifies(tokens: CallbackTokens) -> None:
    data = await tokens.issue("del", {"post": 1}, bot_id=BOT, ttl=MAX_TOKEN_TTL)
    assert tokens.verify(data)[0] == "del"
    assert await tokens.resolve(data, bot_id=BOT) == {"post": 1}
