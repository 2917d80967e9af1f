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
        webhook_secret: ``WEBHOOK_SECRET``, the ``secret_token`` of ``setWebhook``; unset:
            derived from the bot token (see :meth:`webhook_secret_token`).
        store_url: ``IDEM_STORE_URL`` (default ``sqlite:///blog_bot.db``).
        repo_path: ``BLOG_REPO_PATH`` (default ``./blog-repo``).
        writer_delay_scale: ``WRITER_DELAY_SCALE``; 1.0 ≈ the 45–60 s pipeline.
        callback_secret: ``CALLBACK_SECRET``; default derived from the bot token.
        lock_ttl: ``POST_LOCK_TTL``, seconds the per-chat post lock lives (the 120 s
            POST_LOCK of docs/design/incident.md).
        lease: ``IDEM_LEASE``, seconds a worker or handler holds its claim before another
            may take over (heartbeats extend it while the work runs).
        worker_concurrency: ``WORKER_CONCURRENCY``, inbox entries processed at once.
        retry_backoff: ``RETRY_BACKOFF``, seconds before the first retry of a failed update
            (doubling each time, at most 5 minutes; dead letter after 5 attempts).
        poll_leader_lease: ``POLL_LEADER_LEASE``, seconds of the ``poll`` command's
            leader lease (:class:`~telegram_idem.ingress.LeaderLease`), so several
            ``poll`` replicas on one store never call getUpdates at once (default 40;
            ``0``: poll unconditionally, one replica only).
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
    lease: float = 60.0
    worker_concurrency: int = 8
    retry_backoff: float = 1.0
    poll_leader_lease: float = 40.0
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
            lock_ttl = float(env.get("POST_LOCK_TTL", "120"))
            lease = float(env.get("IDEM_LEASE", "60"))
            concurrency = int(env.get("WORKER_CONCURRENCY", "8"))
            backoff = float(env.get("RETRY_BACKOFF", "1"))
            poll_lease = float(env.get("POLL_LEADER_LEASE", "40"))
        except ValueError as exc:
            raise SystemExit(f"a numeric setting is malformed: {exc}") from None
        derived = hmac.new(token.encode(), b"callback-tokens", hashlib.sha256).hexdigest()
        return cls(
            bot_token=token,
            api_url=env.get("TELEGRAM_API_URL", DEFAULT_API_URL),
            webhook_secret=env.get("WEBHOOK_SECRET") or None,
            store_url=env.get("IDEM_STORE_URL", "sqlite:///blog_bot.db"),
            repo_path=env.get("BLOG_REPO_PATH", "./blog-repo"),
            writer_delay_scale=scale,
            callback_secret=env.get("CALLBACK_SECRET") or derived,
            lock_ttl=lock_ttl,
            lease=lease,
            worker_concurrency=concurrency,
            retry_backoff=backoff,
            poll_leader_lease=poll_lease,
            github=tuple(
                (name, env[name])
                for name in ("GITHUB_TOKEN", "GITHUB_REPO", "GITHUB_API_URL", "BLOG_BRANCH")
                if env.get(name)
            ),
        )

    def webhook_secret_token(self) -> str:
        """The webhook's ``secret_token``: ``webhook_secret``, else one derived from the bot
        token (HMAC-SHA256, hex), which ``set-webhook`` registers with Telegram."""
        if self.webhook_secret:
            return self.webhook_secret
        return hmac.new(self.bot_token.encode(), b"webhook-secret", hashlib.sha256).hexdigest()

    def publisher_env(self) -> dict[str, str]:
        """The variables :func:`publisher_from_env` reads."""
        return {"BLOG_REPO_PATH": self.repo_path, **dict(self.github)}
