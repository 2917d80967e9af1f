"""Redis store (``redis://``, ``rediss://``, ``redis+cluster://``): one Lua script per decision.

Each record is one hash at ``<key_prefix>:{<record key>}``. The braces make the whole
record key the cluster hash tag, so every single-key script touches one slot (on a
cluster with a one-shard inbox, ``inbox_shards=1``, update guard records live in the
inbox's slot instead: see :meth:`RedisStore.redis_key` and :class:`RedisInbox`). Every primitive is ONE
``EVALSHA`` of a Lua script shipped in ``redis/lua/`` (:data:`SCRIPTS`; on ``NOSCRIPT``,
e.g. after ``SCRIPT FLUSH`` or a failover, the same call is repeated once as ``EVAL``,
which also caches the script again). Redis forgets a record when its
retention ends (``PEXPIRE``); the lease end lives inside the hash.

Time: without a clock the scripts read the server's clock (``TIME``), so every worker
judges leases by one clock; with a clock (tests) *now* is passed to the script, and the
``PEXPIRE`` is still ``expires_at - now``.

Round trips: claim, complete, fail, release, extend and get are 1 each. ``claim_many``
is 1 on a single node (one script over all keys); on a cluster the keys are grouped by
hash slot, one script per slot, sent as one pipeline: 1 round trip per master node
holding any of the keys, all masters in parallel. Every call of a one-shard inbox
(``store.inbox()``, the default on a single node) is 1 as well, ``admit_many``
included; a sharded inbox (``inbox_shards=N``, 16 recommended on a new cluster: shards by chat, spread over
the masters) admits in three pipelined steps and asks every shard before a ``take``
(:class:`RedisInbox`). So is every outbox call (``store.outbox()``) about
one bot, every flood budget call (``store.flood_budget()``) and every effect ledger call
(``store.ledger()``: one hash tag for the whole ledger, rows that never expire).

URLs (query options marked * are this store's own; the rest pass through to redis-py):

- ``redis://[[user]:password@]host[:port][/db]`` — a single node (or a proxy);
- ``rediss://…`` — the same over TLS (``ssl_cert_reqs``, ``ssl_ca_certs``,
  ``ssl_certfile``, ``ssl_keyfile``, ``ssl_check_hostname`` pass through);
- ``redis+cluster://[[user]:password@]host:port[,host:port…]`` — a Redis Cluster,
  found from any of the given nodes; ``?ssl=true`` for TLS.

Options: ``key_prefix``\\* (default ``idem``; no braces), ``inbox_shards``\\* (1–1024;
default 1; 16 recommended on a new cluster), ``socket_timeout``\\* and
``socket_connect_timeout``\\* (seconds, default 5), ``db`` (single node only),
``client_name``, ``health_check_interval`` (seconds), ``max_connections`` (per node;
default 100), ``socket_keepalive``, ``protocol`` (2, the default, or 3); TLS options only with
``rediss://`` or ``ssl=true``. Anything else is a
:class:`~telegram_idem.errors.ConfigurationError`.

Clients the store makes never resend a command after a connection error or timeout
(``retries=0``): a script whose reply was lost may have run, and running a claim twice
would turn the caller's own acquisition into "in progress". The error reaches the
caller as :class:`~telegram_idem.errors.StoreError` instead, and the next call
reconnects. On a single node without TLS, a store made from its URL sends its scripts
on a fast lane of its own: one pipelined connection that every concurrent call shares,
replies read with hiredis, redis-py's exception classes (docs/store-redis.md#the-fast-lane);
a cluster, TLS and a client passed in take redis-py's path, where calls beyond
``max_connections`` wait for a free connection (redis-py's pools would refuse them).

Errors (every message names the store's host, port and database, never the password,
and carries redis-py's own message):

- :class:`~telegram_idem.errors.ConfigurationError`, at the first call, for what no
  retry can fix: a wrong password or ACL user (``WRONGPASS``, ``NOAUTH``, an ``AUTH``
  the server does not expect), a missing ACL permission (``NOPERM``), a database index
  the server does not have (``redis://…/99``), a command the server does not know or
  has renamed, a record key holding another type (``WRONGTYPE``: another program
  writes under the store's ``key_prefix``);
- :class:`~telegram_idem.errors.StoreError` for connection errors (a host name that does
  not resolve included), timeouts, cluster-down/try-again/master-down, a replica's
  READONLY, OOM, and the refusals BUSY, NOREPLICAS and MISCONF;
- :class:`~telegram_idem.errors.StoreError` marked *unexpected* for any other Redis
  error (a script error is a bug): never a raw redis-py exception.

The store, its inbox, its outbox, its flood budget and its ledger are parts over one :class:`RedisConnection`
(``store.connection``): the client, the key layout, the clock, the gate and the error
translation. Modules (private, one job each): ``_url`` (the URL → a client), ``_keys``,
``_errors`` (redis-py's exceptions), ``_scripts`` (the Lua files), ``_connection``,
``_store`` (the records store), ``_inbox``, ``_outbox``, ``_flood``, ``_ledger``.

See ``docs/store-redis.md``.
"""

from __future__ import annotations

from telegram_idem.backends.redis._connection import RedisConnection
from telegram_idem.backends.redis._flood import RedisFloodBudget
from telegram_idem.backends.redis._inbox import RedisInbox
from telegram_idem.backends.redis._keys import UPDATE_KEY, KeyLayout
from telegram_idem.backends.redis._ledger import RedisLedger
from telegram_idem.backends.redis._outbox import RedisOutbox
from telegram_idem.backends.redis._scripts import SCRIPTS, Script
from telegram_idem.backends.redis._store import RedisStore
from telegram_idem.backends.redis._url import RedisClient

__all__ = [
    "SCRIPTS",
    "UPDATE_KEY",
    "KeyLayout",
    "RedisClient",
    "RedisConnection",
    "RedisFloodBudget",
    "RedisInbox",
    "RedisLedger",
    "RedisOutbox",
    "RedisStore",
    "Script",
]
