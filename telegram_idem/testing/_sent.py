"""Checks over what a fake Bot API saw the bot send, as plain data: shared by
:class:`~telegram_idem.testing.bot_api.FakeBotAPI` (in process) and
:class:`~telegram_idem.testing.bot_api.FakeBotAPIControl` (over HTTP). ``texts`` are the
texts the bot sent to one chat, in order.

A module of its own, importing nothing of the testing kit: the fake imports it, and the
replay assertions (``_assertions``) import the replay machinery, which refers to the fake.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

__all__ = ["check_no_429", "check_no_repeated_text", "check_sent_once"]


def _listing(texts: Sequence[str]) -> str:
    if not texts:
        return "nothing was sent"
    return "sent: " + "; ".join(f"{i + 1}. {t!r}" for i, t in enumerate(texts))


def check_sent_once(texts: Sequence[str], chat_id: int | str, text: str) -> None:
    """``text`` is among ``texts`` (what the bot sent to ``chat_id``) exactly once.

    Raises:
        AssertionError: it was sent 0 or several times (what was sent is listed).
    """
    count = sum(1 for t in texts if t == text)
    if count != 1:
        raise AssertionError(
            f"expected {text!r} sent once to chat {chat_id}, sent {count} time(s); "
            f"{_listing(texts)}"
        )


def check_no_repeated_text(texts: Sequence[str], chat_id: int | str) -> None:
    """No text appears twice among ``texts`` (what the bot sent to ``chat_id``).

    Raises:
        AssertionError: some text was sent more than once (named, with the listing).
    """
    repeated = {t: n for t, n in Counter(texts).items() if n > 1}
    if repeated:
        parts = ", ".join(f"{t!r} x{n}" for t, n in repeated.items())
        raise AssertionError(
            f"chat {chat_id} got the same text more than once: {parts}; {_listing(texts)}"
        )


def check_no_429(answers: Sequence[str]) -> None:
    """``answers`` (one line per 429 the fake answered) is empty.

    Raises:
        AssertionError: some call was answered 429 (each listed).
    """
    if answers:
        raise AssertionError(
            f"{len(answers)} call(s) answered 429 Too Many Requests: " + "; ".join(answers)
        )
