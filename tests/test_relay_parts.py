"""The relay's parts that touch no socket, with a made-up clock: the replay buffer and its
indexes (relay.topic), the budget and fair-share rules (relay.budget), token buckets and the
accept budget (relay.limits), the CURVE allow-list and HELLO identity rule (relay.auth)."""
from __future__ import annotations

import collections

from relay import protocol as P
from relay.auth import AllowList, identity_refusal
from relay.budget import Budget
from relay.limits import AcceptBudget, RateLimits, TokenBucket
from relay.topic import Entry, Topic, passes


def _topic(max_count: int = 100, max_bytes: int = 1 << 20) -> Topic:
    return Topic(b"s", max_count, max_bytes, b"epoch")


def _pub(t: Topic, sender: str, n: int, now: float, size: int = 10, source: bytes = b"", **tags) -> list[Entry]:
    out = []
    for _ in range(n):
        e = t.append(f"{sender}-{t.next_seq}".encode(), b"rid-" + sender.encode(), sender.encode(),
                     b"x" * size, b"{}", tags.get("task"), tags.get("tok"), now, source)
        t.index_new(e)
        out.append(e)
    return out


# ------------------------------------------------------------------ relay.topic
def test_the_filter_rule_untagged_passes_tagged_must_match():
    e = Entry(1, b"r", b"rid", b"a", 1, b"", 0.0, "gsm8k", "tokA")
    untagged = Entry(2, b"r2", b"rid", b"a", 1, b"", 0.0, None, None)
    assert passes(None, e) and passes({"task": {"gsm8k"}}, e) and passes({"tok": {"tokA"}}, e)
    assert not passes({"task": {"math500"}}, e) and not passes({"task": {"gsm8k"}, "tok": {"tokB"}}, e)
    assert passes({"task": {"math500"}, "tok": {"tokB"}}, untagged)


def test_replay_buffer_evicts_by_count_and_bytes_but_not_what_is_held():
    t = _topic(max_count=4, max_bytes=100)
    _pub(t, "a", 4, 0.0)
    assert (t.first_seq, t.next_seq, t.nbytes) == (1, 5, 40)
    t.hold_seq = 1                                  # a subscriber still needs seq 1
    assert not t.room_for(10)
    t.hold_seq = 2
    assert t.room_for(10) and not t.room_for(80)    # 80 bytes would evict seqs 2.. too
    _pub(t, "a", 1, 0.0, size=60)                   # bytes bound: 20 + 60 + ... <= 100
    assert t.nbytes <= 100 and len(t.entries) <= 4 and t.first_seq > 1


def test_index_orders_publishers_by_activity_and_counts_active_ones():
    t = _topic()
    idx = t.index_for({"task": {"gsm8k"}})
    _pub(t, "a", 2, now=0.0, task="gsm8k")
    _pub(t, "b", 1, now=5.0, task="gsm8k")
    _pub(t, "c", 3, now=6.0, task="math500")        # filtered out of this index
    assert list(idx.newest) == [b"a", b"b"]
    assert idx.active_senders(now=8.0, window_s=5.0, entries=t.entries) == 1       # a is stale
    assert idx.is_active(b"b", 8.0, 5.0, t.entries) and not idx.is_active(b"a", 8.0, 5.0, t.entries)
    assert t.index_for({"task": {"gsm8k"}}) is idx                                  # shared per filter set
    late = t.index_for({"task": {"math500"}})                                       # built from the buffer
    assert list(late.newest) == [b"c"] and len(late.newest[b"c"]) == 3


# ------------------------------------------------------------------ relay.budget
def _budget(t: Topic, k: int, window_s: float = 10.0, filters=None) -> Budget:
    b = Budget(k, window_s)
    b.index = t.index_for(filters)
    return b


