"""``python -m examples.aiogram_minimal [--api-url URL] [--store URL]`` (``BOT_TOKEN`` in the environment)."""

from examples.aiogram_minimal.bot import main

raise SystemExit(main())
