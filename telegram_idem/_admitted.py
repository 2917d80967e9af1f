"""Admitting one delivery of an update, and running it: what :meth:`Idem.admit` does,
and the :class:`Admitted` it (and :meth:`Idem.admit_to_inbox`,
:mod:`telegram_idem._inbox_admission`) returns.

Every ingress shape (the aiogram middleware and webhooks, the PTB processor and webhook,
the Lambda handler, the inbox ingresses) admits here and translates the
:class:`~telegram_idem._admission.Admission` outcome into its framework's answer; an
admitted update is run by :meth:`Admitted.run`, the one place that binds the update,
keeps the claim's lease alive, and records the completion. The decision table is
:meth:`telegram_idem.Idem.admit`'s docstring and ``docs/answers.md``.

Logging (logger ``telegram_idem``), one line per situation, worded the same for every
shape: an update in progress elsewhere (WARNING); the start and the end of a wait
through a store outage (WARNING each); an admission refused by an outage (WARNING, or
ERROR with "LOST" when the caller kept trying because Telegram will not re-send it); an
update run unguarded (ERROR); an update processed whose completion could not be stored
(ERROR). Decisions themselves are events (:mod:`telegram_idem.events`), and so is each
claim the store could not answer (decision ``"store_error"``).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol, TypeVar

from telegram_idem._admission import (
    NOT_YET_STATUS,
    Admission,
    StorePolicy,
    StorePolicyLike,
    admission_for,
)
from telegram_idem._context import Guard, bind_update
from telegram_idem._heartbeat import heartbeat
from telegram_idem._records import Claim, Outcome
from telegram_idem.backends import Store
from telegram_idem.errors import (
    ConfigurationError,
    MalformedUpdateError,
    StoreError,
    UpdateInProgressError,
)
from telegram_idem.events import emit_decision

__all__ = [
    "AdmissionHost",
    "Admitted",
    "admit",
    "adopt",
    "claim_update",
    "emit_update_store_error",
    "release_quietly",
]

T = TypeVar("T")
Sleep = Callable[[float], Awaitable[None]]

log = logging.getLogger("telegram_idem")


class AdmissionHost(Guard, Protocol):
    """What admitting and running an update needs of the guard
    (:class:`telegram_idem.Idem` is one): its store, key builder and update lease."""

    store: Store
    lease: float
    update_retention: float
    heartbeat: bool
    sleep: Sleep


def _update_id(update: Mapping[str, Any]) -> int:
    uid = update.get("update_id")
    if not isinstance(uid, int) or isinstance(uid, bool):
        raise MalformedUpdateError("an update needs an integer 'update_id'")
    return uid


async def release_quietly(store: Store, key: str, token: int) -> None:
    """Release ``key`` held with ``token``; a failure is logged (WARNING with the error's
    text; its traceback only at DEBUG), not raised: the claim then frees when its lease
    ends."""
    try:
        await store.release(key, token)
    except Exception as exc:
        log.warning("could not release %s; it frees when its lease ends: %s", key, exc)
        log.debug("the release of %s failed", key, exc_info=True)


class Admitted:
    """One delivery of an update, admitted: the outcome, and what running it needs.

    Made by :meth:`telegram_idem.Idem.admit` (or :meth:`~telegram_idem.Idem.admit_to_inbox`,
    or :meth:`~telegram_idem.Idem.adopt` for an update admitted elsewhere); a shape
    translates :attr:`outcome` into its answer and runs a runnable one with :meth:`run`.

    Args:
        host: the guard that admitted it (an :class:`AdmissionHost`: the :class:`Idem`),
            which runs it.

    Attributes:
        update: the Bot API update (empty for an inbox entry that keeps something that
            is not an update).
        bot_id: the receiving bot's id.
        key: the update guard key, ``{prefix}:{bot_id}:u:{update_id}``.
        outcome: the admission's outcome.
        claim: the update guard claim: the acquired one for ``RUN`` (``None`` when the
            inbox owns the update), the one found for ``DUPLICATE`` and ``NOT_YET``;
            ``None`` for ``UNAVAILABLE`` and ``UNGUARDED``.
        error: the store's error behind ``UNAVAILABLE`` and ``UNGUARDED``, else ``None``.
        queued: ``True`` when the update was admitted into the durable inbox (``RUN``):
            the inbox worker runs it, not this delivery.
    """

    __slots__ = ("_host", "_used", "bot_id", "claim", "error", "key", "outcome", "queued", "update")

    def __init__(
        self,
        host: AdmissionHost,
        update: Mapping[str, Any],
        *,
        bot_id: int,
        key: str,
        outcome: Admission,
        claim: Claim | None = None,
        error: StoreError | None = None,
        queued: bool = False,
    ) -> None:
        self._host = host
        self._used = False
        self.update = update
        self.bot_id = bot_id
        self.key = key
        self.outcome = outcome
        self.claim = claim
        self.error = error
        self.queued = queued

    def __repr__(self) -> str:
        return f"<Admitted {self.key} {self.outcome.value}{' queued' if self.queued else ''}>"

    @property
    def update_id(self) -> int:
        """The update's ``update_id``."""
        return _update_id(self.update)

    @property
    def acknowledged(self) -> bool:
        """Whether the delivery is acknowledged (:attr:`Admission.acknowledged`)."""
        return self.outcome.acknowledged

    @property
    def webhook_status(self) -> int:
        """The HTTP status a webhook answers: 200 when :attr:`acknowledged`, else
        :data:`~telegram_idem._admission.NOT_YET_STATUS` (503), so Telegram re-sends."""
        return 200 if self.outcome.acknowledged else NOT_YET_STATUS

    async def run(self, call: Callable[[], Awaitable[T]]) -> T:
        """Run the admitted update once: ``call()`` with the update bound (so
        ``@idempotent``, steps and locks work inside), the claim's lease kept alive by a
        heartbeat, and the update recorded completed when ``call`` returns.

        ``UNGUARDED`` runs ``call`` with the update bound and no claim. ``RUN`` owned by
        the inbox (not :attr:`queued`) binds and runs it (the inbox recorded it).

        Args:
            call: processes the update (a dispatcher feed).

        Returns:
            What ``call`` returned. If the completion could not be stored (the lease was
            taken over, or the store stopped answering), that is logged once at ERROR
            (a re-delivery after the lease would run the update again) and the result is
            still returned: the update *was* processed.

        Raises:
            UpdateInProgressError: ``NOT_YET``: another holder's lease is alive; the
                delivery must not be acknowledged.
            StoreError: ``UNAVAILABLE``: the store could not answer (:attr:`error`).
            ConfigurationError: ``DUPLICATE`` (never run again), an update queued in the
                inbox (its worker runs it), or ``run`` called a second time.
            Exception: whatever ``call`` raised; the claim is released first, so a
                re-delivery runs the update again.
        """
        claim = self._claim_to_run()
        host = self._host
        if claim is None:  # unguarded, or owned by the inbox: nothing to record
            with bind_update(self.update, bot_id=self.bot_id, idem=host, admission=self.outcome):
                return await call()
        key, token = claim.record.key, claim.token
        try:
            with bind_update(self.update, bot_id=self.bot_id, idem=host, admission=self.outcome):
                with heartbeat(
                    lambda: host.store.extend(key, token, lease=host.lease),
                    interval=host.lease / 3,
                    name=key,
                    enabled=host.heartbeat,
                ):
                    result = await call()
        except BaseException:
            await release_quietly(host.store, key, token)
            raise
        await self._complete(key, token)
        return result

    def _claim_to_run(self) -> Claim | None:
        if self.outcome is Admission.NOT_YET:
            raise UpdateInProgressError(
                f"{self.key} is in progress elsewhere; not acknowledged, so Telegram "
                "re-sends it and a delivery after the holder's lease runs it",
                key=self.key,
                record=self.claim.record if self.claim is not None else None,
            )
        if self.outcome is Admission.UNAVAILABLE:
            assert self.error is not None
            raise self.error
        if self.outcome is Admission.DUPLICATE:
            raise ConfigurationError(
                f"{self.key} is a duplicate (processed before): it is not run again; "
                "check Admitted.outcome before run()"
            )
        if self.queued:
            raise ConfigurationError(f"{self.key} is queued in the inbox: its worker runs it")
        if self._used:
            raise ConfigurationError(f"{self.key} was run already by this admission")
        self._used = True
        return self.claim if self.outcome is Admission.RUN else None

    async def _complete(self, key: str, token: int) -> None:
        host = self._host
        try:
            if await host.store.complete(key, token, b"null", retention=host.update_retention):
                return
            why = "its lease was taken over"
        except StoreError as exc:
            why = f"the store could not answer: {exc}"
        log.error(
            "update %s was processed but its completion was not stored (%s); a "
            "re-delivery after the lease (%s s) would run it again",
            self.update.get("update_id"),
            why,
            host.lease,
        )

    async def fail(self, problem: BaseException, *, source: str) -> bool:
        """Record that the admitted update cannot be processed (the framework cannot
        parse it): the claim is stored as a failure carrying ``problem``, where an
        operator sees it (``store.get(key)``), and logged at ERROR. A webhook then
        acknowledges the update (200): a re-send could never parse either, and Telegram
        would re-send it for 24 h (see ``docs/answers.md``).

        Args:
            problem: why it cannot be processed.
            source: who could not process it, for the record (``"aiogram"``, …).

        Returns:
            ``True`` if the failure was stored; ``False`` if the store could not answer
            or the claim was taken over (logged as a WARNING; the claim then ends with its
            lease, so a re-send is refused again the same way), and for ``UNGUARDED``
            (nothing can be recorded during the outage; logged at ERROR).

        Raises:
            ConfigurationError: the outcome is not ``RUN`` or ``UNGUARDED``, or the update
                is queued in the inbox.
        """
        if self.outcome is Admission.UNGUARDED:
            log.error(
                "update %s does not parse in %s; not processed, nothing recorded (store "
                "outage, fail_open): %s",
                self.update.get("update_id"),
                source,
                problem,
            )
            return False
        if self.outcome is not Admission.RUN or self.claim is None or self.queued:
            raise ConfigurationError(f"{self.key} is not held by this delivery: nothing to fail")
        host, key = self._host, self.key
        log.error(
            "update %s does not parse in %s; acknowledged, not processed, recorded as failed: %s",
            key,
            source,
            problem,
        )
        error = json.dumps(
            {"type": type(problem).__name__, "message": f"{source} cannot parse it: {problem}"}
        ).encode()
        try:
            stored = await host.store.fail(
                key, self.claim.token, error, retention=host.update_retention
            )
        except StoreError as exc:
            log.warning("could not store the failure of update %s: %s", key, exc)
            return False
        if not stored:
            log.warning("could not store the failure of update %s: its claim was taken over", key)
        return stored

    async def release(self) -> bool:
        """Give the acquired claim back without running the update (the hand-off to
        where it would run failed), so a re-delivery claims it anew. Token-checked:
        a claim taken over meanwhile is not touched.

        Returns:
            ``True`` if released; ``False`` if there was no claim to give back, it was
            no longer this delivery's, or the store could not answer (logged as a
            WARNING; it then frees when its lease ends).
        """
        if self.outcome is not Admission.RUN or self.claim is None or self.queued:
            return False
        try:
            return await self._host.store.release(self.key, self.claim.token)
        except StoreError as exc:
            log.warning("could not release %s; it frees when its lease ends: %s", self.key, exc)
            return False


