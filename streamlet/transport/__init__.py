"""Moving batches between processes: over TCP (``tcp``, ``tcp_client``), framed by ``codec``.

The runtime only sees the ``Channel`` seam (``core/runtime/channel.py``): an
ordered, bounded, backpressured pipe of batches and control markers into
one input channel of one instance. Inside one process the core's own
``LocalChannel`` hands the batch object itself to an inbox. ``TcpChannel`` carries it to a
``DataServer`` in another process, which puts the decoded batch into the
receiving inbox. Either way, the receiving task gets ``Record`` objects.

Wire format
===========

A connection carries frames. Every frame is a 9-byte header and a msgpack body::

    +-------+---------+------+-------+------------------+------------------+
    | magic | version | type | flags | body length      | body (msgpack)   |
    | "SL"  | 1 byte  | 1 B  | 1 B   | 4 B, big-endian  | length bytes     |
    +-------+---------+------+-------+------------------+------------------+

Version is 2 (bodies keep tuples as tuples; version 1 sent them as arrays).
One flag exists, ``MORE`` (1) on DATA: the batch goes on in
the channel's next DATA frame; other frames have flags 0. The receiver
checks magic, version, type and length (at most 16 MiB by default, 1 KiB
before authentication) before it reads the body. Bodies are the encoding of
checkpoints and keyed state (``core/model/encoding.py``): msgpack, with a
tuple as an array whose first item is the tuple marker, extension type 1
with an empty payload (``(1, "a")`` is ``[ExtType(1, b""), 1, "a"]``). Map
keys may be any hashable type that encoding writes (ints, floats, tuples
too, not only strings). The receiver refuses every other extension type and
a marker anywhere but first in an array, and it never unpickles. Any violation makes it
send ``ERROR`` and close that connection, and counts it; the server goes on
serving its other connections.

Frame types and bodies:

======== ======================================================= =========================
type     body                                                     direction
======== ======================================================= =========================
HELLO 1  ``["challenge", nonce]`` / ``["response", nonce, mac]`` server -> client -> server
         / ``["welcome", mac]``                                   -> client
DATA 2   ``[channel, epoch, seq, keys, values, timestamps]``      sender -> receiver
ACK 3    ``[[channel, seq], ...]``: delivered up to ``seq``       receiver -> sender
CREDIT 4 ``[[channel, items], ...]``: room for ``items`` more     receiver -> sender
BARRIER 5 ``[channel, epoch, seq, barrier_epoch]``                sender -> receiver
EOS 6    ``[channel, epoch, seq]``: nothing more on ``channel``   sender -> receiver
ERROR 7  ``[reason]``, then the connection closes                 either way
OPEN 8   ``[channel, ...]`` / ``[[channel, last_seq, credit], ...]`` sender -> receiver -> sender
WATERMARK 9 ``[channel, epoch, seq, ts, idle]``                   sender -> receiver
RECONFIGURE 10 ``[channel, epoch, seq, id, task, senders]``       sender -> receiver
ARROW 11 ``[channel, epoch, seq, key, value, ts, ipc(, ws, we)]``  sender -> receiver
======== ======================================================= =========================

* **Authentication.** Mutual HMAC-SHA256 over nonces with the shared
  cluster secret: the client proves ``hmac(secret, "client" + server_nonce +
  client_nonce)`` and the server answers with
  ``hmac(secret, "server" + client_nonce + server_nonce)``. A peer that fails
  is disconnected before any DATA frame is parsed.
* **Multiplexing.** Channel ids are strings. One connection per pair of
  processes carries all their channels. ``OPEN`` attaches channels to the
  connection; the reply gives, per channel, the last sequence number
  delivered and the sender's credit.
* **Flow control.** Credit is counted in items (a DATA, ARROW, BARRIER, WATERMARK, RECONFIGURE or EOS frame
  each). A sender never has more unconfirmed items than its credit, which
  starts at the receiving inbox channel's capacity. The receiver grants one
  item of credit each time the receiving instance takes one out of the inbox,
  so memory is bounded on both sides and a slow receiver slows the sender.
* **Delivery.** Every item carries its channel's ``seq`` (1, 2, 3, ...) and
  the checkpoint ``epoch`` it belongs to. The receiver delivers ``seq ==
  last + 1``, drops ``seq <= last`` (a resend) and refuses a gap. The sender
  keeps each frame in its upstream-backup buffer until it is acknowledged.
  After a reconnect it resends, in order, everything after the ``last_seq``
  that ``OPEN`` reports, and only then sends anything new. The result: no
  loss, no duplicate, order kept per channel. Barriers and end-of-stream are
  items like batches, so they keep their place among the data.
* **Big batches.** A batch whose DATA frame would be over the limit goes as
  several DATA frames, all but the last flagged ``MORE``; each is an item
  with its own ``seq`` and item of credit. The receiver keeps the pieces and
  delivers the batch whole with the last one, handing each piece's credit
  straight back. A marker between the pieces is a protocol error. A record
  that alone is over the limit is refused by the sender with
  ``RecordTooLarge``; sender and receiver must use the same ``max_frame``.
* **Columns.** DATA carries a batch as three arrays (keys, values, event
  times), which packs and unpacks about twice as fast as an array per
  record. Keys and values arrive with the types they were sent with: tuples
  as tuples (also nested, and as dict keys), lists as lists. Two
  optional tails: records inside a cycle add an array of iteration counts;
  window results add ``None`` and two arrays of window starts and ends
  (``None`` for records of the batch that have no window).
* **Arrow.** A columnar batch (the built-in columnar operators') goes as one
  ARROW frame: the names of its key, value and ts columns and the record
  batch as Arrow IPC (``streamlet.transport.arrow_frames``), then, for a
  columnar window's results, the names of its window start and end columns
  (``ws``, ``we``: the longer body; a batch without them sends the shorter one). The receiver
  takes exactly one batch, validates it in full and checks the named
  columns; anything else is a bad frame. One over the limit goes as several
  ARROW frames of row ranges, each an item of its own (no ``MORE``); a row
  that alone is over the limit is refused with ``RecordTooLarge``.
"""
