"""What a transport raises when a Bot API call got no answer: sent or not, and whether
that can be known.

A 4xx or 5xx answer is not an exception: the transport returns it as an
:class:`~telegram_idem.outbox._calls.Answer` and :func:`~telegram_idem.outbox._calls.classify`
says what it means. These two are for calls that got no answer at all.
"""

from __future__ import annotations

from telegram_idem.errors import IdemError

__all__ = ["AmbiguousCall", "CallNotSent"]


class CallNotSent(IdemError):
    """The request never left this process (connection refused, DNS failure, a local
    file to upload that cannot be read): Telegram cannot have applied it, so it is safe
    to send again.

    Args:
        message: the error's text.
        method: the Bot API method, kept as ``method``.

    Attributes:
        method: the Bot API method.
    """

    def __init__(self, message: str, *, method: str) -> None:
        super().__init__(message)
        self.method = method


class AmbiguousCall(IdemError):
    """The request may have reached Telegram but no answer came back (a timeout, or the
    connection broke after the request was written): Telegram may or may not have
    applied it. What happens next is the call's
    :class:`~telegram_idem.outbox._base.AmbiguousPolicy`.

    Args:
        message: the error's text.
        method: the Bot API method, kept as ``method``.

    Attributes:
        method: the Bot API method.
    """

    def __init__(self, message: str, *, method: str) -> None:
        super().__init__(message)
        self.method = method
