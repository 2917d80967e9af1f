"""``telegram-idem webhook info|set|delete``: a bot's webhook, through the Bot API.

``set URL --drop-pending-updates`` is the incident's first takeaway
(docs/design/incident.md): a bot re-enabled without it is handed every update Telegram
queued meanwhile, its own retries included, and processes what it may have processed
already. ``set`` without the flag warns when updates are pending, naming the flag.

The token comes from ``--token`` or ``$BOT_TOKEN`` and never appears in what is printed
(:mod:`telegram_idem._cli._bot_api`); ``--api-url`` or ``$TELEGRAM_API_URL`` points at a
local Bot API server (default https://api.telegram.org). Exit 0 done, 1 Telegram answered
``ok: false`` (its description is printed), 3 the Bot API could not be reached, 4 the token
was refused (401).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any, TypeVar

import click

from telegram_idem._cli._bot_api import (
    API_URL_ENV,
    DEFAULT_API_URL,
    TOKEN_ENV,
    BotAPIClient,
    BotAPIError,
    check_api_url,
    check_token,
)
from telegram_idem._cli._common import Output, check_http_url, fail, json_option, run, table
from telegram_idem._cli._replay import SECRET_ENV
from telegram_idem._webhook_secret import check_secret_token
from telegram_idem.errors import ConfigurationError

__all__ = ["INFO_FIELDS", "webhook"]

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])

INFO_FIELDS = (
    "url",
    "pending_update_count",
    "last_error_date",
    "last_error_message",
    "max_connections",
    "ip_address",
    "allowed_updates",
)
"""The ``WebhookInfo`` fields ``webhook info`` shows, in order (Bot API "WebhookInfo")."""


def _bot_options(func: F) -> F:
    func = click.option(
        "--api-url",
        envvar=API_URL_ENV,
        show_envvar=True,
        default=DEFAULT_API_URL,
        show_default=True,
        metavar="URL",
        callback=check_api_url,
        help="The Bot API's base URL (a local Bot API server, or a fake one in tests).",
    )(func)
    return click.option(
        "--token",
        envvar=TOKEN_ENV,
        show_envvar=True,
        required=True,
        metavar="TOKEN",
        callback=check_token,
        help="The bot token from @BotFather (never printed).",
    )(func)


def _drop_option(func: F) -> F:
    return click.option(
        "--drop-pending-updates",
        is_flag=True,
        help="Discard the updates Telegram has queued for the bot (its retries included), "
        "so they are never delivered.",
    )(func)


def _call(token: str, api_url: str, work: Callable[[BotAPIClient], Awaitable[T]]) -> T:
    """Run ``work`` with a client; a :class:`BotAPIError` becomes its exit code."""
    client = BotAPIClient(token, api_url)

    async def main() -> T:
        async with client:
            return await work(client)

    try:
        return run(main)
    except BotAPIError as exc:
        fail(client.redact(exc.message), exc.code)


def _scrub(token: str, value: T) -> T:
    """``value`` with ``token`` replaced by ``<token>`` in every string inside it (a
    webhook URL may hold the token in its path)."""
    if isinstance(value, str):
        return value.replace(token, "<token>")  # type: ignore[return-value]
    if isinstance(value, dict):
        return {k: _scrub(token, v) for k, v in value.items()}  # type: ignore[return-value]
    if isinstance(value, list):
        return [_scrub(token, v) for v in value]  # type: ignore[return-value]
    return value


def _when(value: object) -> str:
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return datetime.fromtimestamp(value, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    return "-"


def _shown(name: str, info: dict[str, Any]) -> str:
    value = info.get(name)
    if name == "last_error_date":
        return _when(value)
    if name == "url":
        return value or "(none: no webhook, getUpdates works)"
    if name == "allowed_updates" and value is None:
        return "(default: all but chat_member, message_reaction, message_reaction_count)"
    if isinstance(value, list):
        return ", ".join(str(item) for item in value) or "(none)"
    return "-" if value is None or value == "" else str(value)


@click.group()
def webhook() -> None:
    """Show, set or delete the bot's webhook through the Bot API.

    The token comes from --token or $BOT_TOKEN and is never printed; --api-url (or
    $TELEGRAM_API_URL) points at a local Bot API server. Exit 1 when Telegram answers
    ok: false (its description is printed), 3 when the Bot API cannot be reached, 4 when
    the token is refused.
    """


@webhook.command()
@_bot_options
@json_option
def info(token: str, api_url: str, as_json: bool) -> None:
    """Show the webhook: url, pending_update_count, last_error_date and
    last_error_message, max_connections, ip_address, allowed_updates (getWebhookInfo).

    Example: BOT_TOKEN=... telegram-idem webhook info
    """
    result = _call(token, api_url, lambda client: client.call("getWebhookInfo"))
    data: dict[str, Any] = _scrub(token, result) if isinstance(result, dict) else {}
    Output(as_json).show(
        data,
        lambda: table("webhook", ["field", "value"], [(n, _shown(n, data)) for n in INFO_FIELDS]),
    )


def _allowed(ctx: click.Context, param: click.Parameter, value: str | None) -> list[str] | None:
    if value is None:
        return None
    return [name.strip() for name in value.split(",") if name.strip()]


def _secret(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    try:
        return check_secret_token(value or None)
    except ConfigurationError as exc:
        raise click.BadParameter(str(exc)) from None


@webhook.command(name="set")
@click.argument("url", metavar="URL", callback=check_http_url)
@_drop_option
@click.option(
    "--secret-token",
    envvar=SECRET_ENV,
    show_envvar=True,
    metavar="S",
    callback=_secret,
    help="Telegram sends it in X-Telegram-Bot-Api-Secret-Token with every update "
    "(1-256 of A-Z a-z 0-9 _ -); the bot's ingress refuses requests without it.",
)
@click.option(
    "--max-connections",
    type=click.IntRange(1, 100),
    metavar="N",
    help="Simultaneous HTTPS connections Telegram opens to the webhook, 1-100 "
    "(Telegram's default 40).",
)
@click.option(
    "--allowed-updates",
    metavar="a,b",
    callback=_allowed,
    help="The update types to receive, comma-separated (e.g. message,callback_query); "
    "an empty value means all but chat_member, message_reaction, message_reaction_count.",
)
@_bot_options
@json_option
def set_webhook(
    url: str,
    drop_pending_updates: bool,
    secret_token: str | None,
    max_connections: int | None,
    allowed_updates: list[str] | None,
    token: str,
    api_url: str,
    as_json: bool,
) -> None:
    """Point the bot's webhook at URL (setWebhook).

    Without --drop-pending-updates, the updates Telegram queued meanwhile (its retries of
    updates the bot may have processed already) are delivered to URL: the command warns
    when there are any. With it, they are discarded.

    \b
    Example:
      telegram-idem webhook set https://bot.example.com/webhook \\
        --drop-pending-updates --secret-token "$WEBHOOK_SECRET"
    """
    out = Output(as_json)
    params: dict[str, Any] = {"url": url}
    if drop_pending_updates:
        params["drop_pending_updates"] = True
    if secret_token is not None:
        params["secret_token"] = secret_token
    if max_connections is not None:
        params["max_connections"] = max_connections
    if allowed_updates is not None:
        params["allowed_updates"] = allowed_updates

    async def work(client: BotAPIClient) -> tuple[int, dict[str, Any]]:
        before = await client.call("getWebhookInfo")
        pending = int(before.get("pending_update_count") or 0) if isinstance(before, dict) else 0
        if pending and not drop_pending_updates:
            out.note(
                f"warning: {pending} pending update(s) will be delivered to "
                f"{_scrub(token, url)}, retries "
                "of updates the bot may have handled already; add --drop-pending-updates "
                "to discard them"
            )
        await client.call("setWebhook", params)
        after = await client.call("getWebhookInfo")
        return pending, after if isinstance(after, dict) else {}

    pending, after = _call(token, api_url, work)
    if secret_token is None:
        out.note("warning: no --secret-token: anyone who learns the URL can post updates")
    data = _scrub(
        token,
        {
            "url": after.get("url", url),
            "pending_before": pending,
            "dropped_pending_updates": drop_pending_updates,
            "pending_update_count": after.get("pending_update_count"),
            "secret_token": secret_token is not None,
            "max_connections": after.get("max_connections"),
            "allowed_updates": after.get("allowed_updates"),
        },
    )
    kept = "dropped" if drop_pending_updates else "kept"
    out.show(
        data,
        lambda: (
            f"webhook set: {data['url']} ({pending} pending update(s) {kept}, "
            f"{data['pending_update_count']} pending now)"
        ),
    )


@webhook.command()
@_drop_option
@_bot_options
@json_option
def delete(drop_pending_updates: bool, token: str, api_url: str, as_json: bool) -> None:
    """Remove the webhook (deleteWebhook), e.g. to switch the bot to getUpdates.

    Example: telegram-idem webhook delete --drop-pending-updates
    """

    async def work(client: BotAPIClient) -> tuple[dict[str, Any], dict[str, Any]]:
        before = await client.call("getWebhookInfo")
        params = {"drop_pending_updates": True} if drop_pending_updates else {}
        await client.call("deleteWebhook", params)
        after = await client.call("getWebhookInfo")
        return (before if isinstance(before, dict) else {}), (
            after if isinstance(after, dict) else {}
        )

    before, after = _call(token, api_url, work)
    data = _scrub(
        token,
        {
            "deleted_url": before.get("url") or None,
            "pending_before": before.get("pending_update_count"),
            "dropped_pending_updates": drop_pending_updates,
            "pending_update_count": after.get("pending_update_count"),
        },
    )
    Output(as_json).show(
        data,
        lambda: (
            f"webhook deleted: {data['deleted_url'] or '(there was none)'} "
            f"({data['pending_update_count']} pending update(s) now)"
        ),
    )
