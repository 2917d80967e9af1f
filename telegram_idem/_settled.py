"""What a claim answered when it did not acquire the key: the stored result to replay, a
stored failure to raise again, or a conflict. One rule for every runner (the store's own
runs in :mod:`telegram_idem._guard`, joined runs in :mod:`telegram_idem._transaction`),
and the one shape a stored failure is written in."""

from __future__ import annotations

import contextlib
import json
import time
from typing import Any, Literal

from telegram_idem._codec import ResultCodec
from telegram_idem._context import bound_update
from telegram_idem._records import Claim, Outcome, Record
from telegram_idem.errors import ConflictError, StoredFailureError
from telegram_idem.events import emit_decision

__all__ = [
    "SETTLED",
    "emit_claim",
    "emit_claim_error",
    "failure_bytes",
    "settled_answer",
    "stored_failure",
]

SETTLED = frozenset({Outcome.REPLAY, Outcome.FAILED, Outcome.CONFLICT})
"""The outcomes :func:`settled_answer` answers."""


def failure_bytes(exc: BaseException) -> bytes:
    """How a stored failure is recorded: ``{"type": ..., "message": ...}`` as JSON
    (replayed as :class:`~telegram_idem.errors.StoredFailureError`). Never raises."""
    return json.dumps({"type": type(exc).__name__, "message": str(exc)}).encode()


def stored_failure(record: Record) -> StoredFailureError:
    """The :class:`~telegram_idem.errors.StoredFailureError` replaying ``record``'s
    stored failure (a record whose failure does not parse still gives one)."""
    info: dict[str, Any] = {}
    with contextlib.suppress(ValueError, TypeError):
        info = json.loads(record.result or b"{}")
    return StoredFailureError(
        f"{record.key} failed before and its failure was stored: "
        f"{info.get('type', '?')}: {info.get('message', '')}",
        key=record.key,
        record=record,
        error_type=str(info.get("type", "")),
        error_message=str(info.get("message", "")),
    )


def settled_answer(claim: Claim, codec: ResultCodec) -> Any:
    """The answer to a claim whose outcome is in :data:`SETTLED`: the decoded stored
    result for ``REPLAY``.

    Raises:
        StoredFailureError: ``FAILED`` (the stored failure, replayed).
        ConflictError: ``CONFLICT`` (the key was first used with another fingerprint).
        ValueError: another outcome (a caller's bug).
    """
    record = claim.record
    if claim.outcome is Outcome.REPLAY:
        assert record.result is not None
        return codec.decode(record.result)
    if claim.outcome is Outcome.FAILED:
        raise stored_failure(record)
    if claim.outcome is Outcome.CONFLICT:
        raise ConflictError(
            f"{record.key} was first used with a different payload fingerprint",
            key=record.key,
            record=record,
        )
    raise ValueError(f"{claim.outcome} is not a settled outcome")


def emit_claim(
    claim: Claim,
    *,
    boundary: Literal["action", "step"],
    key: str,
    handler: str | None,
    started: float,
) -> None:
    """Emit the decision event of one claim of ``key`` (its outcome and fencing token),
    with the bound update and the claim's latency since ``started``
    (``time.perf_counter()`` before it). Never raises (the event hooks' own rule)."""
    ctx = bound_update()
    emit_decision(
        boundary=boundary,
        key=key,
        decision=claim.outcome.value,
        update=ctx.update if ctx is not None else None,
        handler=handler,
        fencing_token=claim.token,
        elapsed_ms=(time.perf_counter() - started) * 1000,
        bot_id=ctx.bot_id if ctx is not None else None,
    )


def emit_claim_error(
    *,
    boundary: Literal["action", "step"],
    key: str,
    handler: str | None,
    started: float,
) -> None:
    """Emit decision ``"store_error"`` for a claim of ``key`` the store could not answer
    (a :class:`~telegram_idem.errors.StoreError` is on its way to the caller), with the
    bound update and the time since ``started`` (``time.perf_counter()`` before it)."""
    ctx = bound_update()
    emit_decision(
        boundary=boundary,
        key=key,
        decision="store_error",
        update=ctx.update if ctx is not None else None,
        handler=handler,
        elapsed_ms=(time.perf_counter() - started) * 1000,
        bot_id=ctx.bot_id if ctx is not None else None,
    )
