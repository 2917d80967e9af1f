"""The blog bot's settings, read from the environment."""

from __future__ import annotations

import hashlib
import hmac
import os
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["DEFAULT_API_URL", "Settings"]

DEFAULT_API_URL = "https://api.telegram.org"


@dataclass(frozen=True, slots=True)
class Settings:
    """Configuration of one blog bot process.

    Attributes:
        bot_token: ``BOT_TOKEN`` (``<bot_id>:<secret>``).
        api_url: ``TELEGRAM_API_URL``, the Bot API base URL (default Telegram's).
        webhook_secret: ``WEBHOOK_SECRET``, the ``secret_token`` of ``setWebhook``.
        store_url: ``IDEM_STORE_URL`` (default ``sqlite:///blog_bot.db``).
        repo_path: ``BLOG_REPO_PATH`` (default ``./blog-repo``).
        writer_delay_scale: ``WRITER_DELAY_SCALE``; 1.0 ≈ the 45–60 s pipeline.
        callback_secret: ``CALLBACK_SECRET``; default derived from the bot token.
        lock_ttl: seconds the per-chat post lock lives (the 120 s POST_LOCK of seeds/000).
        github: ``GITHUB_TOKEN``, ``GITHUB_REPO``, ``GITHUB_API_URL`` when set: publish
            through the GitHub Git Tree API instead of the local repository;
            ``BLOG_BRANCH`` (default ``main``) for either publisher.
    """

    bot_token: str
    api_url: str = DEFAULT_API_URL
    webhook_secret: str | None = None
    store_url: str = "sqlite:///blog_bot.db"
    repo_path: str = "./blog-repo"
    writer_delay_scale: float = 1.0
    callback_secret: str = ""
    lock_ttl: float = 120.0
    github: tuple[tuple[str, str], ...] = ()

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        """Read the settings.

        Raises:
            SystemExit: ``BOT_TOKEN`` is missing or a number is malformed.
        """
        env = os.environ if env is None else env
        token = env.get("BOT_TOKEN", "")
        if ":" not in token:
            raise SystemExit("BOT_TOKEN must be set to the bot's token (<bot_id>:<secret>)")
        try:
            scale = float(env.get("WRITER_DELAY_SCALE", "1.0"))
        except ValueError:
            raise SystemExit("WRITER_DELAY_SCALE must be a number") from None
        derived = hmac.new(token.encode(), b"callback-tokens", hashlib.sha256).hexdigest()
        return cls(
            bot_token=token,
            api_url=env.get("TELEGRAM_API_URL", DEFAULT_API_URL),
            webhook_secret=env.get("WEBHOOK_SECRET") or None,
            store_url=env.get("IDEM_STORE_URL", "sqlite:///blog_bot.db"),
            repo_path=env.get("BLOG_REPO_PATH", "./blog-repo"),
            writer_delay_scale=scale,
            callback_secret=env.get("CALLBACK_SECRET") or derived,
            github=tuple(
                (name, env[name])
                for name in ("GITHUB_TOKEN", "GITHUB_REPO", "GITHUB_API_URL", "BLOG_BRANCH")
                if env.get(name)
            ),
        )

    def publisher_env(self) -> dict[str, str]:
        """The variables :func:`publisher_from_env` reads."""
        return {"BLOG_REPO_PATH": self.repo_path, **dict(self.github)}
