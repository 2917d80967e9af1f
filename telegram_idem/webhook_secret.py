"""The webhook secret token and body bound, without any HTTP framework (shared by the
aiohttp ingress and the AWS Lambda handler).

Source: Bot API, ``setWebhook``: ``secret_token`` is 1–256 chars of ``A-Z a-z 0-9 _ -``,
sent back in the ``X-Telegram-Bot-Api-Secret-Token`` header of every webhook request.
"""

from __future__ import annotations

import hmac
import re

from telegram_idem.errors import ConfigurationError

__all__ = ["DEFAULT_MAX_BODY", "SECRET_HEADER", "check_secret_token", "secret_matches"]

SECRET_HEADER = "X-Telegram-Bot-Api-Secret-Token"
DEFAULT_MAX_BODY = 1024 * 1024
"""1 MiB: far above any real update, small enough to refuse abuse."""

_SECRET = re.compile(r"^[A-Za-z0-9_-]{1,256}$")


def check_secret_token(secret: str | None) -> str | None:
    """Validate a configured secret token (``None`` = no check).

    Raises:
        ConfigurationError: not 1–256 chars of ``A-Z a-z 0-9 _ -`` (Telegram would refuse it).
    """
    if secret is not None and not _SECRET.match(secret):
        raise ConfigurationError("a webhook secret token is 1-256 chars of A-Z a-z 0-9 _ -")
    return secret


def secret_matches(given: str, expected: str) -> bool:
    """Whether the header value ``given`` is the secret, compared in constant time."""
    return hmac.compare_digest(given.encode(), expected.encode())
