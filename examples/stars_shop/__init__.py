"""A shop that sells credits for Telegram Stars, and never charges, credits, refunds or
sends a receipt twice (see README.md). ``python -m examples.stars_shop`` runs it on long
polling; ``python -m examples.stars_shop.demo`` runs it offline against ``FakeBotAPI``."""
