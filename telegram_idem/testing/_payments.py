"""Telegram Stars payments for :class:`~telegram_idem.testing.FakeBotAPI`: invoices, the
pre-checkout answer and its deadline, charges and their refunds.

The methods, as the Bot API describes them ("Payments"):

- ``sendInvoice``: ``chat_id``, ``title`` (1-32 characters), ``description`` (1-255),
  ``payload`` (1-128 bytes), ``currency`` and ``prices`` (a list of ``LabeledPrice``:
  ``label`` and ``amount`` in the smallest units of the currency). For Telegram Stars
  (``XTR``) ``provider_token`` is empty or absent and ``prices`` has exactly one item.
  Returns the Message, with its ``invoice`` (``title``, ``description``,
  ``start_parameter``, ``currency``, ``total_amount``).
- ``answerPreCheckoutQuery``: ``pre_checkout_query_id``, ``ok`` and, when ``ok`` is false,
  ``error_message``. "The Bot API must receive an answer within 10 seconds after the
  pre-checkout query was sent": a later answer is refused here with "query is too old"
  (``pre_checkout_answer_window``, counted from when the query was made known).
- ``refundStarPayment``: ``user_id`` and ``telegram_payment_charge_id``. Returns ``true``;
  a charge refunded before is answered 400 ``Bad Request: CHARGE_ALREADY_REFUNDED``, one
  the fake does not know (or of another user) 400 ``Bad Request: CHARGE_NOT_FOUND``.

A charge becomes known when the fake sees an update with a ``successful_payment``
(``FakeBotAPI.queue_update`` or ``FakeBotAPI.learn_update``), or by
:meth:`Payments.add_charge`. The other texts of refusals are this fake's, in Telegram's
form (``Bad Request: <WHAT>``).

This module imports no framework and no HTTP.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "CHARGE_ALREADY_REFUNDED",
    "CHARGE_NOT_FOUND",
    "PRE_CHECKOUT_DEADLINE",
    "Charge",
    "PaymentError",
    "Payments",
    "PreCheckoutAnswer",
    "SentInvoice",
]

CHARGE_ALREADY_REFUNDED = "Bad Request: CHARGE_ALREADY_REFUNDED"
"""``refundStarPayment`` of a charge refunded before."""
CHARGE_NOT_FOUND = "Bad Request: CHARGE_NOT_FOUND"
"""``refundStarPayment`` of a charge Telegram does not know for that user."""
PRE_CHECKOUT_TOO_OLD = (
    "Bad Request: query is too old and response timeout expired or query ID is invalid"
)
"""``answerPreCheckoutQuery`` after the deadline (the callback-query text of the Bot API)."""
PRE_CHECKOUT_DEADLINE = 10.0
"""Seconds Telegram waits for ``answerPreCheckoutQuery`` (Bot API "answerPreCheckoutQuery")."""


class PaymentError(Exception):
    """A payment method refused: ``description`` is the Bot API's, HTTP status 400."""

    def __init__(self, description: str) -> None:
        super().__init__(description)
        self.description = description


@dataclass(frozen=True, slots=True)
class SentInvoice:
    """An invoice the bot sent (``sendInvoice``).

    Attributes:
        chat_id: where.
        message_id: the invoice message.
        title: the invoice's title, as sent.
        description: its description, as sent.
        payload: the bot's own payload (its order id), as sent.
        currency: the ISO 4217 code, or ``XTR`` for Telegram Stars, as sent.
        total_amount: the sum of ``prices`` (Stars: whole stars).
        prices: the ``LabeledPrice`` list as sent.
        message: the Message answered.
    """

    chat_id: int | str
    message_id: int
    title: str
    description: str
    payload: str
    currency: str
    total_amount: int
    prices: list[dict[str, Any]]
    message: dict[str, Any]


@dataclass(frozen=True, slots=True)
class PreCheckoutAnswer:
    """One accepted ``answerPreCheckoutQuery``.

    Attributes:
        query_id: ``pre_checkout_query_id``.
        ok: the answer.
        error_message: the text shown to the user when not ``ok``.
        after: seconds from when the query was made known to the answer (``None`` when
            the fake never saw the query).
    """

    query_id: str
    ok: bool
    error_message: str | None
    after: float | None


