"""The sender: what bot code calls to make a Bot API call that is sent once.

``await outbound.call("sendMessage", {"chat_id": 1, "text": "hi"})`` returns Telegram's
``result`` (a dict for a Message). Whether the call is durable depends on its key:

- ``key="..."`` given: the effect key ``<prefix>:<bot_id>:o:<key>``;
- inside an ``@idempotent`` action or a step: ``<action key>:o:<digest>:<n>``, the ``n``-th
  call with this content in the action. A retried action (after a crash) makes the same
  keys, whatever order ``asyncio.gather`` ran its calls in, so what was sent is not sent
  again: its stored result is returned;
- neither: the call is not durable: it is sent at once, paced by flood control only.

A durable call is enqueued (idempotent by key), then delivered inline when its chat is
idle (latency: one API call), else by the background relay; the caller waits up to
``wait`` seconds for its outcome:

| entry | ``call`` |
|---|---|
| delivered | returns its ``result`` |
| superseded (latest-wins edits) | returns the result of the newest call that replaced it |
| dead | raises :class:`~telegram_idem.errors.SendFailedError` |
| parked | raises :class:`~telegram_idem.errors.ChatParkedError` |
| unknown | raises :class:`~telegram_idem.errors.UnknownOutcomeError` |
| still pending after ``wait`` | raises :class:`~telegram_idem.errors.DeliveryTimeoutError` (it is still sent) |

**Inside a database transaction** (``conn=``) the entry is written with the caller's own
writes (``Outbox.enqueue_in``) and ``call`` returns its effect key at once: the entry is
not visible before the transaction commits, so nothing can wait for it there. After the
commit, ``await outbound.result(key)`` waits for it; the relay sends it either way.
``wait=None`` returns the effect key without waiting too.

**Inside** ``async with idem.transaction(conn)`` (a joined transaction of the store this
outbox belongs to), ``conn`` need not be given: ``enqueue`` and ``call(..., wait=None)``
use the bound connection, so the entry commits with the business writes and the action's
record. ``call`` that would wait for the answer there raises
:class:`~telegram_idem.errors.ConfigurationError`: the relay cannot send before the commit.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Mapping
from types import TracebackType
from typing import Any, Self

from telegram_idem._context import current_action
from telegram_idem._joined import bound_transaction
from telegram_idem._keys import KeyBuilder
from telegram_idem.errors import (
    ChatParkedError,
    ConfigurationError,
    ConflictError,
    DeliveryTimeoutError,
    SendError,
    SendFailedError,
    UnknownOutcomeError,
)
from telegram_idem.flood import FloodControl, Limits, current_priority
from telegram_idem.outbox._base import (
    LIVE,
    AmbiguousPolicy,
    CallStatus,
    NewCall,
    Outbox,
    OutboxEntry,
)
from telegram_idem.outbox._calls import (
    OutcomeClass,
    call_digest,
    classify,
    collapse_key,
    default_policy,
    encode_params,
    ordering_key_of,
)
from telegram_idem.outbox._failures import AmbiguousCall
from telegram_idem.outbox._relay import Relay, redactor_of
from telegram_idem.outbox._transport import (
    TOKEN_IN_PARAMS,
    BotAPI,
    HttpBotAPI,
    bot_id_of_token,
)

__all__ = ["Outbound"]

_CODE = re.compile(r"^(?:attempt \d+ \(\d+ failed\): )?(\d{3}): (.*)$", re.DOTALL)
"""A recorded error ``"<error_code>: <description>"``, after the relay's attempt tag if any
(a parked entry's error carries one)."""


def _outbox_of(store: object) -> Outbox:
    """``store.outbox()``, by duck typing (the stores import this package for the
    contract, so importing ``telegram_idem.backends.outbox_of`` back would be a cycle;
    the base ``Store.outbox`` raises the error ``outbox_of`` raises)."""
    getter = getattr(store, "outbox", None)
    if not callable(getter):
        raise ConfigurationError(f"{store!r} has no outbox (no outbox() method)")
    outbox = getter()
    if not isinstance(outbox, Outbox):
        raise ConfigurationError(f"{store!r}.outbox() did not return an Outbox")
    return outbox


class Outbound:
    """Durable Bot API calls for one bot (see the module docstring).

    Args:
        outbox: the store's outbox.
        api: the Bot API transport.
        bot_id: the bot that sends.
        flood: flood control (``None``: calls are not paced).
        keys: the key layout (give the one your ``Idem`` uses: ``idem.keys``).
        retention: seconds a delivered call is remembered (replays answer from it).
        lease: seconds a relay holds a call it is sending.
        relay: the relay that sends (default: one made from the above).
        owns_api: close ``api`` (an :class:`HttpBotAPI`) when this object closes.
    """

    def __init__(
        self,
        outbox: Outbox,
        api: BotAPI,
        *,
        bot_id: int,
        flood: FloodControl | None = None,
        keys: KeyBuilder | None = None,
        retention: float = 7 * 24 * 3600.0,
        lease: float = 30.0,
        relay: Relay | None = None,
        owns_api: bool = False,
    ) -> None:
        self.outbox = outbox
        self.api = api
        self.bot_id = bot_id
        self.flood = flood
        self.keys = keys if keys is not None else KeyBuilder()
        self.retention = retention
        self.relay = (
            relay
            if relay is not None
            else Relay(outbox, api, bot_id=bot_id, flood=flood, lease=lease)
        )
        self._owns_api = owns_api

    def __repr__(self) -> str:
        return f"Outbound(bot_id={self.bot_id}, outbox={type(self.outbox).__name__})"

    @classmethod
    def for_store(
        cls,
        store: object,
        *,
        token: str,
        bot_id: int | None = None,
        base_url: str = "https://api.telegram.org",
        limits: Limits | None = None,
        keys: KeyBuilder | None = None,
        lease: float = 30.0,
        retention: float = 7 * 24 * 3600.0,
    ) -> Outbound:
        """Calls kept in ``store``'s outbox, paced by its flood budget, sent over HTTP
        (:class:`~telegram_idem.outbox._transport.HttpBotAPI`, closed with this object).

        Args:
            store: a store with an outbox and a flood budget (``idem.store``).
            token: the bot token (never logged or stored).
            bot_id: the bot's id; by default the number before ``:`` in the token.
            base_url: the Bot API server.
            limits: flood-control budgets (Telegram's guidance by default).
            keys: the key layout (``idem.keys``).
            lease: seconds a relay holds a call it is sending; a call taken by a process
                that died is decided (``hold``: unknown; ``resend``: sent again) once it
                ends.
            retention: seconds a delivered call is remembered (replays answer from it).

        Raises:
            ConfigurationError: the store has no outbox or no flood budget, or the token
                has no bot id and none was given.
        """
        if bot_id is None:
            try:
                bot_id = bot_id_of_token(token)
            except ValueError as exc:
                raise ConfigurationError(str(exc)) from None
        outbox = _outbox_of(store)
        flood = FloodControl.for_store(store, bot_id=bot_id, limits=limits, keys=keys)
        api = HttpBotAPI(token, base_url=base_url)
        return cls(
            outbox,
            api,
            bot_id=bot_id,
            flood=flood,
            keys=keys,
            lease=lease,
            retention=retention,
            owns_api=True,
        )

    # ------------------------------------------------------------------ lifecycle

    async def __aenter__(self) -> Self:
        """Start the background relay (retries, calls left over from a crash)."""
        self.relay.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Stop the relay (:meth:`Relay.stop`) and close the transport this object made."""
        await self.close()

    async def close(self) -> None:
        """Stop the relay and close the transport :meth:`for_store` made. Idempotent."""
        await self.relay.stop()
        if self._owns_api and isinstance(self.api, HttpBotAPI):
            await self.api.close()

    # ------------------------------------------------------------------ calls

    def effect_key(self, method: str, params: bytes, key: str | None) -> str | None:
        """The effect key a call gets here (see the module docstring), or ``None`` when
        it is not durable. Inside an action, each call advances the action's counter.

        Args:
            method: the Bot API method.
            params: the encoded parameters (:func:`~telegram_idem.outbox.encode_params`).
            key: the caller's own name for the call, or ``None``.
        """
        if key is not None:
            return self.keys.effect(self.bot_id, key)
        action = current_action()
        if action is None:
            return None
        digest = call_digest(method, params)
        return self.keys.call(action.key, digest, action.next_call(digest))

    async def call(
        self,
        method: str,
        params: Mapping[str, Any],
        *,
        key: str | None = None,
        policy: AmbiguousPolicy | None = None,
        priority: int | None = None,
        wait: float | None = 60.0,
        conn: object | None = None,
    ) -> Any:
        """Make a Bot API call, once (see the module docstring).

        Args:
            method: the Bot API method (``"sendMessage"``).
            params: its parameters, JSON values (``None`` values are dropped); local
                files as :class:`~telegram_idem.outbox._calls.FileRef`.
            key: the call's own effect name (durable outside an action too).
            policy: what an ambiguous outcome does (default
                :func:`~telegram_idem.outbox._calls.default_policy` of ``method``).
            priority: ``REPLY`` (0) … ``BULK`` (10); default the enclosing
                ``telegram_idem.flood.priority(...)`` block's, else ``REPLY``.
            wait: seconds to wait for the outcome; ``None``: return the effect key at
                once (a running relay sends it).
            conn: the caller's open database transaction to enqueue in: returns the
                effect key at once (nothing can wait inside the transaction). Inside
                ``idem.transaction(conn)`` on this outbox's store, the bound connection
                is the default.

        Returns:
            Telegram's ``result`` (JSON: a dict for a Message, ``True`` for most others);
            the effect key (``str``) when ``wait`` is ``None`` or ``conn`` is given.

        Raises:
            TypeError: ``params`` holds a value JSON cannot encode (nothing stored).
            ValueError: a float that is not finite, or a durable call whose params hold
                the bot token, as written or percent-encoded (a Bot API file download
                URL ``.../file/bot<token>/...``: send the ``file_id`` instead), or a
                ``key`` that holds it; nothing stored, and the message does not show
                the token.
            SendFailedError: Telegram refused it for good (a dead letter).
            ChatParkedError: its chat is parked (the bot was blocked there).
            UnknownOutcomeError: it may or may not have been applied (policy ``hold``).
            DeliveryTimeoutError: not settled within ``wait``; it is still sent.
            CallNotSent: a call that is not durable could not be sent.
            StoreError: the store could not answer.
            ConfigurationError: ``conn`` given to a store that cannot join it, or a call
                that waits (``wait`` not ``None``) inside ``idem.transaction(conn)``.
            ConflictError: its effect key is already stored for a different call (another
                method, or other params: ``key=`` given to two different calls); nothing
                is sent and the first call's outcome is not replayed.
        """
        if conn is None:
            conn = self._joined_conn()
            if conn is not None and wait is not None:
                raise ConfigurationError(
                    f"{method}: call(..., wait=...) inside idem.transaction(conn) cannot "
                    "wait: the relay sends only after the transaction commits; use "
                    "enqueue(...) (or wait=None), then await result(key) after the commit"
                )
        body = encode_params(params)
        prio = current_priority(priority)
        if key is None and current_action() is None:
            return await self._direct(method, dict(params), prio, wait)
        self._refuse_token(method, body, key)
        effect = self.effect_key(method, body, key)
        assert effect is not None
        call = NewCall(
            key=effect,
            bot_id=self.bot_id,
            method=method,
            params=body,
            ordering_key=ordering_key_of(params),
            collapse_key=collapse_key(method, params),
            policy=policy if policy is not None else default_policy(method),
            priority=prio,
            retention=self.retention,
        )
        if conn is not None:
            entry, written = await self.outbox.enqueue_in(conn, call)
            if not written:
                _check_same_call(entry, call)
            self.relay.notify()
            return effect
        entry, written = await self.outbox.enqueue(call)
        if not written:
            _check_same_call(entry, call)
        if wait is None:
            self.relay.notify()
            return effect
        deadline = time.monotonic() + wait
        if entry.status in LIVE:
            inline = self.relay.spawn(self.relay.deliver_unit(call.unit, until_key=effect))
            await asyncio.wait({inline}, timeout=wait)
            if inline.done() and not inline.cancelled() and inline.exception() is not None:
                raise inline.exception()  # type: ignore[misc]
        return await self._outcome(effect, deadline, wait)

    def _refuse_token(self, method: str, body: bytes, key: str | None) -> None:
        """Raise ``ValueError`` (the token masked, never echoed) when ``body`` or ``key``
        holds the bot token: a stored entry, its log lines and every listing of it would
        show the credential. A transport that knows no token (no ``carries_token``) is
        not asked."""
        carries = getattr(self.api, "carries_token", None)
        if not callable(carries):
            return
        if carries(body):
            raise ValueError(f"{method}: {TOKEN_IN_PARAMS}")
        if key is not None and carries(key.encode("utf-8", "surrogatepass")):
            raise ValueError(
                f"{method}: the key= carries the bot token (a download URL in it?): name "
                "the call by something else, such as the file_id. Nothing was stored"
            )

    def _redact(self, text: str) -> str:
        """``text`` with the bot token masked, when the transport knows it."""
        return redactor_of(self.api)(text)

    def _joined_conn(self) -> object | None:
        """The connection of the bound ``idem.transaction(conn)`` if its store is this
        outbox's (same outbox object), else ``None``."""
        joined = bound_transaction()
        if joined is None:
            return None
        getter = getattr(joined.store, "outbox", None)
        try:
            mine = callable(getter) and getter() is self.outbox
        except ConfigurationError:  # a store without an outbox
            mine = False
        return joined.conn if mine else None

    async def enqueue(
        self,
        method: str,
        params: Mapping[str, Any],
        *,
        key: str | None = None,
        policy: AmbiguousPolicy | None = None,
        priority: int | None = None,
        conn: object | None = None,
    ) -> str:
        """Store a durable call for the relay to send, without waiting for it: the form
        to use inside your own database transaction (``conn``), where nothing can wait.

        Same as ``call(..., wait=None)`` (or ``call(..., conn=conn)``); await its outcome
        later with :meth:`result`.

        Args:
            method: as :meth:`call`.
            params: as :meth:`call`.
            key: as :meth:`call`.
            policy: as :meth:`call`.
            priority: as :meth:`call`.
            conn: as :meth:`call` (inside ``idem.transaction(conn)`` on this outbox's
                store, the bound connection is the default: the entry commits with the
                bot's writes).

        Returns:
            The effect key.

        Raises:
            ConfigurationError: the call is not durable (outside an action and no
                ``key``: there would be nothing to send it later), or ``conn`` given to a
                store that cannot join it.
            TypeError: as :meth:`call` (nothing stored).
            ValueError: as :meth:`call` (nothing stored; params that hold the bot
                token are refused).
            ConflictError: as :meth:`call`.
            StoreError: the store could not answer.
        """
        if key is None and current_action() is None:
            raise ConfigurationError(
                f"{method}: enqueue needs a key= outside an @idempotent action or step"
            )
        effect = await self.call(
            method, params, key=key, policy=policy, priority=priority, wait=None, conn=conn
        )
        assert isinstance(effect, str)
        return effect

    async def result(self, key: str, *, wait: float = 60.0) -> Any:
        """Wait for the outcome of the call stored under ``key`` (a full effect key, as
        :meth:`call` returned it).

        Args:
            key: the effect key.
            wait: seconds to wait while it is pending.

        Returns:
            Its ``result`` (for a superseded edit: the newest edit's).

        Raises:
            SendFailedError, ChatParkedError, UnknownOutcomeError, DeliveryTimeoutError:
                as :meth:`call`.
            SendError: nothing is stored under ``key`` (never enqueued, or forgotten
                after its retention).
            StoreError: the store could not answer.
        """
        return await self._outcome(key, time.monotonic() + wait, wait)

    async def _outcome(self, key: str, deadline: float, wait: float) -> Any:
        """:meth:`result` until ``deadline`` (``time.monotonic()``); ``wait`` is what the
        caller asked for, named in the timeout error."""
        current = key
        pause = 0.01
        while True:
            entry = await self.outbox.get(current)
            if entry is None:
                raise SendError(f"no outbox entry is stored under {current}", key=current)
            status = entry.status
            if status is CallStatus.DELIVERED:
                return json.loads(entry.result) if entry.result is not None else None
            if status is CallStatus.SUPERSEDED:
                current = json.loads(entry.result or b"{}")["superseded_by"]
                continue
            if status in (CallStatus.DEAD, CallStatus.PARKED):
                error = entry.last_error or (
                    "its chat is parked: an earlier call to it was refused with 403 (the "
                    "bot was blocked); `telegram-idem outbox unpark` sends it once the "
                    "user unblocks the bot"
                    if status is CallStatus.PARKED
                    else "no reason recorded"
                )
                match = _CODE.match(error)
                code, description = (int(match[1]), match[2]) if match else (None, error)
                if code is None and status is CallStatus.PARKED and not entry.last_error:
                    code = 403  # parked behind its chat's refused call, not sent itself
                kind = ChatParkedError if status is CallStatus.PARKED else SendFailedError
                raise kind(
                    f"{entry.method} {current}: {status.value}: {error}",
                    key=current,
                    error_code=code,
                    description=description,
                )
            if status is CallStatus.UNKNOWN:
                raise UnknownOutcomeError(
                    f"{entry.method} {current}: the outcome is unknown ({entry.last_error}); "
                    "it is not sent again by itself: resolve or redrive it",
                    key=current,
                )
            left = deadline - time.monotonic()
            if left <= 0:
                raise DeliveryTimeoutError(
                    f"{entry.method} {current}: not delivered within {wait} s; it stays in "
                    "the outbox and is still sent",
                    key=current,
                )
            await asyncio.sleep(min(pause, left))
            pause = min(pause * 2, self.relay.poll_interval)

    async def _direct(
        self, method: str, params: dict[str, Any], priority: int, wait: float | None
    ) -> Any:
        """A call that is not durable: sent now, paced by flood control only."""
        deadline = time.monotonic() + wait if wait is not None else None
        while True:
            if self.flood is not None:
                try:
                    await self.flood.wait_turn(method, params, priority=priority, deadline=deadline)
                except TimeoutError:
                    raise DeliveryTimeoutError(
                        f"{method}: flood control had no room within {wait} s (not sent)", key=""
                    ) from None
            try:
                answer = await self.api.call(method, encode_params(params))
            except AmbiguousCall as exc:
                raise UnknownOutcomeError(str(exc), key="") from None
            verdict = classify(answer)
            outcome = verdict.outcome
            if outcome is OutcomeClass.DELIVERED:
                return answer.result
            if outcome is OutcomeClass.ALREADY_DONE:
                return True
            if outcome is OutcomeClass.RETRY:
                delay = verdict.retry_after or 1.0
                if deadline is not None and time.monotonic() + delay > deadline:
                    raise DeliveryTimeoutError(
                        f"{method}: Telegram asked to wait {delay} s, past the wait (not sent)",
                        key="",
                    )
                if self.flood is not None:
                    await self.flood.retry_after(delay, method=method)
                else:
                    await asyncio.sleep(delay)
                continue
            if outcome is OutcomeClass.MIGRATE:
                params = {**params, "chat_id": verdict.migrate_to_chat_id}
                continue
            if outcome is OutcomeClass.AMBIGUOUS:
                raise UnknownOutcomeError(f"{method}: {self._redact(verdict.description)}", key="")
            kind = ChatParkedError if outcome is OutcomeClass.BLOCKED else SendFailedError
            description = self._redact(answer.description)
            raise kind(
                f"{method}: {answer.error_code}: {description}",
                key="",
                error_code=answer.error_code,
                description=description,
            )


def _check_same_call(stored: OutboxEntry, call: NewCall) -> None:
    """Refuse ``call`` when its effect key is already stored for a different call: a
    ``key=`` given twice for two different messages would otherwise replay the first
    call's answer to the second, silently. The one difference allowed is the ``chat_id`` a
    migration gave the stored call (a basic group's id moved to its supergroup's ``-100…``
    id; Bot API "ResponseParameters", ``migrate_to_chat_id``).

    Raises:
        ConflictError: ``stored`` holds another method or other params.
    """
    if stored.method == call.method and stored.params == call.params:
        return
    old, new = json.loads(stored.params), json.loads(call.params)
    if not isinstance(old, dict) or not isinstance(new, dict):  # not Bot API params
        differ = ["params"]
    else:
        asked, kept = new.pop("chat_id", None), old.pop("chat_id", None)
        same_chat = str(asked) == str(kept) or _migrated(asked, kept)  # "111" is 111
        differ = sorted(k for k in old.keys() | new.keys() if old.get(k) != new.get(k))
        if not same_chat:
            differ.insert(0, "chat_id")
        if stored.method != call.method:
            differ.insert(0, "method")
        if not differ:
            return
    raise ConflictError(
        f"effect key {stored.key} is already stored for another call ({stored.method} in "
        f"{stored.ordering_key}; this one is {call.method} in {call.unit}, and differs in "
        f"{', '.join(differ)}): its outcome would be replayed to the wrong call; give each "
        "distinct call its own key= (inside an action, leave key= out: the derived key "
        "tells calls apart)",
        key=stored.key,
    )


def _migrated(asked: object, stored: object) -> bool:
    """Whether ``stored`` is the supergroup a basic group ``asked`` migrated to."""
    return (
        isinstance(asked, int)
        and isinstance(stored, int)
        and asked < 0
        and not str(asked).startswith("-100")
        and str(stored).startswith("-100")
    )
