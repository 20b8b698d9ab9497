"""The relay's queued-bytes rules without a socket, with a made-up clock (relay.queued): MARK
receipts, the own and total caps, ghosts, and who counts as a non-reader; and where a
publisher connects from (relay.conn.source_of)."""
from __future__ import annotations

import os

from relay.conn import cut, identify, source_of
from relay.queued import Queued

MB = 1 << 20


def _book(peer_cap=4 * MB, total_cap=64 * MB, stuck_s=15.0) -> Queued:
    return Queued(peer_cap, total_cap, MB, stuck_s)


def _fill(q: Queued, a, now: float, size: int = MB) -> int:
    """Send it rollouts of `size` while it has room, as the relay's pump does: how many."""
    n = 0
    while size <= q.room(a):
        q.sent(a, size, now)
        n += 1
    return n


def test_a_mark_echoed_proves_what_came_before_it_and_nothing_else_does():
    q = _book()
    a = q.open(b"r", 0.0)
    assert _fill(q, a, 0.0) == 4 and a.held_back == "own cap"
    assert q.mark_due(a) and not q.mark_due(q.open(b"empty", 0.0), force=True)
    q.marked(a, b"n1")
    q.sent(a, MB // 2, 0.0)
    assert not q.receipt(a, os.urandom(8), 1.0)                 # a guess buys nothing
    assert q.room(a) <= 0 and q.total == 4 * MB + MB // 2
    assert q.receipt(a, b"n1", 1.0)                              # read up to the MARK
    assert a.queued == MB // 2 and q.total == MB // 2 and a.proven_at == 1.0
    assert not q.receipt(a, b"n1", 2.0)                          # a replay: already spent


def test_an_empty_queue_always_takes_one_rollout():
    q = Queued(MB // 4, 64 * MB, MB, 15.0)
    a = q.open(b"r", 0.0)
    assert q.room(a) >= MB
    q.sent(a, MB, 0.0)
    assert q.room(a) < 0


def _reader(q: Queued, rid: bytes, now: float):
    """A connection that echoed the MARK the relay sends when it subscribes."""
    a = q.open(rid, now)
    assert q.opening_mark_due(a)
    q.marked(a, b"open-" + rid)
    assert q.receipt(a, b"open-" + rid, now) and not q.opening_mark_due(a)
    return a


def test_non_readers_arriving_one_by_one_cannot_take_what_is_kept_for_readers():
    """Before: each newcomer got total / subscribers while earlier ones kept their larger
    shares (60 live non-readers held 541 MB against a 256 MB cap), and readers then got no
    room. Now non-readers stop at 1.5 x the cap, and a reader keeps its share."""
    q = _book(peer_cap=16 * MB, total_cap=256 * MB)
    reader = _reader(q, b"reader", 0.0)
    for i in range(300):
        q.subscribers = i + 2
        a = q.open(b"stuck-%d" % i, 0.0)
        assert q.opening_mark_due(a)                      # sent; never echoed
        q.marked(a, b"never-%d" % i)
        _fill(q, a, 0.0, size=MB // 4)
        assert q.total <= 3 * 256 * MB // 2
    assert q.room(q.open(b"late", 0.0)) < MB // 4          # a newcomer that proved nothing waits
    assert q.room(reader) == 16 * MB and _fill(q, reader, 0.0, size=MB // 4) == 64   # its own cap
    q.readers = 16                                        # the readers' half cap, shared among them
    for i in range(15):
        _fill(q, _reader(q, b"reader-%d" % i, 0.0), 0.0, size=MB // 4)
    assert q.total <= 2 * 256 * MB and q.room(q.open(b"reader-0", 0.0)) < MB // 4
    q.subscribers = 1                                     # ... until the non-readers go
    for i in range(300):
        q.drop(b"stuck-%d" % i, gone=True)
    assert q.total == sum(a.queued for a in q.accounts.values()) and not q.ghosts


def test_ghost_bytes_count_until_the_connection_is_gone_and_the_same_connection_inherits_them():
    q = _book()
    a = q.open(b"r", 0.0)
    _fill(q, a, 0.0)
    assert q.drop(b"r", gone=False)                              # said BYE, connection open: cut it
    assert q.ghost_bytes() == 4 * MB and q.total == 4 * MB
    again = q.open(b"r", 1.0)                                    # HELLO again on that connection
    assert again.queued == 4 * MB and q.room(again) <= 0 and not q.ghosts
    assert q.drop(b"r", gone=False)
    q.gone(b"r")                                                 # a send found no route
    assert q.total == 0 and not q.ghosts
    assert not q.drop(b"nobody", gone=False)                     # nothing queued: nothing to cut
    b = q.open(b"b", 0.0)
    q.sent(b, MB, 0.0)
    assert not q.drop(b"b", gone=True) and q.total == 0          # gone already: freed at once


def test_a_connection_that_proves_no_read_while_holding_bytes_is_stuck():
    q = _book(stuck_s=15.0)
    reader, stuck, idle = q.open(b"reader", 0.0), q.open(b"stuck", 0.0), q.open(b"idle", 0.0)
    for t in range(0, 31):
        for a, nonce in ((reader, b"R%d" % t), (stuck, b"S%d" % t)):
            q.sent(a, 1000, float(t))
            q.marked(a, nonce)
        q.receipt(reader, b"R%d" % t, t + 0.5)                  # the reader echoes each MARK
        assert q.stuck(float(t)) == ([b"stuck"] if t > 15 else [])
    assert idle.queued == 0                                      # owing nothing is never stuck


def _reply(q: Queued, a, n: int, now: float) -> bool:
    """A reply of n bytes as the relay sends it: counted when it fits its room."""
    if n > q.reply_room(a):
        return False
    q.sent(a, n, now)
    return True


def test_replies_are_queued_bytes_bounded_per_connection_and_in_total():
    """Issue 62.1: 100 connections asking STATS at the allowed rate and never reading grew the
    relay to 2.55 GB while its count said 2 KB. Replies now go through the same account and
    caps: a quarter past a connection's own cap, and in total the rollouts' ceiling plus a
    band, each connection keeping its part of the band; a reader's receipts drain them."""
    q = _book(peer_cap=16 * MB, total_cap=256 * MB)
    a = q.open(b"asker", 0.0)
    n = 0
    while _reply(q, a, 300_000, 0.0):                  # a 300 KB STATS, never read
        n += 1
    assert a.queued <= 20 * MB and n == 20 * MB // 300_000           # its own cap + a quarter
    q.drop(b"asker", gone=True)
    crowd = [q.open(b"c%d" % i, 0.0) for i in range(300)]        # 300 that ask and never read
    for _ in range(100):
        for c in crowd:
            _reply(q, c, 300_000, 0.0)
    band = 256 * MB // 8
    assert q.total <= 3 * 256 * MB // 2 + band                      # non-readers: their ceiling
    fresh = q.open(b"new", 0.0)                                      # a new node, the crowd still there
    for small in (150, 120, 80, 20):                                 # WELCOME, SUBOK, PONG, MARK
        assert _reply(q, fresh, small, 0.0)
    part = band // len(q.accounts)
    assert q.reply_room(fresh) >= part - 370 and not _reply(q, fresh, part, 0.0)   # its part, no more
    q.marked(fresh, b"m")
    assert q.receipt(fresh, b"m", 1.0) and fresh.queued == 0 and fresh.proven
    assert q.reply_room(fresh) == 20 * MB        # a reader: its own cap (the readers' half is above the crowd)
    for i in range(300):                                             # the crowd is shed, then gone
        assert q.drop(b"c%d" % i, gone=False)
        q.gone(b"c%d" % i)
    assert q.total == fresh.queued == 0 and not q.ghosts


def test_unbounded_caps():
    q = Queued(0, 0, MB, 15.0)
    a = q.open(b"r", 0.0)
    q.sent(a, 100 * MB, 0.0)
    assert q.room(a) > 1 << 40


def test_a_publishers_source_is_its_key_else_its_address_else_its_connection():
    assert source_of("alice", "10.0.0.1", b"rid") == b"kalice"
    assert source_of(None, "10.0.0.1", b"rid") == b"a10.0.0.1"
    assert source_of(None, "::ffff:10.0.0.1", b"rid") == b"a10.0.0.1"
    assert source_of(None, "2001:db8::1", b"rid") == source_of(None, "2001:db8::2", b"x") == b"a2001:db8::/64"
    assert source_of(None, "", b"rid") == b"crid"


def test_cutting_a_connection_checks_it_is_still_the_same_one():
    import socket
    a, b = socket.socketpair()
    try:
        conn = identify(a.fileno())
        assert conn and identify(None) == () and identify(-1) == ()
        assert not cut((a.fileno(), ("elsewhere", "")))            # another connection's names
        assert cut(conn) and b.recv(1) == b""                      # shut down: the other end sees EOF
    finally:
        a.close()
        b.close()
    assert not cut(conn) and not cut(())