@dataclass(slots=True)
class Charge:
    """A Telegram Stars payment the fake knows.

    Attributes:
        charge_id: ``telegram_payment_charge_id``.
        user_id: who paid.
        total_amount: Stars.
        payload: the invoice payload.
        refunds: accepted ``refundStarPayment`` calls (1 once refunded; never more).
        refund_attempts: every ``refundStarPayment`` call for it, refused ones included.
    """

    charge_id: str
    user_id: int
    total_amount: int
    payload: str = ""
    refunds: int = 0
    refund_attempts: int = 0

    @property
    def refunded(self) -> bool:
        """Whether a refund was accepted."""
        return self.refunds > 0


@dataclass(slots=True)
class Payments:
    """The payment state of one fake (``FakeBotAPI.payments``).

    Attributes:
        pre_checkout_answer_window: seconds after a pre-checkout query was made known
            within which ``answerPreCheckoutQuery`` succeeds; ``None``: no window.
        clock: the monotonic clock, seconds, the window is judged by.
        invoices: every invoice ``sendInvoice`` sent, in order.
        pre_checkout_answers: every accepted ``answerPreCheckoutQuery``, in order.
        charges: the known charges, by ``telegram_payment_charge_id``.
    """

    pre_checkout_answer_window: float | None = PRE_CHECKOUT_DEADLINE
    clock: Callable[[], float] = time.monotonic
    invoices: list[SentInvoice] = field(default_factory=list)
    pre_checkout_answers: list[PreCheckoutAnswer] = field(default_factory=list)
    charges: dict[str, Charge] = field(default_factory=dict)
    _queries: dict[str, float] = field(default_factory=dict)

    # ------------------------------------------------------------------ learning

    def learn(self, update: Mapping[str, Any]) -> None:
        """Note a pre-checkout query (its deadline starts now) or a successful payment
        (its charge becomes refundable) that ``update`` carries; other updates: nothing.

        Args:
            update: the Bot API update.
        """
        query = update.get("pre_checkout_query")
        if isinstance(query, Mapping) and query.get("id") is not None:
            self._queries.setdefault(str(query["id"]), self.clock())
        message = update.get("message")
        paid = message.get("successful_payment") if isinstance(message, Mapping) else None
        if isinstance(paid, Mapping) and isinstance(message, Mapping):
            sender = message.get("from") or message.get("chat") or {}
            self.add_charge(
                str(paid["telegram_payment_charge_id"]),
                user_id=int(sender["id"]),
                total_amount=int(paid.get("total_amount", 0)),
                payload=str(paid.get("invoice_payload", "")),
            )

    def add_charge(
        self, charge_id: str, *, user_id: int, total_amount: int, payload: str = ""
    ) -> Charge:
        """Make a charge known (kept as it is when known already); returns it.

        Args:
            charge_id: the ``telegram_payment_charge_id``.
            user_id: the user who paid (only they can be refunded).
            total_amount: the amount paid (Stars: whole stars).
            payload: the invoice payload.
        """
        return self.charges.setdefault(charge_id, Charge(charge_id, user_id, total_amount, payload))

    def answered(self, query_id: str) -> list[PreCheckoutAnswer]:
        """The accepted answers to one pre-checkout query, oldest first.

        Args:
            query_id: the pre-checkout query's id.
        """
        return [a for a in self.pre_checkout_answers if a.query_id == str(query_id)]

    # ------------------------------------------------------------------ methods

    def send_invoice(self, params: Mapping[str, Any], message: dict[str, Any]) -> SentInvoice:
        """Check ``sendInvoice``'s parameters and fill ``message`` (the Message the fake
        made: ``message_id``, ``from``, ``chat``, ``date``) with its ``invoice`` and
        markup.

        Args:
            params: the call's decoded parameters.
            message: the Message the fake made (``message_id``, ``from``, ``chat``,
                ``date``), filled in place.

        Raises:
            PaymentError: bad parameters (the Bot API's ``description``:
                ``INVOICE_TITLE_INVALID``, ``STARS_INVOICE_INVALID``,
                ``PAYMENT_PROVIDER_INVALID``…).
        """
        title, description = params.get("title"), params.get("description")
        payload, currency = params.get("payload"), params.get("currency")
        prices = params.get("prices")
        if not isinstance(title, str) or not 1 <= len(title) <= 32:
            raise PaymentError("Bad Request: INVOICE_TITLE_INVALID")
        if not isinstance(description, str) or not 1 <= len(description) <= 255:
            raise PaymentError("Bad Request: INVOICE_DESCRIPTION_INVALID")
        if not isinstance(payload, str) or not 1 <= len(payload.encode()) <= 128:
            raise PaymentError("Bad Request: INVOICE_PAYLOAD_INVALID")
        if not isinstance(currency, str) or not currency:
            raise PaymentError("Bad Request: CURRENCY_INVALID")
        if not isinstance(prices, list) or not prices:
            raise PaymentError("Bad Request: can't parse prices JSON object")
        amounts = [p.get("amount") if isinstance(p, Mapping) else None for p in prices]
        if not all(isinstance(a, int) and not isinstance(a, bool) and a > 0 for a in amounts):
            raise PaymentError("Bad Request: CURRENCY_TOTAL_AMOUNT_INVALID")
        if currency == "XTR":
            if params.get("provider_token"):
                raise PaymentError("Bad Request: PAYMENT_PROVIDER_INVALID")
            if len(prices) != 1:
                raise PaymentError("Bad Request: STARS_INVOICE_INVALID")
        elif not params.get("provider_token"):
            raise PaymentError("Bad Request: PAYMENT_PROVIDER_INVALID")
        total = sum(int(a) for a in amounts if isinstance(a, int))
        message["invoice"] = {
            "title": title,
            "description": description,
            "start_parameter": str(params.get("start_parameter") or ""),
            "currency": currency,
            "total_amount": total,
        }
        invoice = SentInvoice(
            chat_id=message["chat"]["id"],
            message_id=int(message["message_id"]),
            title=title,
            description=description,
            payload=payload,
            currency=currency,
            total_amount=total,
            prices=[dict(p) for p in prices],
            message=message,
        )
        self.invoices.append(invoice)
        return invoice

    def answer_pre_checkout_query(self, params: Mapping[str, Any]) -> bool:
        """``answerPreCheckoutQuery``.

        Args:
            params: the call's decoded parameters.

        Raises:
            PaymentError: no query id, no ``ok``, ``ok`` false without an ``error_message``,
                or the answer came after the window.
        """
        query_id = params.get("pre_checkout_query_id")
        ok = params.get("ok")
        if not query_id:
            raise PaymentError("Bad Request: QUERY_ID_INVALID")
        if not isinstance(ok, bool):
            raise PaymentError('Bad Request: parameter "ok" is required')
        error = params.get("error_message")
        if not ok and not error:
            raise PaymentError("Bad Request: ERROR_MESSAGE_EMPTY")
        seen = self._queries.get(str(query_id))
        after = self.clock() - seen if seen is not None else None
        window = self.pre_checkout_answer_window
        if window is not None and after is not None and after > window:
            raise PaymentError(PRE_CHECKOUT_TOO_OLD)
        self.pre_checkout_answers.append(
            PreCheckoutAnswer(str(query_id), ok, str(error) if error else None, after)
        )
        return True

    def refund_star_payment(self, params: Mapping[str, Any]) -> bool:
        """``refundStarPayment``.

        Args:
            params: the call's decoded parameters.

        Raises:
            PaymentError: ``CHARGE_NOT_FOUND`` (not known, or another user's),
                ``CHARGE_ALREADY_REFUNDED``.
        """
        charge = self.charges.get(str(params.get("telegram_payment_charge_id") or ""))
        user = params.get("user_id")
        if charge is None or str(charge.user_id) != str(user):
            raise PaymentError(CHARGE_NOT_FOUND)
        charge.refund_attempts += 1
        if charge.refunded:
            raise PaymentError(CHARGE_ALREADY_REFUNDED)
        charge.refunds += 1
        return True
