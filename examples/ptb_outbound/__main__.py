"""``python -m examples.ptb_outbound [--api-url URL] [--store URL]`` (``BOT_TOKEN`` in the environment)."""

from examples.ptb_outbound.bot import main

raise SystemExit(main())
