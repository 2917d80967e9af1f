"""Ingress: getting updates into the durable inbox, acknowledged in milliseconds.

- :class:`~telegram_idem.ingress.webhook.WebhookIngress` — framework-free aiohttp webhook.
- :func:`~telegram_idem.ingress.serving.register` — serve a webhook on an aiohttp
  application and run its inbox worker for the application's life.
- :class:`~telegram_idem.ingress.polling.PollingIngress` — getUpdates with batch admission.

The aiohttp names are imported on first use, so ``telegram_idem.ingress.polling`` works
without aiohttp installed.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from telegram_idem.ingress.polling import PollingIngress
    from telegram_idem.ingress.serving import register
    from telegram_idem.ingress.webhook import WebhookIngress

__all__ = ["PollingIngress", "WebhookIngress", "register"]

_HOMES = {
    "PollingIngress": "telegram_idem.ingress.polling",
    "WebhookIngress": "telegram_idem.ingress.webhook",
    "register": "telegram_idem.ingress.serving",
}


def __getattr__(name: str) -> Any:
    """The public names of the submodules, imported on first use.

    Raises:
        AttributeError: ``name`` is not one of them.
    """
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(home), name)
