"""``python -m examples.stars_shop`` (``BOT_TOKEN`` in the environment; see ``app.main``)."""

from examples.stars_shop.app import main

raise SystemExit(main())
