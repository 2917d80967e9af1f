"""``python -m examples.webhook_inbox [--host H] [--port P] [--api-url URL] [--store URL] [--webhook-url URL]``
(``BOT_TOKEN`` and ``WEBHOOK_SECRET`` in the environment)."""

from examples.webhook_inbox.bot import main

raise SystemExit(main())
