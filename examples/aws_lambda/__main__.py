"""``python -m examples.aws_lambda [--host H] [--port P] [--api-url URL] [--store URL]``
(``BOT_TOKEN`` and ``WEBHOOK_SECRET`` in the environment): the function behind a local
Function URL."""

from examples.aws_lambda.local import main

raise SystemExit(main())
