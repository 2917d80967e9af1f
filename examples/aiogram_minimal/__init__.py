"""A minimal aiogram 3 bot on long polling, made duplicate-safe (``python -m examples.aiogram_minimal``)."""
