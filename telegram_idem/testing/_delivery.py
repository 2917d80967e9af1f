"""Simulated Telegram webhook delivery, plus the shipped update fixtures.

`TelegramDelivery` POSTs updates to a webhook URL the way Telegram does (Bot API "setWebhook"
and "Getting updates"): the Update as a JSON body with ``Content-Type: application/json``, the
``X-Telegram-Bot-Api-Secret-Token`` header when a secret is set, and the **same** update
(same ``update_id``, same bytes) sent again when the answer is not a 2xx, the connection fails,
or no answer arrives within ``timeout`` seconds (Telegram waits about 60 s). Telegram does not
publish its retry schedule; here it is ``retry_delay`` (growing by ``backoff``) and at most
``max_attempts``. The sender itself lives in :mod:`telegram_idem._delivery`, which
``telegram-idem replay`` uses without the test toolkit; this module adds the double tap.

It also reproduces the two other ways one action reaches a bot twice: the same update delivered
concurrently (`TelegramDelivery.deliver_concurrently`: several data centres, or a retry racing
a slow first attempt), and a user tapping one button twice (`TelegramDelivery.double_tap`: two
callback queries with different ``update_id`` and ``id`` but the same ``from``, ``message`` and
``data``; Bot API "CallbackQuery").

Fixtures: the real update payloads under ``fixtures/updates/`` ship with the package;
`load_fixture` reads one by name, `fixture_names` lists them, `load_update` reads any file
(they live in :mod:`telegram_idem.testing._payloads`, which needs no aiohttp, and are
re-exported here).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from telegram_idem._delivery import SECRET_HEADER, Attempt, DeliveryReport, DeliveryStats
from telegram_idem._delivery import TelegramDelivery as _Sender
from telegram_idem.testing._payloads import (
    FIXTURES,
    fixture_names,
    load_fixture,
    load_update,
    make_double_tap,
)

__all__ = [
    "FIXTURES",
    "SECRET_HEADER",
    "Attempt",
    "DeliveryReport",
    "DeliveryStats",
    "TelegramDelivery",
    "fixture_names",
    "load_fixture",
    "load_update",
    "make_double_tap",
]


class TelegramDelivery(_Sender):
    """Delivers updates to ``url`` like Telegram's webhook sender (Bot API "setWebhook").

    ``secret_token`` (1-256 of ``A-Z a-z 0-9 _ -``) is sent in
    ``X-Telegram-Bot-Api-Secret-Token``. An attempt fails when no answer arrives within
    ``timeout`` seconds, the status is not 2xx, or the connection fails; the same update is
    then re-sent, at most ``max_attempts`` attempts in all, the first re-send after
    ``retry_delay`` seconds and each next one ``backoff`` times later (at most
    ``max_retry_delay`` seconds). ``sleep`` and ``clock`` (seconds) can be replaced in
    tests. Pass ``session`` to reuse an aiohttp ``ClientSession`` (not closed by `close`).
    ``stats`` totals every delivery, ``reports`` keeps each one's attempts.

    The sender is the one ``telegram-idem replay`` uses (``telegram_idem._delivery``); this
    class adds :meth:`double_tap`.

    Raises:
        ValueError: a bad ``secret_token``, ``timeout`` <= 0, ``retry_delay`` < 0,
            ``backoff`` < 1, ``max_retry_delay`` < 0 or ``max_attempts`` < 1.
    """

    async def double_tap(
        self,
        callback_update: Mapping[str, Any],
        new_update_id: int | None = None,
        *,
        new_callback_query_id: str | None = None,
    ) -> tuple[DeliveryReport, DeliveryReport]:
        """Deliver a callback query and its second tap (see `make_double_tap`) concurrently.

        Two distinct updates meaning one action: an update guard passes both, only an action
        key collapses them, and both callback queries still need ``answerCallbackQuery``.

        Args:
            callback_update: the first tap (a callback query update).
            new_update_id: the second tap's ``update_id``; default the first's + 1.
            new_callback_query_id: the second tap's ``callback_query.id``; default the
                first's + 1.
        """
        second = make_double_tap(
            callback_update, new_update_id, new_callback_query_id=new_callback_query_id
        )
        first_report, second_report = await asyncio.gather(
            self.deliver(callback_update), self.deliver(second)
        )
        return first_report, second_report
