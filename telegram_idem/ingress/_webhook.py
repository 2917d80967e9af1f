"""Fast-ack webhook ingress (aiohttp, no bot framework): check, admit, answer.

Request → the checks every webhook shell shares (:mod:`telegram_idem.ingress._reading`
around the request core :mod:`telegram_idem.webhook_request`: secret token in constant
time, body bound and read timeout, JSON with an integer ``update_id``) → the update guard
claim **and** the inbox entry written together (:meth:`telegram_idem.Idem.admit_to_inbox`)
→ 200. Serve it with its worker in one call:
``telegram_idem.ingress.register(app, path, ingress, worker=worker)``. The table for
every ingress shape is ``docs/answers.md``; a refused admission is read back to tell a
duplicate from an update in progress elsewhere.

| situation                                    | answer                                   |
|----------------------------------------------|------------------------------------------|
| not ``POST``                                 | 405 (aiohttp's router)                   |
| secret header missing or wrong               | 401, nothing stored                      |
| body over ``max_body`` bytes                 | 413                                      |
| body incomplete after ``read_timeout`` s     | 408                                      |
| not JSON / no integer ``update_id``          | 400                                      |
| new update (any type, unknown ones included) | 200, one inbox entry                     |
| an update the framework cannot parse         | 200, one inbox entry; the worker's       |
|                                              | dispatch fails and it becomes a dead     |
|                                              | letter (re-sending could never parse it) |
| duplicate (update guard record completed or  | 200, no second entry (the inbox owns the |
| failed)                                      | update from its first admission)         |
| in progress elsewhere: another shape sharing | 503, no entry: Telegram re-sends, and    |
| the store (``FastAckWebhook``, PTB, Lambda)  | the delivery after that holder's lease   |
| holds the claim under a live lease           | is admitted by takeover                  |
| in progress elsewhere, that lease ended      | 200, one inbox entry (takeover)          |
| store outage, ``fail_closed`` (default)      | 503: Telegram re-sends later             |
| store outage, ``fail_open``                  | 200, dispatched in-process, logged loudly|
| admission refused, then an outage reading    | 503 (even with ``fail_open``: the update |
| the record                                   | is not new)                              |

Telegram re-sends an update whose answer is not a 2xx (Bot API, ``setWebhook``); an
answer in milliseconds means it never re-sends for slowness.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from aiohttp import web

from telegram_idem._admission import Admission, StorePolicy, StorePolicyLike
from telegram_idem._admitted import Admitted
from telegram_idem._guard import Idem
from telegram_idem._ordering import Ordering
from telegram_idem._webhook_secret import SecretTokens, secret_check
from telegram_idem.errors import ConfigurationError
from telegram_idem.inbox import Dispatch, NewEntry, new_entry
from telegram_idem.ingress._batching import AdmissionBatches
from telegram_idem.ingress._reading import read_update
from telegram_idem.webhook_request import DEFAULT_MAX_BODY, DEFAULT_READ_TIMEOUT

__all__ = ["WebhookIngress", "new_entry"]

log = logging.getLogger("telegram_idem.ingress")


class WebhookIngress:
    """The fast-ack webhook: checks each POST (secret token, size, JSON, ``update_id``),
    admits the update to the durable inbox with its update guard in one write, and answers
    Telegram 200 before any handler runs. Mount it with
    ``register(app, path, WebhookIngress(...), worker=worker)``
    (:func:`telegram_idem.ingress.register`), or ``app.router.add_post(path, ingress.handle)``.

    Args:
        idem: the guard; its store must have an inbox (memory, SQLite, Postgres, Redis).
        bot_id: the bot the updates are for.
        secret_token: the ``secret_token`` of ``setWebhook`` (required), or a sequence of
            secrets all accepted while rotating (:mod:`telegram_idem._webhook_secret`).
        allow_unauthenticated: with ``secret_token=None``, accept requests without a
            secret (a WARNING is logged at construction).
        max_body: largest body accepted, bytes.
        read_timeout: seconds the request body may take to arrive (then 408).
        on_store_error: a :class:`~telegram_idem._admission.StorePolicy` (or its string
            value): ``"fail_closed"`` answers 503; ``"fail_open"`` dispatches the update
            in-process with ``fail_open_dispatch`` (unguarded, the update bound) and
            answers 200.
        fail_open_dispatch: required for ``fail_open``.
        on_admitted: called after each new entry (e.g. ``worker.notify``, which
            :func:`~telegram_idem.ingress.register` sets when it is ``None``).
        ordering: how entries are ordered (default: chat, split by business connection
            and forum topic; callback queries in their own lane) —
            :class:`~telegram_idem._ordering.Ordering`.
        max_batch: most deliveries admitted in one store write. Deliveries that arrive
            while an admission is being written wait and go together in the next one
            (:class:`~telegram_idem.ingress._batching.AdmissionBatches`), so under load
            the store writes once per batch, not once per POST, and the answers do not
            queue behind each other's commits; alone, a delivery is written at once.

    Raises:
        ConfigurationError: no ``secret_token`` without ``allow_unauthenticated=True``, a
            malformed ``secret_token``, the store has no inbox, ``fail_open`` without
            ``fail_open_dispatch``, or an unknown ``on_store_error``.
    """

    def __init__(
        self,
        idem: Idem,
        *,
        bot_id: int,
        secret_token: SecretTokens = None,
        allow_unauthenticated: bool = False,
        max_body: int = DEFAULT_MAX_BODY,
        read_timeout: float = DEFAULT_READ_TIMEOUT,
        on_store_error: StorePolicyLike = StorePolicy.FAIL_CLOSED,
        fail_open_dispatch: Dispatch | None = None,
        on_admitted: Callable[[], None] | None = None,
        ordering: Ordering | None = None,
        max_batch: int = 100,
    ) -> None:
        on_store_error = StorePolicy.of(on_store_error)
        if on_store_error is StorePolicy.FAIL_OPEN and fail_open_dispatch is None:
            raise ConfigurationError("fail_open needs fail_open_dispatch to process updates")
        self.idem = idem
        self.inbox = idem.store.inbox()
        self.bot_id = bot_id
        self.secret = secret_check(
            secret_token, allow_unauthenticated=allow_unauthenticated, where="WebhookIngress"
        )
        self.max_body = max_body
        self.read_timeout = read_timeout
        self.on_store_error = on_store_error
        self.fail_open_dispatch = fail_open_dispatch
        self.on_admitted = on_admitted
        self.ordering = ordering
        self.admitted = 0
        self.duplicates = 0
        self.not_yet = 0
        """Deliveries answered 503 because another shape holds the update's claim."""
        self._unguarded: set[asyncio.Future[Any]] = set()
        self._batches = AdmissionBatches(self._admit_batch, max_batch=max_batch)

    async def _admit_batch(
        self, entries: Sequence[NewEntry], updates: Sequence[Mapping[str, Any]]
    ) -> list[Admitted]:
        return await self.idem.admit_to_inbox(
            entries, updates, bot_id=self.bot_id, store_policy=self.on_store_error, inbox=self.inbox
        )

    async def handle(self, request: web.Request) -> web.Response:
        """Answer one webhook POST (see the module's table).

        Args:
            request: the POST Telegram made to the webhook URL.

        Raises:
            aiohttp.web.HTTPException: 401, 413, 408, 400 or 503 as in the table (503 as
                ``HTTPServiceUnavailable``: the update was not admitted; Telegram re-sends).
        """
        update = await read_update(
            request, secret=self.secret, max_body=self.max_body, read_timeout=self.read_timeout
        )
        entry = new_entry(self.idem, update, bot_id=self.bot_id, ordering=self.ordering)
        admitted = await self._batches.admit(entry, update)
        if admitted.outcome is Admission.NOT_YET:
            self.not_yet += 1
        if not admitted.acknowledged:  # NOT_YET, UNAVAILABLE: Telegram re-sends
            raise web.HTTPServiceUnavailable(text=_REFUSED[admitted.outcome])
        if admitted.outcome is Admission.DUPLICATE:
            self.duplicates += 1
            return web.Response(text="duplicate")
        if admitted.outcome is Admission.UNGUARDED:
            assert self.fail_open_dispatch is not None
            dispatch = self.fail_open_dispatch
            task = asyncio.ensure_future(admitted.run(lambda: dispatch(update)))
            self._unguarded.add(task)
            task.add_done_callback(self._unguarded.discard)
            return web.Response(text="ok (unguarded)")
        self.admitted += 1
        if self.on_admitted is not None:
            self.on_admitted()
        return web.Response(text="ok")


_REFUSED = {
    Admission.NOT_YET: "in progress elsewhere",
    Admission.UNAVAILABLE: "store unavailable",
}
