"""Every store keeps payload, result and error bytes losslessly (issue 8, item 10).

The payload and result round trips are part of the conformance suite
(tests/stores/test_conformance.py); here: error texts and the decision log.

An update may carry what JSON allows and text columns refuse: a lone UTF-16 surrogate
escape (``"\\ud800"``), a NUL escape (``"\\u0000"``), emoji, right-to-left text. The
ingress encodes it ASCII-safe, but a store must not depend on that: the inbox hands back
the exact bytes it admitted, a record the exact result bytes, whatever they are.
"""

from __future__ import annotations

import io
import logging
import sys

import pytest

from telegram_idem import Store
from telegram_idem._logs import decision_logger, log_decision
from telegram_idem._text import storable_text
from telegram_idem.inbox._base import NewEntry
from telegram_idem.testing.conformance import ODD_PAYLOADS, ODD_TEXTS

RETENTION = 3600.0
LEASE = 30.0


@pytest.mark.inbox
async def test_an_error_text_quoting_odd_characters_is_kept_not_refused(store: Store) -> None:
    inbox = store.inbox()
    await inbox.admit(NewEntry("idem:7:u:1", "chat:1", ODD_PAYLOADS[0]), retention=RETENTION)
    error = "ValueError: " + "|".join(ODD_TEXTS)
    taken = await inbox.take(lease=LEASE)
    assert taken is not None and await inbox.retry(taken, delay=0.0, error=error)
    again = await inbox.take(lease=LEASE)
    assert again is not None and again.last_error == storable_text(error)
    assert await inbox.bury(again, error=error)
    (dead,) = await inbox.dead_letters()
    assert dead.payload == ODD_PAYLOADS[0]
    assert dead.last_error == storable_text(error)
    assert dead.last_error == (
        "ValueError: \\ud800|\\udfff tail|a\\x00b|" + "|".join(ODD_TEXTS[3:])
    )


class _StrictHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """A stream handler that records its logging errors instead of printing them."""

    failures: list[BaseException | None]

    def handleError(self, record: logging.LogRecord) -> None:
        self.failures.append(sys.exc_info()[1])


def test_logging_a_decision_for_an_odd_update_cannot_raise() -> None:
    """The decision record of such an update is written by a strict UTF-8 stream handler
    without a logging error (its message and ``extra`` carry ids, never the text)."""
    raw = io.BytesIO()
    stream = io.TextIOWrapper(raw, encoding="utf-8", errors="strict", write_through=True)
    handler = _StrictHandler(stream)
    handler.failures = []
    handler.setFormatter(logging.Formatter("%(message)s %(update_id)s %(chat_id)s"))
    decision_logger.addHandler(handler)
    old_level = decision_logger.level
    decision_logger.setLevel(logging.INFO)
    try:
        for text in ODD_TEXTS:
            chat = {"id": 5, "type": "private"}
            update = {"update_id": 1, "message": {"text": text, "chat": chat}}
            log_decision(boundary="update", key="idem:7:u:1", decision="acquired", update=update)
    finally:
        decision_logger.removeHandler(handler)
        decision_logger.setLevel(old_level)
    assert handler.failures == []
    assert raw.getvalue().decode().count("update acquired idem:7:u:1 1 5") == len(ODD_TEXTS)
