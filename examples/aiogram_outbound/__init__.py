"""An aiogram 3 bot whose replies go through the outbox: sent once, paced by shared flood control (``python -m examples.aiogram_outbound``)."""