async def claim_update(host: AdmissionHost, update: Mapping[str, Any], *, bot_id: int) -> Claim:
    """Claim the update guard key ``{bot_id}:u:{update_id}`` once and emit the decision.

    Raises:
        MalformedUpdateError: no integer ``update_id``.
        StoreError: the store could not answer.
    """
    return await _claim_key(host, host.keys.update(bot_id, _update_id(update)), update, bot_id)


def emit_update_store_error(
    key: str, update: Mapping[str, Any] | None, elapsed_ms: float, bot_id: int
) -> None:
    """The decision event (``"store_error"``, boundary ``update``) of an update whose
    claim or inbox admission under ``key`` the store could not answer, ``elapsed_ms``
    after it was asked: one emit for every admission shape."""
    emit_decision(
        boundary="update",
        key=key,
        decision="store_error",
        update=update,
        elapsed_ms=elapsed_ms,
        bot_id=bot_id,
    )


async def _claim_key(
    host: AdmissionHost, key: str, update: Mapping[str, Any], bot_id: int
) -> Claim:
    """:func:`claim_update` of the update's key ``key``, already made."""
    started = time.perf_counter()
    try:
        claim = await host.store.claim(key, lease=host.lease, retention=host.update_retention)
    except StoreError:
        emit_update_store_error(key, update, (time.perf_counter() - started) * 1000, bot_id)
        raise
    emit_decision(
        boundary="update",
        key=claim.record.key,
        decision=str(claim.outcome),  # the value, without the enum property
        update=update,
        fencing_token=claim.token,
        elapsed_ms=(time.perf_counter() - started) * 1000,
        bot_id=bot_id,
    )
    return claim


