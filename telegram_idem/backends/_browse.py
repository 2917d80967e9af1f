"""What every store's browsing (:class:`~telegram_idem.backends.Browsable`) shares:
a key prefix as stored keys spell it, its checks, and its escapes.

Keys are stored bounded (:func:`telegram_idem._keys.bounded_key`): a key that is not
strict UTF-8 without NUL, or longer than :data:`~telegram_idem._keys.MAX_KEY_BYTES`, is
stored as a readable head (lone surrogates and NUL spelled as backslash escapes, at most
:data:`~telegram_idem._keys.KEY_PREFIX_BYTES` bytes), ``":h:"`` and a hash. A prefix is
compared with the stored keys, so :func:`stored_prefix` spells it the way a head does;
a prefix longer than the head (200 bytes) then matches only keys stored whole.
"""

from __future__ import annotations

from telegram_idem.ledger import check_limit  # one rule for every listing's limit

__all__ = [
    "check_limit",
    "like_prefix",
    "next_prefix",
    "stored_prefix",
]


def stored_prefix(prefix: str) -> str:
    """``prefix`` as the stored keys spell it: itself when it is strict UTF-8 without
    NUL, else with lone surrogates as ``\\udxxx`` escapes and NUL as ``\\x00`` (the
    spelling of a bounded key's head). Never raises."""
    if "\x00" not in prefix:
        try:
            prefix.encode("utf-8")
        except UnicodeEncodeError:
            pass
        else:
            return prefix
    escaped = prefix.encode("utf-8", "backslashreplace").decode("utf-8")
    return escaped.replace("\x00", "\\x00")


def like_prefix(prefix: str, escape: str = "\\") -> str:
    """A SQL ``LIKE`` pattern matching the texts that start with ``prefix``:
    ``escape``, ``%`` and ``_`` escaped by ``escape`` (give ``ESCAPE '<escape>'``),
    then ``%``."""
    for char in (escape, "%", "_"):
        prefix = prefix.replace(char, escape + char)
    return prefix + "%"


_MAX = 0x10FFFF
_SURROGATES = (0xD800, 0xDFFF)


def next_prefix(prefix: str) -> str | None:
    """The least text above every text that starts with ``prefix``, in code point
    (= UTF-8 byte) order, or ``None`` when there is none (``prefix`` empty or all
    U+10FFFF): ``key >= prefix AND key < next_prefix(prefix)`` selects exactly the keys
    starting with ``prefix`` from an index in binary order."""
    chars = list(prefix)
    while chars:
        point = ord(chars.pop()) + 1
        if _SURROGATES[0] <= point <= _SURROGATES[1]:
            point = _SURROGATES[1] + 1
        if point <= _MAX:
            return "".join(chars) + chr(point)
    return None
