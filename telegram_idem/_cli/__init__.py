"""The ``telegram-idem`` command (needs ``pip install 'telegram-idem[cli]'``).

::

    telegram-idem migrate URL            create a store's tables (idempotent)
    telegram-idem inbox stats|list|show|redrive|drop  the inbox's entries and dead letters
    telegram-idem replay FILE… --url URL POST recorded updates to a webhook like Telegram
    telegram-idem webhook info|set|delete  the bot's webhook, through the Bot API
    telegram-idem outbox stats|list|show|redrive|resolve|unpark  the outbox's calls
    telegram-idem unresolved list|resolve  unknown steps, actions and sends
    telegram-idem --help                 every command, each with its own --help

Every command takes the store URL as ``--store URL`` (``migrate`` and ``check`` as their
argument) or from ``IDEM_STORE_URL``; ``--json`` prints one JSON document for scripts;
the exit codes are the same for every command (:mod:`telegram_idem._cli._common`: 0 ok,
1 a problem found, 2 usage, 3 unreachable, 4 configuration, 130 interrupted). No command
prints a bot token or a password.
"""

from __future__ import annotations

import click

from telegram_idem._cli._inbox import inbox
from telegram_idem._cli._migrate import migrate
from telegram_idem._cli._outbox import outbox
from telegram_idem._cli._replay import replay
from telegram_idem._cli._unresolved import unresolved
from telegram_idem._cli._webhook import webhook

__all__ = ["cli", "main"]


@click.group(name="telegram-idem")
@click.version_option(package_name="telegram-idem", prog_name="telegram-idem")
def cli() -> None:
    """Idempotency for Telegram bots: inspect and repair a bot's store, replay updates,
    manage its webhook."""


cli.add_command(migrate)
cli.add_command(inbox)
cli.add_command(outbox)
cli.add_command(unresolved)
cli.add_command(replay)
cli.add_command(webhook)


def main() -> None:
    """Console-script entry point."""
    cli()