async def _claim_waiting(
    host: AdmissionHost,
    key: str,
    update: Mapping[str, Any],
    *,
    bot_id: int,
    wait: float,
    seen: Claim | None = None,
) -> Claim:
    """Claim, looking again with backoff (50 ms doubling to 1 s) while the claim is in
    progress, until ``wait`` seconds have passed. ``seen``: the answer of a claim just
    made, taken as the first look."""
    deadline = time.monotonic() + wait
    delay = 0.05
    while True:
        if seen is not None:
            claim, seen = seen, None
        else:
            claim = await _claim_key(host, key, update, bot_id)
        if claim.outcome is not Outcome.IN_PROGRESS or wait <= 0:
            return claim
        left = deadline - time.monotonic()
        if claim.outcome is not Outcome.IN_PROGRESS or left <= 0:
            return claim
        await host.sleep(min(delay, left))
        delay = min(delay * 2, 1.0)


async def admit(
    host: AdmissionHost,
    update: Mapping[str, Any],
    *,
    bot_id: int,
    wait: float = 0.0,
    outage_wait: float = 0.0,
    store_policy: StorePolicyLike = StorePolicy.FAIL_CLOSED,
) -> Admitted:
    """:meth:`telegram_idem.Idem.admit` (see there)."""
    policy = store_policy if isinstance(store_policy, StorePolicy) else StorePolicy.of(store_policy)
    uid = _update_id(update)
    key = host.keys.update(bot_id, uid)
    started = time.monotonic()
    first: Claim | StoreError | None
    try:  # the common case first: one claim, decided, without the wait loop
        first = await _claim_key(host, key, update, bot_id)
    except StoreError as exc:
        first = exc
    if isinstance(first, Claim) and (first.outcome is not Outcome.IN_PROGRESS or wait <= 0):
        return _admitted(host, update, bot_id=bot_id, key=key, claim=first, wait=wait)
    # In progress elsewhere with a wait, or a store error: wait and claim again.
    if policy is StorePolicy.FAIL_OPEN:
        outage_wait = 0.0
    outage_deadline = started + outage_wait
    outage_delay = 0.5
    down_since: float | None = None
    while True:
        try:
            if isinstance(first, StoreError):
                raise first
            claim = await _claim_waiting(host, key, update, bot_id=bot_id, wait=wait, seen=first)
        except StoreError as exc:
            first = None
            left = outage_deadline - time.monotonic()
            if left > 0:
                if down_since is None:
                    down_since = time.monotonic()
                    log.warning(
                        "store unavailable (%s): update %s waits up to %.0f s for it, since "
                        "Telegram will not re-send it",
                        exc,
                        uid,
                        left,
                    )
                await host.sleep(min(outage_delay, left))
                outage_delay = min(outage_delay * 2, 10.0)
                continue
            return _outage(
                host, update, bot_id=bot_id, key=key, policy=policy, error=exc, waited=outage_wait
            )
        if down_since is not None:
            log.warning(
                "store answers again: update %s claimed after %.1f s",
                uid,
                time.monotonic() - down_since,
            )
        return _admitted(host, update, bot_id=bot_id, key=key, claim=claim, wait=wait)


