"""Ingress: getting updates into the durable inbox, acknowledged in milliseconds.

- :class:`~telegram_idem.ingress.webhook.WebhookIngress` — framework-free aiohttp webhook.
- :class:`~telegram_idem.ingress.polling.PollingIngress` — getUpdates with batch admission.
"""
