"""Callback tokens: short signed ``callback_data`` standing for a server-side payload.

Telegram limits ``callback_data`` to 1–64 bytes (Bot API, ``InlineKeyboardButton``), too
small for most payloads (a Korean file name alone may exceed it). A token is::

    <prefix>:<id>.<expiry>.<signature>

``id`` is 8 random bytes (base64url), ``expiry`` the expiry time in seconds since the
epoch (base 36), ``signature`` the first 12 bytes of HMAC-SHA256 over the rest (base64url).
The payload itself is stored under the token id with the same TTL. Resolving does not
consume the token: a double tap resolves twice, and the action guard makes it run once.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import math
import re
import secrets
from typing import Any

from telegram_idem._clock import Clock
from telegram_idem._guard import Idem
from telegram_idem._records import Outcome, Status
from telegram_idem.errors import (
    ConfigurationError,
    ExpiredCallbackTokenError,
    ForgedCallbackTokenError,
    UnknownCallbackTokenError,
)

__all__ = ["MAX_CALLBACK_DATA_BYTES", "MAX_TOKEN_TTL", "CallbackTokens"]

MAX_CALLBACK_DATA_BYTES = 64
"""Bot API, ``InlineKeyboardButton.callback_data``: 1–64 bytes."""

MAX_TOKEN_TTL = 10 * 366 * 86400.0
"""The longest a token may live: 10 years, in seconds (its expiry must fit the token's
8 base-36 digits, and a store must keep its payload that long)."""

# Always matched with ``fullmatch``: ``$`` alone would accept a trailing newline.
_PREFIX = re.compile(r"[A-Za-z0-9_-]{1,16}")
_TOKEN = re.compile(
    r"([A-Za-z0-9_-]{1,16}):([A-Za-z0-9_-]{11})\.([0-9a-z]{1,8})\.([A-Za-z0-9_-]{16})"
)


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


class CallbackTokens:
    """Issue and resolve callback tokens.

    Args:
        idem: the guard whose store keeps the payloads.
        secret: HMAC key (≥ 16 bytes; keep it out of the repository).
        ttl: default seconds a token lives (default 7 days; at most
            :data:`MAX_TOKEN_TTL`).
        clock: seconds since the epoch; default the guard's clock.

    Raises:
        ConfigurationError: the secret is shorter than 16 bytes, or ``ttl`` is not in
            ``(0, MAX_TOKEN_TTL]``.
    """

    def __init__(
        self,
        idem: Idem,
        secret: bytes | str,
        *,
        ttl: float = 7 * 86400.0,
        clock: Clock | None = None,
    ) -> None:
        key = secret.encode() if isinstance(secret, str) else secret
        if len(key) < 16:
            raise ConfigurationError("a callback token secret needs at least 16 bytes")
        self._idem = idem
        self._secret = key
        self.ttl = _check_ttl(ttl)
        self._clock = clock or idem.clock

    def _sign(self, body: str) -> str:
        return _b64(hmac.new(self._secret, body.encode(), hashlib.sha256).digest()[:12])

    async def issue(
        self, prefix: str, payload: Any, *, bot_id: int, ttl: float | None = None
    ) -> str:
        """Store ``payload`` and return ``callback_data`` (≤ 64 bytes) standing for it.

        Args:
            prefix: 1–16 chars of ``A-Z a-z 0-9 _ -``, e.g. ``"del"`` (handlers filter on it).
            payload: any value the guard's codec can store.
            bot_id: the bot whose buttons carry the token.
            ttl: seconds the token lives (default :attr:`ttl`; at most
                :data:`MAX_TOKEN_TTL`).

        Raises:
            ConfigurationError: bad prefix, or ``ttl`` not in ``(0, MAX_TOKEN_TTL]``.
            ResultEncodingError: the payload cannot be stored.
            StoreError: the store could not answer.
        """
        if not _PREFIX.fullmatch(prefix):
            raise ConfigurationError(f"callback token prefix must match {_PREFIX.pattern}")
        life = _check_ttl(ttl) if ttl is not None else self.ttl
        token_id = _b64(secrets.token_bytes(8))
        expiry = _base36(int(self._clock() + life) + 1)
        body = f"{prefix}:{token_id}.{expiry}"
        data = f"{body}.{self._sign(body)}"
        assert len(data.encode()) <= MAX_CALLBACK_DATA_BYTES
        store, key = self._idem.store, self._idem.keys.callback(bot_id, token_id)
        claim = await store.claim(key, lease=life, retention=life)
        if claim.outcome is not Outcome.ACQUIRED:  # 64 random bits collided: never in practice
            raise ConfigurationError("callback token id collision; issue again")
        await store.complete(key, claim.token, self._idem.codec.encode(payload), retention=life)
        return data

    def verify(self, data: str) -> tuple[str, str]:
        """Check shape, signature and expiry without the store; returns ``(prefix, id)``.

        Args:
            data: the ``callback_data`` a button tap carried.

        Raises:
            ForgedCallbackTokenError: not a token this secret signed.
            ExpiredCallbackTokenError: past its expiry.
        """
        match = _TOKEN.fullmatch(data)
        if match is None:
            raise ForgedCallbackTokenError("callback data is not a callback token", data=data)
        prefix, token_id, expiry, sig = match.groups()
        if not hmac.compare_digest(sig, self._sign(f"{prefix}:{token_id}.{expiry}")):
            raise ForgedCallbackTokenError("callback token signature does not match", data=data)
        if int(expiry, 36) <= self._clock():
            raise ExpiredCallbackTokenError("callback token has expired", data=data)
        return prefix, token_id

    async def resolve(self, data: str, *, bot_id: int) -> Any:
        """The payload ``data`` stands for.

        Args:
            data: the ``callback_data`` a button tap carried.
            bot_id: the bot whose token it is (the store key's bot id).

        Raises:
            ForgedCallbackTokenError: not a token this secret signed.
            ExpiredCallbackTokenError: past its expiry.
            UnknownCallbackTokenError: genuine and live, but no payload (revoked).
            StoreError: the store could not answer.
        """
        _, token_id = self.verify(data)
        record = await self._idem.store.get(self._idem.keys.callback(bot_id, token_id))
        if record is None or record.status is not Status.COMPLETED or record.result is None:
            raise UnknownCallbackTokenError("callback token has no stored payload", data=data)
        return self._idem.codec.decode(record.result)

    @staticmethod
    def prefix_of(data: str) -> str | None:
        """The prefix of ``data`` if it has the token shape (unverified), else ``None``.

        Args:
            data: the ``callback_data`` a button tap carried.
        """
        match = _TOKEN.fullmatch(data)
        return match.group(1) if match else None


def _check_ttl(ttl: float) -> float:
    if not (0 < ttl <= MAX_TOKEN_TTL and math.isfinite(ttl)):
        raise ConfigurationError(
            f"callback token ttl must be > 0 and at most {MAX_TOKEN_TTL:.0f} seconds "
            f"(10 years), got {ttl}"
        )
    return float(ttl)


def _base36(n: int) -> str:
    digits = "0123456789abcdefghijklmnopqrstuvwxyz"
    out = ""
    while n:
        n, r = divmod(n, 36)
        out = digits[r] + out
    return out or "0"
