"""Framework adapters. Each is imported on its own (``telegram_idem.adapters.aiogram``) so
the core installs without any framework."""

__all__: list[str] = []
