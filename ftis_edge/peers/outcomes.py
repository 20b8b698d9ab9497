"""Outcomes as a second currency: peers' rewards, of any model, pick this node's own prompts.

About half of a node's own groups carry no signal: every completion right (too easy) or every
one wrong (too hard), so their advantages are all zero and the step learns nothing from them.
Every group on the wire already says which prompt it answered and how often it succeeded, and
that is worth something to every node, whatever its model or tokenizer, because no token of it
is trained on. The book keeps, per prompt a peer answered, its success counts and the peer's
kind (worth.py); it predicts this node's pass rate on it by shifting the peer's rate in logit
space by how much better or worse this node does than that kind of peer overall:

    logit p̂_me(prompt) = logit r_peer(prompt) + (logit s_me − logit s_kind)

(rates Laplace-smoothed). A group carries signal with probability 1 − p^G − (1 − p)^G, highest
at p = ½: ``choose`` fills the round's own slots with the peer-answered prompts whose predicted
chance of carrying signal beats that of a fresh prompt from the node's own stream (whose p̂ is
the node's overall success), best first, and leaves the rest to the stream. Only prompts the
task may train on reach the book (the intake refused the rest), each is used once, and a prompt
older than ``max_age`` rounds is forgotten.

No set of ids steers more than its fair share (issue 62 item 6: a Sybil answering prompts of its
choice 3 of 8 right picked 62 of 120 of a node's own prompts). A pick is credited to the peer
whose group made it, and the node checks the prediction itself: its own group on that prompt
carried signal or it did not (``validate``). A peer's *standing* is that record; per round each
peer gets at most one pick, a peer whose picks mostly failed (after ``MIN_PICKS``) none, and every
peer without a record yet shares one pool: ``NEWCOMER_PICKS`` a round while the pool's own record
holds, one every ``NEWCOMER_BACKOFF`` rounds when it does not (a crowd of new ids is one voice).
"""
from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Callable, Sequence

from .worth import KINDS, clipped, laplace_rate

DEFAULT_MAX_AGE = 8
DEFAULT_MAX_PROMPTS = 4096      # memory bound: a flood of peer groups cannot grow the book past it
MIN_PICKS = 2                   # picks checked before a peer's own record decides its standing
NEWCOMER_PICKS = 1              # picks a round for every peer without a record, together
NEWCOMER_BACKOFF = 4            # ... one every this many rounds while the newcomers' picks mostly fail
MAX_PEERS = 1024                # standings remembered (the least recently credited forgotten)
NEWCOMERS = "(newcomers)"       # the pool's record


def logit(p: float) -> float:
    p = min(max(p, 1e-6), 1 - 1e-6)
    return math.log(p / (1 - p))


def sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


def signal_chance(p: float, group_size: int) -> float:
    """P(a group of ``group_size`` samples at pass rate ``p`` is neither all right nor all wrong)."""
    return 1.0 - p ** group_size - (1.0 - p) ** group_size


@dataclass
class _Seen:
    prompt: object                                   # tasks.Prompt
    round: int
    counts: dict = field(default_factory=dict)       # kind -> [successes, samples]
    peer: str = ""                                   # the first peer that answered it (credited with a pick)


@dataclass(frozen=True)
class Choice:
    prompts: list                    # the round's own prompts, in order
    from_outcomes: int               # how many came from peers' outcomes
    predicted_signal: float | None   # mean predicted chance that a chosen group carries signal


