"""The webhook secret token rule, without any HTTP framework (shared by every webhook
shell through :mod:`telegram_idem.webhook_request`).

Source: Bot API, ``setWebhook``: ``secret_token`` is 1–256 chars of ``A-Z a-z 0-9 _ -``,
sent back in the ``X-Telegram-Bot-Api-Secret-Token`` header of every webhook request.

The rule, for every webhook shape:

* a secret is **required**: ``secret_token=None`` raises :class:`ConfigurationError`
  unless the author opts out with ``allow_unauthenticated=True``, which logs a WARNING at
  construction (anyone who learns the URL can then post forged updates);
* rotation: ``secret_token`` may be a sequence of secrets, each accepted (e.g. the old and
  the new one while ``setWebhook`` is re-called with the new one); every one is compared
  in constant time, and all are compared whatever the header holds.
"""

from __future__ import annotations

import hmac
import logging
import re
from collections.abc import Sequence

from telegram_idem.errors import ConfigurationError

__all__ = [
    "SECRET_HEADER",
    "SecretCheck",
    "SecretTokens",
    "check_secret_token",
    "secret_check",
    "secret_matches",
]

SECRET_HEADER = "X-Telegram-Bot-Api-Secret-Token"

SecretTokens = str | Sequence[str] | None
"""One secret, several accepted at once (rotation), or ``None`` (only with
``allow_unauthenticated=True``)."""

_SECRET = re.compile(r"[A-Za-z0-9_-]{1,256}")

log = logging.getLogger("telegram_idem.webhook")


def check_secret_token(secret: str | None) -> str | None:
    """Validate one configured secret token (``None`` passes through).

    Raises:
        ConfigurationError: not 1–256 chars of ``A-Z a-z 0-9 _ -`` (Telegram would refuse it).
    """
    if secret is not None and (not isinstance(secret, str) or not _SECRET.fullmatch(secret)):
        raise ConfigurationError("a webhook secret token is 1-256 chars of A-Z a-z 0-9 _ -")
    return secret


def secret_matches(given: str, expected: str) -> bool:
    """Whether the header value ``given`` is the secret, compared in constant time.

    ``given`` may hold anything a client sent: aiohttp hands header bytes that are not
    UTF-8 over as lone surrogates, which are encoded as they are (and so never match).
    """
    return hmac.compare_digest(
        given.encode("utf-8", "surrogatepass"), expected.encode("utf-8", "surrogatepass")
    )


class SecretCheck:
    """The secret token check of one webhook (make it with :func:`secret_check`).

    Attributes:
        secrets: the accepted secrets; empty when requests are not authenticated.
    """

    __slots__ = ("secrets",)

    def __init__(self, secrets: tuple[str, ...]) -> None:
        self.secrets = secrets

    @property
    def required(self) -> bool:
        """Whether requests must carry a secret."""
        return bool(self.secrets)

    def accepts(self, given: str | None) -> bool:
        """Whether a request whose header holds ``given`` (``None``: absent) is let in.

        Every secret is compared, in constant time, whatever matches first.

        Args:
            given: the ``X-Telegram-Bot-Api-Secret-Token`` header's value, or ``None``.
        """
        if not self.secrets:
            return True
        value = given or ""
        matched = False
        for secret in self.secrets:
            matched |= secret_matches(value, secret)
        return matched


def secret_check(
    secret_token: SecretTokens, *, allow_unauthenticated: bool = False, where: str = "webhook"
) -> SecretCheck:
    """The secret token check for a webhook configured with ``secret_token``.

    Args:
        secret_token: the ``secret_token`` given to ``setWebhook``, or several accepted at
            once while rotating (a sequence of strings), or ``None``.
        allow_unauthenticated: with ``secret_token=None``, accept requests without a
            secret; a WARNING is logged now.
        where: the webhook's name, for the messages.

    Raises:
        ConfigurationError: ``secret_token=None`` (or an empty sequence) without
            ``allow_unauthenticated=True``; a secret that is not 1–256 chars of
            ``A-Z a-z 0-9 _ -``; both a secret and ``allow_unauthenticated=True``.
    """
    if secret_token is None:
        secrets: tuple[str, ...] = ()
    elif isinstance(secret_token, str):
        secrets = (secret_token,)
    else:
        secrets = tuple(secret_token)
    for secret in secrets:
        check_secret_token(secret)
    if secrets and allow_unauthenticated:
        raise ConfigurationError(
            f"{where}: allow_unauthenticated=True contradicts a secret_token; pass one"
        )
    if not secrets:
        if not allow_unauthenticated:
            raise ConfigurationError(
                f"{where}: a secret_token is required (the secret_token given to setWebhook) "
                "so forged POSTs are refused; pass allow_unauthenticated=True to accept "
                "requests without one"
            )
        log.warning(
            "%s accepts requests without a secret token (allow_unauthenticated=True): "
            "anyone who learns its URL can post forged updates",
            where,
        )
    return SecretCheck(secrets)
