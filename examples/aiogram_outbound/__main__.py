"""``python -m examples.aiogram_outbound [--api-url URL] [--store URL]`` (``BOT_TOKEN`` in the environment)."""

from examples.aiogram_outbound.bot import main

raise SystemExit(main())
