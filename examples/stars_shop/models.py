"""The shop's own tables (SQLAlchemy 2, async), in the same SQLite file as the idempotency
store, so a purchase, its idempotency record and its receipt's outbox entry commit in one
transaction.

- :class:`Product`: what is for sale: a pack of ``credits`` for ``price`` Telegram Stars,
  ``stock`` packs left.
- :class:`Purchase`: one paid charge, keyed by Telegram's ``telegram_payment_charge_id``
  (the primary key is a second line of defence: a charge can never be stored twice).
- :class:`Account`: a buyer's credit balance.
"""

from __future__ import annotations

from sqlalchemy import BigInteger, ForeignKey, String
from sqlalchemy.ext.asyncio import (
    AsyncEngine,
    AsyncSession,
    async_sessionmaker,
    create_async_engine,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

__all__ = [
    "CATALOGUE",
    "Account",
    "Base",
    "Product",
    "Purchase",
    "open_database",
]


class Base(DeclarativeBase):
    """The shop's tables (names start with ``shop_``; the store's start with ``idem_``)."""


class Product(Base):
    """A digital good: ``credits`` for ``price`` Stars; ``stock`` packs left."""

    __tablename__ = "shop_products"

    sku: Mapped[str] = mapped_column(String(32), primary_key=True)
    title: Mapped[str] = mapped_column(String(32))
    description: Mapped[str] = mapped_column(String(255))
    price: Mapped[int]
    credits: Mapped[int]
    stock: Mapped[int]


class Purchase(Base):
    """A paid charge. ``refunded`` once its Stars went back and its credits were taken."""

    __tablename__ = "shop_purchases"

    charge_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    user_id: Mapped[int] = mapped_column(BigInteger, index=True)
    sku: Mapped[str] = mapped_column(ForeignKey("shop_products.sku"))
    stars: Mapped[int]
    credits: Mapped[int]
    refunded: Mapped[bool] = mapped_column(default=False)


class Account(Base):
    """A buyer's balance of credits."""

    __tablename__ = "shop_accounts"

    user_id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    credits: Mapped[int] = mapped_column(default=0)


CATALOGUE = (
    Product(
        sku="credits10",
        title="10 credits",
        description="Ten credits for the shop's bot, delivered at once.",
        price=50,
        credits=10,
        stock=100,
    ),
    Product(
        sku="credits50",
        title="50 credits",
        description="Fifty credits for the shop's bot, delivered at once.",
        price=200,
        credits=50,
        stock=10,
    ),
)
"""What a new database is stocked with."""


async def open_database(url: str) -> tuple[AsyncEngine, async_sessionmaker[AsyncSession]]:
    """Create the tables if missing, stock a new database with :data:`CATALOGUE`, and
    return the engine and its session factory.

    Args:
        url: an SQLAlchemy async URL, e.g. ``sqlite+aiosqlite:///shop.db``.

    Raises:
        sqlalchemy.exc.SQLAlchemyError: the database cannot be opened or written.
    """
    engine = create_async_engine(url)
    async with engine.begin() as conn:
        await conn.run_sync(Base.metadata.create_all)
    sessions = async_sessionmaker(engine, expire_on_commit=False)
    async with sessions() as session, session.begin():
        for product in CATALOGUE:
            if await session.get(Product, product.sku) is None:
                session.add(
                    Product(
                        sku=product.sku,
                        title=product.title,
                        description=product.description,
                        price=product.price,
                        credits=product.credits,
                        stock=product.stock,
                    )
                )
    return engine, sessions