def test_fair_share_newest_first_and_never_your_own():
    t = _topic()
    b = _budget(t, k=4)
    _pub(t, "greedy", 20, now=1.0)
    _pub(t, "calm", 1, now=1.0)
    _pub(t, "me", 5, now=1.0)
    share, _ = b.fair_share(b"me", 1.5, t.entries)
    assert share == 2                                # 4 / 2 other publishers
    picks = []
    while b.sent < b.k and (e := b.pick(b"me", b"rid-me", 1.5, t.entries, share)) is not None:
        b.record(e)
        picks.append(e)
    senders = [e.sender for e in picks]
    assert senders.count(b"greedy") == 2 and senders.count(b"calm") == 1 and b"me" not in senders
    assert picks[senders.index(b"greedy")].seq == 20  # its newest first


def test_a_window_resets_shares_and_stale_rollouts_are_not_offered():
    t = _topic()
    b = _budget(t, k=1, window_s=10.0)
    _pub(t, "a", 1, now=0.0)
    e = b.pick(b"sub", b"rid-sub", 1.0, t.entries, 1)
    b.record(e)
    assert b.pick(b"sub", b"rid-sub", 1.0, t.entries, 1) is None      # share spent, nothing else
    assert not b.window_over(9.9) and b.window_over(10.0)
    b.new_window(10.0, t.entries)
    assert b.sent == 0 and not b.served and b.sent_seqs == {e.seq}     # still fresh: not sent twice
    assert b.pick(b"sub", b"rid-sub", 10.0, t.entries, 1) is None
    _pub(t, "a", 1, now=10.5)
    assert b.pick(b"sub", b"rid-sub", 25.0, t.entries, 1) is None     # older than one window


def test_fresh_ids_share_a_probation_slice_while_a_useful_publisher_is_active():
    """Issue 25.2: 100 fake ids, each newer than the honest publisher's rollouts (so past the
    activity scan's limit), cannot spend the budget of a subscriber that named it useful."""
    t = _topic(max_count=1000)
    b = _budget(t, k=8)
    _pub(t, "honest", 6, now=1.0)
    for i in range(100):
        _pub(t, f"sybil-{i}", 2, now=2.0)
    assert b.fair_share(b"me", 2.5, t.entries) == (1, False)         # nobody named: 8 / 101
    b.useful = frozenset({b"honest", b"me"})                        # its own id counts for nothing
    share, guarded = b.fair_share(b"me", 2.5, t.entries)
    assert (share, guarded) == (8 - b.probation, True)
    picks = []
    while b.sent < b.k and (e := b.pick(b"me", b"rid-me", 2.5, t.entries, share, guarded)) is not None:
        b.record(e)
        picks.append(e.sender)
    assert picks.count(b"honest") == 6 and len(picks) == 6 + b.probation, picks
    assert b.probation_sent == b.probation == 1
    b.new_window(30.0, t.entries)                                   # the honest one went quiet: no guard
    _pub(t, "sybil-x", 1, now=30.0)
    assert b.fair_share(b"me", 30.1, t.entries) == (8, False)


def test_a_bridged_rollout_is_not_offered_back_to_the_connection_it_came_from():
    t = _topic()
    b = _budget(t, k=4)
    _pub(t, "far-node", 1, now=0.0)                  # arrived on connection rid-far-node
    assert b.pick(b"bridge", b"rid-far-node", 0.1, t.entries, 4) is None
    assert b.pick(b"other", b"rid-other", 0.1, t.entries, 4) is not None


# ------------------------------------------------------------------ relay.limits
def test_token_bucket_with_a_made_up_clock():
    tb = TokenBucket(rate=2.0, burst=3.0, now=0.0)
    assert [tb.take(1.0, 0.0) for _ in range(4)] == [True, True, True, False]
    assert not tb.take(1.0, 0.4) and tb.take(1.0, 0.5)       # 2/s: one token after 0.5 s
    assert TokenBucket(0.0, 0.0).take(1e9, 0.0)               # rate 0 = unlimited