class OutcomeBook:
    """Peers' per-prompt outcomes and this node's overall success per kind (see the module)."""

    def __init__(self, *, max_age: int = DEFAULT_MAX_AGE, max_prompts: int = DEFAULT_MAX_PROMPTS,
                 prompt_of: Callable[[str], object] | None = None):
        self.max_age, self.max_prompts = max_age, max_prompts
        self.prompt_of = prompt_of            # the task's ``get``: load_state rebuilds prompts with it
        self.prompts: dict[str, _Seen] = {}
        self.used: dict[str, None] = {}       # prompts already chosen (insertion-ordered, bounded)
        self.kind_rate: dict[str, list[float]] = {k: [0.0, 0] for k in KINDS}
        self.own_rate = [0.0, 0]
        self.standing: OrderedDict[str, list[int]] = OrderedDict()   # peer -> [picks that carried signal, picks]
        self.pending: dict[str, str] = {}         # prompt id picked this round -> the peer credited
        self.newcomer_round = -NEWCOMER_BACKOFF   # last round the newcomers' pool had a pick

    def add_peer(self, round_no: int, prompt, kind: str, rewards: Sequence[float], peer: str = "") -> None:
        """A peer group the intake accepted and graded (its rewards are the local grader's);
        ``peer``: its sender, credited if the prompt is picked."""
        wins = sum(clipped(rewards))
        self.kind_rate[kind][0] += wins
        self.kind_rate[kind][1] += len(rewards)
        if prompt.id in self.used:
            return
        seen = self.prompts.get(prompt.id)
        if seen is None:
            if len(self.prompts) >= self.max_prompts:
                self.prompts.pop(next(iter(self.prompts)))      # oldest first (insertion order)
            seen = self.prompts[prompt.id] = _Seen(prompt, round_no, peer=str(peer))
        counts = seen.counts.setdefault(kind, [0.0, 0])
        counts[0] += wins
        counts[1] += len(rewards)

    def add_own(self, rewards: Sequence[float]) -> None:
        self.own_rate[0] += sum(clipped(rewards))
        self.own_rate[1] += len(rewards)

    def own_success(self) -> float:
        return laplace_rate(*self.own_rate)

    def validate(self, own: Sequence[tuple[str, Sequence[float]]]) -> None:
        """The round's own groups (prompt id, rewards): each picked prompt's group carried signal
        (its peer's prediction held) or not; the credited peer's record says so."""
        for pid, rewards in own:
            peer = self.pending.pop(pid, None)
            if peer is None:
                continue
            hit = len(set(rewards)) > 1
            for who in (peer, NEWCOMERS) if peer == NEWCOMERS or self._newcomer(peer) else (peer,):
                rec = self.standing.setdefault(who, [0, 0])
                self.standing.move_to_end(who)
                rec[0] += hit
                rec[1] += 1
            while len(self.standing) > MAX_PEERS:
                self.standing.popitem(last=False)
        self.pending.clear()

    def _newcomer(self, peer: str) -> bool:
        return self.standing.get(peer, [0, 0])[1] < MIN_PICKS

    def _holds(self, who: str) -> bool:
        hits, picks = self.standing.get(who, [0, 0])
        return picks < MIN_PICKS or laplace_rate(hits, picks) >= 0.5

    def predict(self, prompt_id: str) -> float | None:
        """This node's predicted pass rate on a prompt peers answered (None: none did)."""
        seen = self.prompts.get(prompt_id)
        if seen is None or not seen.counts:
            return None
        mine = logit(self.own_success())
        votes = [(n, logit(laplace_rate(w, n)) + mine - logit(laplace_rate(*self.kind_rate[k])))
                 for k, (w, n) in seen.counts.items() if n]
        total = sum(n for n, _ in votes)
        return sigmoid(sum(n * x for n, x in votes) / total)

    def forget_before(self, round_no: int) -> None:
        for pid in [pid for pid, s in self.prompts.items() if s.round < round_no - self.max_age]:
            del self.prompts[pid]

    # --- checkpoint: prompts by id only (the task rebuilds each; a peer's text is never stored) --
    def state(self) -> dict:
        return {"prompts": [[pid, s.round, {k: list(c) for k, c in s.counts.items()}, s.peer]
                            for pid, s in self.prompts.items()],
                "used": list(self.used), "kind_rate": {k: list(v) for k, v in self.kind_rate.items()},
                "own_rate": list(self.own_rate),
                "standing": [[p, list(r)] for p, r in self.standing.items()], "pending": dict(self.pending),
                "newcomer_round": self.newcomer_round}

    def load_state(self, state: dict | None, prompt_of: Callable[[str], object] | None = None) -> int:
        """Restore what ``state`` wrote, rebuilding each prompt with ``prompt_of`` (the task's
        ``get``; default: the one the book was made with); a prompt the task no longer knows is
        dropped. Returns how many were dropped."""
        if not state:
            return 0
        prompt_of = prompt_of or self.prompt_of
        try:
            seen = [(str(pid), int(rnd), {str(k): [float(c[0]), int(c[1])] for k, c in counts.items()
                                          if k in KINDS}, str(peer[0]) if peer else "")
                    for pid, rnd, counts, *peer in state["prompts"]]
            # a book written before standings (issue 62.6): none yet, every peer a newcomer
            standing = [(str(p), [int(r[0]), int(r[1])]) for p, r in state.get("standing", [])]
            pending = {str(k): str(v) for k, v in state.get("pending", {}).items()}
            newcomer_round = int(state.get("newcomer_round", -NEWCOMER_BACKOFF))
            used = [str(pid) for pid in state["used"]]
            kind_rate = {k: [float(state["kind_rate"][k][0]), int(state["kind_rate"][k][1])] for k in KINDS}
            own_rate = [float(state["own_rate"][0]), int(state["own_rate"][1])]
        except (KeyError, TypeError, ValueError, AttributeError, IndexError) as e:
            raise ValueError(f"outcome book in the checkpoint does not read: {e!r}") from None
        dropped = 0
        self.prompts.clear()
        for pid, rnd, counts, peer in seen[-self.max_prompts:]:
            try:
                prompt = prompt_of(pid)
            except Exception:               # noqa: BLE001 - a task that changed: forget that prompt
                dropped += 1
                continue
            self.prompts[pid] = _Seen(prompt, rnd, counts, peer)
        self.used = dict.fromkeys(used[-self.max_prompts:])
        self.kind_rate, self.own_rate = kind_rate, own_rate
        self.standing = OrderedDict(standing[-MAX_PEERS:])
        self.pending, self.newcomer_round = pending, newcomer_round
        return dropped

    def choose(self, round_no: int, stream: Sequence, group_size: int) -> Choice:
        """The round's own prompts: peer-answered ones more likely than a fresh stream prompt to
        carry signal, best first, then the stream's in order (``stream`` has one per slot)."""
        self.forget_before(round_no)
        baseline = signal_chance(self.own_success(), group_size)
        scored = sorted(((signal_chance(p, group_size), pid) for pid in self.prompts
                         if (p := self.predict(pid)) is not None), key=lambda t: (-t[0], t[1]))
        picked, credited, newcomers = [], set(), 0
        pool_open = self._holds(NEWCOMERS) or round_no - self.newcomer_round >= NEWCOMER_BACKOFF
        for chance, pid in scored:
            if chance <= baseline or len(picked) == len(stream):
                break
            peer = self.prompts[pid].peer
            if peer in credited:                       # one pick a peer a round
                continue
            if self._newcomer(peer):                  # every peer without a record: one pool
                if not pool_open or newcomers >= NEWCOMER_PICKS:
                    continue
                newcomers += 1
            elif not self._holds(peer):               # its picks mostly carried no signal for us
                continue
            picked.append(pid)
            credited.add(peer)
            self.pending[pid] = peer
        if newcomers:
            self.newcomer_round = round_no
        for pid in picked:
            self.used[pid] = None
            if len(self.used) > self.max_prompts:
                self.used.pop(next(iter(self.used)))
        chosen = [self.prompts.pop(pid).prompt for pid in picked]
        chances = [c for c, pid in scored if pid in set(picked)]     # (scored order: best first)
        rest = list(stream[: len(stream) - len(chosen)])
        predicted = None if not chances else sum(chances) / len(chances)
        return Choice(prompts=chosen + rest, from_outcomes=len(chosen), predicted_signal=predicted)
