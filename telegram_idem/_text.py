"""Diagnostic text every store can keep: the one rule for ``last_error`` columns and the
effect ledger's ``holder`` and ``detail``.

A handler's error message may quote the update it failed on, and an update may carry what
JSON allows but text columns refuse: a lone UTF-16 surrogate (``"\\ud800"``: not
encodable as UTF-8, so SQLite, PostgreSQL and Redis clients refuse the string) or NUL
(PostgreSQL ``text`` refuses it). Payloads and results are bytes and are kept exactly;
error *text* is made storable with this function before any store sees it.
"""

from __future__ import annotations

__all__ = ["storable_text"]


def storable_text(text: str) -> str:
    """``text`` as valid UTF-8 without NUL: each lone surrogate becomes its escape
    (``\\ud800``) and NUL becomes ``\\x00``; any other text is returned unchanged.

    Args:
        text: any ``str``.
    """
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text.replace("\x00", "\\x00")
