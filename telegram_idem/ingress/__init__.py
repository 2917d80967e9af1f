"""Ingress: getting updates into the durable inbox, acknowledged in milliseconds.

- :class:`~telegram_idem.ingress._webhook.WebhookIngress` — framework-free aiohttp webhook.
- :func:`~telegram_idem.ingress._serving.register` — serve a webhook on an aiohttp
  application and run its inbox worker for the application's life.
- :class:`~telegram_idem.ingress._polling.PollingIngress` — getUpdates with batch admission.
- :class:`~telegram_idem.ingress._leader.LeaderLease` — several replicas polling one bot:
  a fenced leader lease so exactly one calls getUpdates.

The aiohttp names are imported on first use, so ``telegram_idem.ingress._polling`` works
without aiohttp installed.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from telegram_idem.ingress._leader import LeaderLease
    from telegram_idem.ingress._polling import PollingIngress
    from telegram_idem.ingress._reading import read_update
    from telegram_idem.ingress._serving import Handler, Handles, register
    from telegram_idem.ingress._webhook import WebhookIngress

__all__ = [
    "Handler",
    "Handles",
    "LeaderLease",
    "PollingIngress",
    "WebhookIngress",
    "read_update",
    "register",
]

_HOMES = {
    "read_update": "telegram_idem.ingress._reading",
    "Handler": "telegram_idem.ingress._serving",
    "Handles": "telegram_idem.ingress._serving",
    "LeaderLease": "telegram_idem.ingress._leader",
    "PollingIngress": "telegram_idem.ingress._polling",
    "WebhookIngress": "telegram_idem.ingress._webhook",
    "register": "telegram_idem.ingress._serving",
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
