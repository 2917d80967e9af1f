"""Every store keeps payload, result and error bytes losslessly (issue 8, item 10).

An update may carry what JSON allows and text columns refuse: a lone UTF-16 surrogate
escape (``"\\ud800"``), a NUL escape (``"\\u0000"``), emoji, right-to-left text. The
ingress encodes it ASCII-safe, but a store must not depend on that: the inbox hands back
the exact bytes it admitted, a record the exact result bytes, whatever they are.
"""

from __future__ import annotations

import io
import json
import logging
import sys

import pytest

from telegram_idem import Store
from telegram_idem.backends.text import storable_text
from telegram_idem.inbox.base import NewEntry
from telegram_idem.logs import decision_logger, log_decision

RETENTION = 3600.0
LEASE = 30.0

ODD_TEXTS = [
    "\ud800",  # a lone high surrogate
    "\udfff tail",  # a lone low surrogate
    "a\u0000b",  # NUL
    "👍🏽 emoji, ZWJ 👨‍👩‍👧",
    "שלום עולם \u202e RTL override",
]

PAYLOADS = [
    *(json.dumps({"update_id": 1, "message": {"text": t}}).encode() for t in ODD_TEXTS),
    *(
        json.dumps({"update_id": 1, "message": {"text": t}}, ensure_ascii=False).encode(
            "utf-8", "surrogatepass"
        )
        for t in ODD_TEXTS
    ),
    b'{"update_id":1,"message":{"text":"\\ud800"}}',
    b"\x00\xff\xfe not even UTF-8 \x80",
]


@pytest.mark.inbox
async def test_inbox_takes_back_the_bytes_it_admitted(store: Store) -> None:
    inbox = store.inbox()
    for i, payload in enumerate(PAYLOADS):
        assert await inbox.admit(NewEntry(f"idem:7:u:{i}", "chat:1", payload), retention=RETENTION)
        taken = await inbox.take(lease=LEASE)
        assert taken is not None and taken.payload == payload, i
        assert await inbox.ack(taken)


@pytest.mark.inbox
async def test_admit_many_keeps_every_payload(store: Store) -> None:
    entries = [NewEntry(f"idem:7:u:{i}", f"chat:{i}", p) for i, p in enumerate(PAYLOADS)]
    assert await store.inbox().admit_many(entries, retention=RETENTION) == [True] * len(entries)
    got = {}
    for _ in entries:
        taken = await store.inbox().take(lease=LEASE)
        assert taken is not None
        got[taken.id] = taken.payload
    assert got == {e.update_key: e.payload for e in entries}


@pytest.mark.inbox
async def test_an_error_text_quoting_odd_characters_is_kept_not_refused(store: Store) -> None:
    inbox = store.inbox()
    await inbox.admit(NewEntry("idem:7:u:1", "chat:1", PAYLOADS[0]), retention=RETENTION)
    error = "ValueError: " + "|".join(ODD_TEXTS)
    taken = await inbox.take(lease=LEASE)
    assert taken is not None and await inbox.retry(taken, delay=0.0, error=error)
    again = await inbox.take(lease=LEASE)
    assert again is not None and again.last_error == storable_text(error)
    assert await inbox.bury(again, error=error)
    (dead,) = await inbox.dead_letters()
    assert dead.payload == PAYLOADS[0]
    assert dead.last_error == storable_text(error)
    assert dead.last_error == (
        "ValueError: \\ud800|\\udfff tail|a\\x00b|" + "|".join(ODD_TEXTS[3:])
    )


async def test_record_result_bytes_round_trip(store: Store) -> None:
    for i, result in enumerate(PAYLOADS):
        key = f"idem:7:a:odd{i}"
        claim = await store.claim(key, lease=LEASE, retention=RETENTION)
        token = claim.record.fencing_token
        assert await store.complete(key, token, result, retention=RETENTION)
        record = await store.get(key)
        assert record is not None and record.result == result, i
        replay = await store.claim(key, lease=LEASE, retention=RETENTION)
        assert replay.record.result == result, i


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
