"""A minimal python-telegram-bot 22 bot on long polling, made duplicate-safe (``python -m examples.ptb_minimal``)."""
