"""The peer book's eviction order (``book.eviction_rank``) kept in a heap: the same victim as a scan
of the whole book would pick, at a logarithm's cost, whatever the peers do between evictions."""
from __future__ import annotations

import logging
import random
import time

from ftis_edge.peers.book import PeerBook, eviction_rank


def test_the_heap_evicts_what_a_scan_of_the_book_would(caplog):
    caplog.set_level(logging.ERROR, logger="ftis_edge.peers.intake")     # quarantines are logged
    rng = random.Random(1)
    checked = 0
    for _ in range(20):
        book = PeerBook(quarantine_after=3, max_peers=rng.choice([2, 5, 17]))
        clock = 0.0
        for _ in range(2_000):
            nid = f"n{rng.randrange(60)}"
            if nid not in book.peers and len(book.peers) >= book.max_peers:
                ranks = {k: eviction_rank(p) for k, p in book.peers.items()}
                book.get(nid)
                [gone] = set(ranks) - set(book.peers)
                assert ranks[gone] == min(ranks.values())
                checked += 1
            op = rng.random()
            if op < 0.5:
                clock += 1
                book.get(nid).last_seen = clock
            elif op < 0.8:
                book.accept(nid, rng.random() < 0.5)      # signal comes and goes: rank up and down
            elif op < 0.97:
                book.reject(nid, "x", charged=rng.random() < 0.3)
            else:
                book.quarantine(nid, "test")
        assert len(book.peers) <= book.max_peers and len(book._order) <= 2 * book.max_peers + 65
    assert checked > 10_000


def test_a_useful_peer_outlasts_ids_accepted_without_signal_and_uncharged_refusals_book_no_one():
    book = PeerBook(max_peers=4)
    book.get("alice").last_seen = 1.0
    book.accept("alice", signal=True)
    for i in range(3):
        book.get(f"zero-{i}").last_seen = 10.0 + i
        book.accept(f"zero-{i}", signal=False)
    for i in range(50):                              # fresh ids, seen later than everyone
        book.get(f"fresh-{i}").last_seen = 100.0 + i
    assert "alice" in book.peers and book.evicted == 50
    book.reject("gone", "no_grading_time", charged=False)
    assert "gone" not in book.peers and book.evicted == 50


def test_ten_thousand_fresh_ids_cost_little():
    book = PeerBook(max_peers=512)
    t0 = time.process_time()
    for i in range(10_000):
        book.get(f"sybil-{i}").last_seen = float(i)
    assert book.evicted == 10_000 - 512
    assert time.process_time() - t0 < 1.0        # a scan per eviction took ~5 s (5M rank calls)
