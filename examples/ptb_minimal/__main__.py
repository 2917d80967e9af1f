"""``python -m examples.ptb_minimal [--api-url URL] [--store URL]`` (``BOT_TOKEN`` in the environment)."""

from examples.ptb_minimal.bot import main

raise SystemExit(main())
