"""What the effect runners need of the guard: the at-most-once runner
(:mod:`telegram_idem._at_most`), the joined runs (:mod:`telegram_idem._transaction`)
and reconciliation (:mod:`telegram_idem._unresolved`) know the guard only as
:class:`EffectHost` (:class:`telegram_idem.Idem` is one), so they sit below it and
import nothing of it, as admission does with
:class:`~telegram_idem._admitted.AdmissionHost`."""

from __future__ import annotations

from typing import Protocol

from telegram_idem._codec import ResultCodec
from telegram_idem._context import Guard
from telegram_idem.backends import Store

__all__ = ["EffectHost"]


class EffectHost(Guard, Protocol):
    """The guard as the effect runners use it: its store, codec, lease and action
    retention (seconds), and the holder name written beside at-most-once effects."""

    store: Store
    codec: ResultCodec
    lease: float
    action_retention: float

    @property
    def holder(self) -> str:
        """Who runs this guard's at-most-once effects."""
        ...