def test_rate_limits_are_per_key_and_bounded():
    rl = RateLimits(rate_msgs=1.0, burst_msgs=2.0, rate_bytes=0.0, burst_bytes=0.0, max_keys=3)
    assert rl.allow(b"a", 10, 0.0) and rl.allow(b"a", 10, 0.0) and not rl.allow(b"a", 10, 0.0)
    assert rl.allow(b"b", 10, 0.0)                            # another key has its own bucket
    for k in (b"c", b"d", b"e"):
        rl.allow(k, 10, 0.0)
    assert len(rl.buckets) == 3 and b"a" not in rl.buckets


def test_global_accept_budget_caps_the_total():
    ab = AcceptBudget(rate=10.0, burst=10.0)
    accepted = sum(ab.admit(b"flooder", t / 100) for t in range(1000))   # 100/s for 10 s
    assert 90 <= accepted <= 125, accepted                    # ~ burst + 10/s


# ------------------------------------------------------------------ relay.auth
def test_allow_list_and_identity_rule():
    refused = collections.Counter()
    allow = AllowList({b"k" * 32: "alice"}, refused)
    assert allow.authorize(b"k" * 32, "1.2.3.4") and allow.name_of(b"k" * 32) == "alice"
    assert not allow.authorize(b"m" * 32, "1.2.3.4") and refused == {"unknown_key": 1}
    assert identity_refusal(True, "alice", "alice") is None
    assert identity_refusal(True, "bob", "alice")[0] == P.IDENTITY
    assert identity_refusal(False, "anyone", None) is None    # open relay: ids are claims


def test_accept_budget_is_shed_from_the_flooders_not_a_publisher_within_its_share():
    """Two sources at 100/s against a 20/s budget, and an honest one sending a node's round
    (4 groups at once) every 2 s: every honest rollout is admitted at once, the flooders
    together get about the budget."""
    ab = AcceptBudget(rate=20.0, burst=20.0)
    honest = flood = 0
    for step in range(1000):                           # 10 s, 10 ms steps
        now = step / 100
        flood += ab.admit(b"flooder-1", now) + ab.admit(b"flooder-2", now + 0.005)
        if step % 200 == 0:
            honest += sum(ab.admit(b"honest", now + 0.001) for _ in range(4))
            assert ab.within_share(b"honest", now + 0.002)
    assert honest == 20
    assert 150 <= flood <= 20 * 10 + 2 * 20, flood     # ~ the budget (+ its burst and the debt bound)
    assert not ab.within_share(b"flooder-1", 10.0)
    assert not AcceptBudget(rate=0.0, burst=0.0).within_share(b"x", 0.0) and AcceptBudget(0.0, 0.0).admit(b"x", 0.0)


def test_the_replay_buffers_reserve_takes_a_quiet_publisher_when_holders_filled_it():
    t = _topic(max_count=16, max_bytes=1 << 20)
    _pub(t, "flooder", 16, 0.0)
    t.hold_seq = 1                                     # an everything-subscriber has none of them yet
    assert not t.room_for(10) and t.room_for(10, reserve=True)
    e = _pub(t, "quiet", 1, 0.0)[0]
    assert t.entries[1].sender == b"flooder" and t.entries[e.seq] is e     # nothing held was evicted
    assert not t.room_for(10, reserve=True)            # the reserve is bounded (16 / 16 = 1 here)


def test_what_the_reserve_held_past_a_bound_is_trimmed_once_it_was_sent():
    t = _topic(max_count=16)
    _pub(t, "flooder", 16, 0.0)
    t.hold_seq = 1
    _pub(t, "quiet", 1, 0.0)
    assert len(t.entries) == 17
    t.hold_seq = 18                                    # the holders have everything now
    t.trim()
    assert len(t.entries) == 16 and t.first_seq == 2


