"""The hook the ``telegram_idem`` pytest plugin adds, for a project's ``conftest.py``.

A project that starts test servers of its own (a private Redis Cluster, an in-process
DynamoDB endpoint, the PostgreSQL it runs beside its tests) names them here instead of
in a CLI flag, environment variable or ini option; the configured URL still wins.
"""

from __future__ import annotations

import pytest

__all__ = ["pytest_idem_server_url"]


@pytest.hookspec(firstresult=True)
def pytest_idem_server_url(config: pytest.Config, name: str) -> str | None:
    """The URL of server store ``name`` when none is configured, or ``None``.

    Called at most once per store per test session, the first time a test needs that
    store and no ``--idem-<name>-url`` / ``IDEM_<NAME>_URL`` / ``idem_<name>_url`` is
    set; the answer is kept for the session. Before containers are tried.

    Args:
        config: the session's pytest config (``config.add_cleanup`` stops what the
            hook started).
        name: ``"postgres"``, ``"redis"``, ``"redis-cluster"`` or ``"dynamodb"``.

    Returns:
        A store URL (as the option would take it), or ``None`` to let the next source
        (a container, then a skip) answer.

    Raises:
        Exception: the hook looked and found nothing usable; its message becomes part of
            the skip reason (or failure, under ``--idem-require-stores``).
    """
