"""The inbox on NATS JetStream: :func:`with_jetstream_inbox` gives a claim store a
durable inbox whose entries live in a JetStream stream (guide: docs/store-jetstream.md).

The claim store (SQLite, PostgreSQL, Redis…) stays the update guards' source of truth:
Telegram re-delivers an update for up to 24 h, the broker's dedup window is minutes.

**Admission** (``admit`` / ``admit_many``): claim each update guard in the claim store
(``claim_many``, lease ``admit_lease``); publish each claimed entry on
``<stream>.<bot_id>.<partition>`` with ``Nats-Msg-Id = <bot_id>:<update_id>`` (the
broker's dedup: the fast path) and wait for its PubAck; only then record the guard
admitted (``complete``). Crash windows:

- claimed, not published (the process died, or NATS did not answer: then the claim is
  released at once and the caller gets :class:`~telegram_idem.errors.StoreError`, so the
  webhook answers non-2xx) → the claim's lease ends and Telegram's re-delivery is
  admitted;
- published, guard not completed → the re-delivery claims again and publishes again: the
  broker drops it within its window (PubAck ``duplicate``); beyond it the stream holds a
  second message of the entry, which the inbox finds when it records it (the entry's
  state exists, or its tombstone does) and deletes, so it runs once;
- while a delivery publishes, a concurrent delivery of the same update finds its claim
  in progress and is answered "not yet" (503): Telegram re-sends it, and the re-send is a
  duplicate. (The other inboxes write guard and entry in one transaction, so they answer
  such a delivery 200 at once.)

**Ordering units and partitions**: the partition is CRC-32 of the ordering unit
(``chat:<id>``, ``user:<id>``, else the entry id) mod ``partitions``, so a chat's entries
are one subject, in stream order. Each partition has a durable pull consumer (explicit
ack, ``AckAll``, at most one batch of 256 out, ``ack_wait = discover_ack_wait``) that
hands each message once to whichever inbox object records it; a process that dies while
recording a batch leaves it to be re-delivered after ``discover_ack_wait``, and no later
message of the partition is handed out meanwhile, so entries are always recorded in
partition order.

**Leases, retries, fencing**: each recorded entry has a state in the JetStream key-value
bucket ``<stream>_state`` (status, attempts, token, ``available_at``,
``lease_expires_at``, ``last_error``, ``admitted_at``; the payload stays in the stream).
Every change is a compare-and-set on the entry's revision, and times are the *claim
store's* clock, as for every other inbox. A take leases, per ordering unit with no entry
in flight under a live lease, its oldest live entry if it is due, oldest first across
units; so different chats run in parallel while one chat has at most one entry in
flight, in admission order. ``ack`` / ``retry`` / ``bury`` / ``extend`` succeed only
with the token of the take that holds the entry. Why not the broker's own redelivery
(``ack_wait``, ``nak`` with a delay, ``in_progress``, ``max_deliver``) for these: its
timers run on the server's wall clock, one ``ack_wait`` per consumer (a lease per take
cannot be expressed), a ``nak`` counts as a delivery (a refunded retry could not give
the attempt back), and with more than one chat per partition a held-back message would
spend deliveries while it waits behind its chat. The consumer's explicit ack and
redelivery guard the one step the broker does well: handing each message over once.

**Dead letters**: ``bury`` (or a take past ``max_deliver`` attempts, the redelivery
limit) makes the state ``dead``; its payload stays in the stream until ``drop``.
``redrive`` publishes the payload again (a new stream sequence: the back of its chat) and
deletes the old message.

**Costs** (round trips to NATS; one bucket copy per inbox object is kept current by a
watcher, an ordered consumer): a take is 2 reads of stream info (the bucket's and the
entry stream's, to see that nothing is missing), plus when messages arrived, 1 consumer
info per partition and per batch 1 fetch, 1 write per message and 1 ack, then 1
compare-and-set and 1 direct get of the payload; an ack is 1 compare-and-set and 1
message delete; retry / bury / extend are 1 compare-and-set; admission is 1 publish per
entry (pipelined) between the claim store's ``claim_many`` and one ``complete`` per
entry. Operator reads (``get``, ``entries``, ``stats``, ``backlog``, ``depth``,
``dead_letters``) are answered from the local copy after the same sync, plus 1 direct get
per returned entry's payload; the copy holds every recorded entry, so a take and a
listing cost CPU in proportion to the inbox's depth (no full scan of the stream, but no
index either).
"""

from telegram_idem.backends.nats._connection import JetStreamConnection, JetStreamSettings
from telegram_idem.backends.nats._inbox import JetStreamInbox
from telegram_idem.backends.nats._layout import JetStreamLayout
from telegram_idem.backends.nats._store import JetStreamStore, with_jetstream_inbox

__all__ = [
    "JetStreamConnection",
    "JetStreamInbox",
    "JetStreamLayout",
    "JetStreamSettings",
    "JetStreamStore",
    "with_jetstream_inbox",
]