def _admitted(
    host: AdmissionHost,
    update: Mapping[str, Any],
    *,
    bot_id: int,
    key: str,
    claim: Claim,
    wait: float,
) -> Admitted:
    """The admission a store's answer ``claim`` makes (logged when in progress elsewhere)."""
    outcome = admission_for(claim.outcome)
    if outcome is Admission.NOT_YET:
        log.warning(
            "update %s is in progress elsewhere (another holder's lease is alive%s): "
            "not run here, not acknowledged as a duplicate",
            update.get("update_id"),
            f", still after {wait:.1f} s" if wait > 0 else "",
        )
    return Admitted(host, update, bot_id=bot_id, key=key, outcome=outcome, claim=claim)


def _outage(
    host: AdmissionHost,
    update: Mapping[str, Any],
    *,
    bot_id: int,
    key: str,
    policy: StorePolicy,
    error: StoreError,
    waited: float,
) -> Admitted:
    """The admission of an update whose claim the store could not answer, logged.

    ``waited > 0`` means Telegram will not re-send the update (the caller kept trying for
    that reason): given up, it is lost."""
    uid = update.get("update_id")
    if policy is StorePolicy.FAIL_OPEN:
        log.error("store outage: update %s runs unguarded (fail_open): %s", uid, error)
        outcome = Admission.UNGUARDED
    elif waited > 0:
        log.error(
            "store outage: update %s LOST: not run (fail_closed) after trying its claim for "
            "%.0f s, and Telegram will not re-send it: %s",
            uid,
            waited,
            error,
        )
        outcome = Admission.UNAVAILABLE
    else:
        log.warning("store outage: update %s not admitted (fail_closed): %s", uid, error)
        outcome = Admission.UNAVAILABLE
    return Admitted(host, update, bot_id=bot_id, key=key, outcome=outcome, error=error)


def adopt(
    host: AdmissionHost,
    update: Mapping[str, Any],
    *,
    bot_id: int,
    outcome: Admission = Admission.RUN,
) -> Admitted:
    """:meth:`telegram_idem.Idem.adopt` (see there)."""
    if outcome not in (Admission.RUN, Admission.UNGUARDED):
        raise ConfigurationError(f"only a RUN or UNGUARDED admission is adopted, not {outcome}")
    key = host.keys.update(bot_id, _update_id(update))
    return Admitted(host, update, bot_id=bot_id, key=key, outcome=outcome)
