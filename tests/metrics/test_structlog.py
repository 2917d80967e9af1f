"""The decision log under structlog's stdlib integration: the library logs with the
stdlib as it always has, and ``structlog.stdlib.ProcessorFormatter`` (with
``ExtraAdder``) renders each decision record with its extra fields."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest
import structlog

from telegram_idem import Idem
from telegram_idem.events import decision_logger
from telegram_idem.testing import UpdateFactory

BOT = 7000000001


@pytest.fixture
def rendered() -> Iterator[io.StringIO]:
    """structlog renders ``telegram_idem.decisions`` as JSON lines into the buffer."""
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=[
                structlog.stdlib.add_log_level,
                structlog.stdlib.add_logger_name,
                structlog.stdlib.ExtraAdder(),
            ],
            processors=[
                structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                structlog.processors.JSONRenderer(),
            ],
        )
    )
    level = decision_logger.level
    decision_logger.addHandler(handler)
    decision_logger.setLevel(logging.INFO)
    yield out
    decision_logger.removeHandler(handler)
    decision_logger.setLevel(level)


async def test_decision_records_render_with_their_fields(rendered: io.StringIO) -> None:
    idem = Idem("memory://", heartbeat=False)
    update = UpdateFactory().message("hello")
    try:
        await idem.admit(update, bot_id=BOT)
        await idem.admit(update, bot_id=BOT)
    finally:
        await idem.close()
    lines = [json.loads(line) for line in rendered.getvalue().splitlines()]
    assert [line["decision"] for line in lines] == ["acquired", "in_progress"]
    first = lines[0]
    key = idem.keys.update(BOT, update["update_id"])
    assert first["event"] == f"update acquired {key}"
    assert first["logger"] == "telegram_idem.decisions"
    assert first["level"] == "info"
    assert first["boundary"] == "update"
    assert first["key"] == key
    assert first["update_id"] == update["update_id"]
    assert first["chat_id"] == update["message"]["chat"]["id"]
    assert first["user_id"] == update["message"]["from"]["id"]
    assert first["fencing_token"] == 1
    assert first["elapsed_ms"] > 0
    assert set(first) >= {"handler", "seconds"}