def _windows(n_fake: int, windows: int, k: int = 8, useful=frozenset()) -> tuple[int, float]:
    """Fake ids publish (newer than the honest one, every window) from the start; the honest
    publisher arrives in window 2. (honest rollouts delivered, its fair share over those windows)."""
    t = _topic(max_count=100_000, max_bytes=1 << 30)
    b = _budget(t, k=k, window_s=10.0)
    b.useful = frozenset(useful)
    honest = fair = 0
    for w in range(windows):
        now = 10.0 * w
        b.new_window(now, t.entries)
        if w >= 1:
            _pub(t, "honest", 2, now=now + 0.1)
        for i in range(n_fake):
            _pub(t, f"fake-{i}", 2, now=now + 0.2)
        share, guarded = b.fair_share(b"me", now + 0.5, t.entries)
        while b.sent < b.k and (e := b.pick(b"me", b"rid-me", now + 0.5, t.entries, share, guarded)) is not None:
            b.record(e)
            honest += e.sender == b"honest"
        if w >= 1:
            fair += min(2, k / (n_fake + 1))        # it cannot get more than it published
    return honest, fair


def test_fake_ids_that_came_first_cannot_keep_a_new_honest_publisher_out():
    """8 or 40 ids publishing before (and always newer than) an honest publisher: over ten
    rotations (a rotation: the windows it takes every id to get a turn) it gets at least 90 %
    of its fair share (newest-first gave it none: 0 of 17.8 and 0 of 3.9 over 20 windows)."""
    for n_fake in (8, 40):
        rotation = -(-(n_fake + 1) // 8)                          # windows for every id to get a turn
        honest, fair = _windows(n_fake, windows=1 + 10 * rotation)
        assert honest >= 0.9 * fair and honest >= 1, (n_fake, honest, fair)


def test_fake_ids_marked_useful_still_leave_the_honest_publisher_its_turn():
    """Fake ids that earned "useful" with cheap valid groups: the honest one, not (yet) useful,
    gets the probation slice in rotation with the other non-useful ids."""
    fakes = {f"fake-{i}".encode() for i in range(40)}
    honest, _ = _windows(40, windows=6, useful=fakes)
    assert honest >= 5 * max(1, 8 // 8), honest


def _life(n_fake: int, windows: int, *, churn: bool = False, fake_source: bytes = b"a-attacker",
          k: int = 8, crowd_from: int = 0) -> list[int]:
    """Junk ids publish from window `crowd_from` (with churn: n_fake fresh ids every window); the honest
    publisher (source a-home) arrives in window 2 and, like a node's subscriber would, the
    subscriber names it useful once it got one of its rollouts. Honest rollouts per window
    from its arrival on (it publishes 2 a window)."""
    t = _topic(max_count=200_000, max_bytes=1 << 30)
    b = _budget(t, k=k, window_s=10.0)
    got = []
    for w in range(windows):
        now = 10.0 * w
        b.new_window(now, t.entries)
        if w >= 2:
            _pub(t, "honest", 2, now=now + 0.1, source=b"a-home")
        for i in range(n_fake if w >= crowd_from else 0):
            _pub(t, f"fake-{w if churn else 0}-{i}", 1, now=now + 0.2, source=fake_source)
        share, guarded = b.fair_share(b"me", now + 0.5, t.entries)
        honest = 0
        while b.sent < b.k and (e := b.pick(b"me", b"rid-me", now + 0.5, t.entries, share, guarded)) is not None:
            b.record(e)
            honest += e.sender == b"honest"
        if w >= 2:
            got.append(honest)
            if honest:
                b.useful = frozenset({b"honest"})     # it trained on the honest group: a signal
    return got


def test_a_newcomer_is_tried_in_its_first_window_however_many_ids_came_first():
    """8 to 1000 junk ids publishing before an honest publisher, from another source or from
    its own: it is tried in the window it arrives (the rotation made it wait behind every id
    that came first: 40 ids, 3 windows at K = 8), then gets all it publishes."""
    for n_fake in (8, 40, 200, 1000):
        for source in (b"a-attacker", b"a-home"):
            got = _life(n_fake, windows=6, fake_source=source)
            assert got[0] >= 1 and got[1:] == [2] * 3, (n_fake, source, got)


def test_a_newcomer_arriving_with_a_crowd_from_elsewhere_is_tried_first():
    """Issue 51.5: 200 ids from another source arriving with the honest publisher, or after it:
    between sources with as many tried, the one with fewer ids goes first (newest first alone
    handed the slot to the crowd's newest id)."""
    for crowd_from in (2, 3):
        got = _life(200, windows=6, crowd_from=crowd_from)
        assert got[0] >= 1 and got[1:] == [2] * 3, (crowd_from, got)


def test_fresh_ids_from_one_source_cannot_keep_a_newcomer_waiting():
    """Churn: 50 fresh junk ids every window from one source. Each takes a newcomer's place
    only while its source has had fewer newcomers tried than the honest one's."""
    got = _life(50, windows=8, churn=True)
    assert got[0] >= 1 and got[1:] == [2] * 5, got


def test_tried_junk_drops_behind_and_a_useful_publisher_keeps_being_picked():
    """Ids once served and not named useful take only the trial slice (one rollout a window,
    K // 8), newcomers first in it; a useful publisher gets its K - K // 8."""
    t = _topic(max_count=100_000, max_bytes=1 << 30)
    b = _budget(t, k=8, window_s=10.0)
    b.useful = frozenset({b"honest"})
    for w in range(6):
        now = 10.0 * w
        b.new_window(now, t.entries)
        _pub(t, "honest", 10, now=now + 0.1, source=b"a-home")
        for i in range(40):
            _pub(t, f"junk-{i}", 2, now=now + 0.2, source=b"a-attacker")
        if w == 3:
            _pub(t, "late", 1, now=now + 0.3, source=b"a-late")
        share, guarded = b.fair_share(b"me", now + 0.5, t.entries)
        picks = []
        while b.sent < b.k and (e := b.pick(b"me", b"rid-me", now + 0.5, t.entries, share, guarded)) is not None:
            b.record(e)
            picks.append(e.sender)
        assert picks.count(b"honest") == 7 and len(picks) == 8, (w, picks)
        if w == 3:
            assert b"late" in picks, picks                # a newcomer goes first in the slice
    assert len(b.tried) == 7 and b.source_tries == {b"a-attacker": 5, b"a-late": 1}   # and the honest one


def test_a_repeated_line_is_written_once_per_interval_per_key_with_how_many_were_held():
    from relay.loglimit import LineLimit, more
    lines = LineLimit(every_s=10.0, max_keys=2)
    written = [t for t in range(70 * 10) if lines.check(("bad_handshake", b"ep"), t / 10) is not None]
    assert written == [0, 100, 200, 300, 400, 500, 600]          # 746 lines in 70 s were written before
    assert lines.check(("bad_handshake", b"ep"), 70.0) == 99 and more(99, 10.0) == " (and 99 more like it in the last 10 s)"
    assert lines.check(("no_curve", b"ep"), 70.0) == 0           # another kind (or peer) has its own line
    assert lines.check("third", 70.0) == 0 and len(lines._seen) == 2   # bounded: the oldest forgotten
    assert lines.check(("bad_handshake", b"ep"), 70.5) == 0 and lines.held() == 0


def test_a_stats_reply_is_cut_to_its_room_and_built_at_most_once_while_fresh():
    import orjson

    from relay.stats_reply import StatsReply, assemble
    head, peers = orjson.dumps({"epoch": "e", "counts": {}}), [orjson.dumps({"node_id": f"n{i}"}) for i in range(100)]
    full = orjson.loads(assemble(head, peers, 1 << 20))
    assert full["peers_shown"] == full["peers_total"] == 100 and full["epoch"] == "e"
    cut = assemble(head, peers, 400)
    assert len(cut) <= 400 and 0 < orjson.loads(cut)["peers_shown"] < 100      # valid JSON, fewer peers
    assert assemble(head, peers, 20) is None                                    # not even the rest fits
    builds = []
    reply = StatsReply(lambda: builds.append(1) or ({"epoch": "e"}, [{"node_id": "a"}]))
    for t in range(50):
        reply.reply(1 << 20, now=0.0)
    assert len(builds) == 1 and reply.reply(1 << 20, now=2.0) and len(builds) == 2   # never older than 1 s
