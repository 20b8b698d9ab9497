"""Attack: 2,000 and 10,000 Sybil ids with cheap answers against an honest new peer's grading, on a
made-up clock (issue 62 item 3). The real ``Intake`` (checks, book, scheduler, re-scoring, the
real arith task) with two things replaced, so that thousands of ids over tens of rounds take
minutes, not hours: intake's clock is a made-up one, and grading an answer costs --cost ms
of it (its reward is read off the text: the reference or not) instead of a math-verify call.
Rollouts claim another tokenizer, so the ids-to-text check (not what is measured) is skipped.

Each round every Sybil id sends one group of 4 answers (``--kind signal``: the reference and a
wrong number, so a graded Sybil looks as useful as the honest peer; ``zero``: four wrong
numbers), then the honest peer its 2 groups. Orders as in ``grading_sybils``: sybils-first and
honest-first (one side alone for --lead rounds), together. Fair share: the honest peer's
max-min share of what each round graded (``fair_level``), summed over the
rounds both send. The real-grader end of this attack is ``grading_sybils``.

A node draws its ring's secret at start (``GradingRing``), so where the honest peer's first turn
falls in a cycle is chance: when a cycle of the ring is longer than the rounds measured (at
--cost 30, 2,000 ids take ~49 rounds a cycle, and the fair share of 20 rounds is 0.4 of a group),
one run reads 0 % or several times its fair share. --repeats K runs each case K times, each with
a fresh intake (a fresh secret), and reports the mean share of fair over them (the expectation a
node has) beside the worst run and how many runs graded the honest peer at all.

    python -m benchmarks.attacks.grading_sybils_clock [--ids 2000,10000] [--rounds 30]
        [--kinds zero,signal] [--orders ...] [--repeats K] [--cost MS] [--rev REV] [--json PATH]

--rev runs ftis_edge/peers/ of another commit (e.g. 4a90598, before issue 62 item 3).
"""
from __future__ import annotations

import importlib.util
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.harness import ROOT, parser, write_json

ORDERS = ("sybils-first", "honest-first", "together")
HONEST_GROUPS = 2


def fair_level(graded: float, ids: int, honest_demand: int = HONEST_GROUPS) -> float:
    """The honest peer's max-min fair share (groups) of ``graded`` groups among ``ids`` Sybil ids
    wanting 1 group each and the honest peer wanting ``honest_demand`` (as ``grading_sybils``)."""
    if graded >= ids + honest_demand:
        return float(honest_demand)
    if graded <= ids + 1:
        return graded / (ids + 1)
    return float(graded - ids)


class MadeUpClock:
    """Stands in for the ``time`` module inside intake: monotonic() and time() read one clock
    that only grading moves (and each message by a microsecond)."""

    def __init__(self):
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now

    def time(self) -> float:
        self.now += 1e-6
        return self.now


class CostedTask:
    """The real task, but an answer's grading costs ``cost_s`` of the made-up clock and its
    reward is whether it is the reference."""

    def __init__(self, task, clock: MadeUpClock, cost_s: float):
        self._task, self._clock, self._cost = task, clock, cost_s

    def __getattr__(self, name):
        return getattr(self._task, name)

    def reward_many(self, texts, references, total_budget_s=None):
        from ftis_edge.tasks import check_format
        out = []
        for text, ref in zip(texts, references):
            if total_budget_s is not None and self._cost > total_budget_s:   # cut at the budget
                self._clock.now += max(0.0, total_budget_s)
                out.append((0.0, {"timed_out": True, "reason": "total budget spent"}))
                continue
            self._clock.now += self._cost
            ok = check_format(text).answer == ref
            out.append((float(ok), {"seconds": self._cost, "timed_out": False, "correct": ok}))
        return out


def load_peers(rev: str | None):
    """The intake and book modules of this checkout, or of ``rev`` (its ftis_edge/peers/ loaded
    as a package of its own beside ours)."""
    if rev is None:
        from ftis_edge.peers import intake
        return intake
    tmp = Path(tempfile.mkdtemp(prefix="peers-"))
    names = subprocess.run(["git", "ls-tree", "--name-only", f"{rev}:ftis_edge/peers/"], cwd=ROOT,
                           capture_output=True, text=True, check=True).stdout.split()
    for n in names:
        if n.endswith(".py"):
            (tmp / n).write_bytes(subprocess.run(["git", "show", f"{rev}:ftis_edge/peers/{n}"], cwd=ROOT,
                                                 capture_output=True, check=True).stdout)
    pkg = "ftis_edge.peers_at_rev"
    spec = importlib.util.spec_from_file_location(pkg, tmp / "__init__.py", submodule_search_locations=[str(tmp)])
    mod = importlib.util.module_from_spec(spec)
    sys.modules[pkg] = mod
    spec.loader.exec_module(mod)
    return importlib.import_module(f"{pkg}.intake")


def run_one(mod, task, ids: int, order: str, kind: str, rounds: int, lead: int, budget_s: float,
            cost_s: float) -> dict:
    import numpy as np

    from ftis_edge.peers.swarm import Received
    from ftis_edge.rollout.wire import Rollout, WireCompletion
    clock = MadeUpClock()
    mod.time = clock                     # intake's clock (restored by the caller's next load)
    book_cls = getattr(mod, "PeerBook", None) or importlib.import_module(mod.__package__ + ".book").PeerBook
    intake = mod.Intake(task=CostedTask(task, clock, cost_s), swarm="s", my_node_id="me", my_tokenizer_fp="ours",
                        vocab_size=50_000, book=book_cls(quarantine_after=3), decode=lambda ids: "",
                        stop_ids=[0], rescore_budget_s=budget_s)
    prompt = next(task.prompts(seed=3))
    right, wrong = f"<answer>{prompt.reference}</answer>", "<answer>1</answer>"

    def rollout(node, texts):
        comps = [WireCompletion(token_ids=np.arange(3, dtype=np.int64), logprobs=np.full(3, -0.5, np.float32),
                                text=t, reward=0.0, finish_reason="stop") for t in texts]
        return Rollout(node_id=node, swarm="s", task=task.tag_of(prompt.id), prompt_id=prompt.id, completions=comps,
                       vocab_size=50_000, model_fp="m", tokenizer_fp="theirs", group_size=4)
    sybil_texts = [right, wrong] * 2 if kind == "signal" else [wrong] * 4
    lead = 0 if order == "together" else lead
    honest = fair = 0.0
    first = None
    t0 = time.process_time()
    for rnd in range(1, lead + rounds + 1):
        sybils_on = order != "honest-first" or rnd > lead
        honest_on = order != "sybils-first" or rnd > lead
        items = [Received(rollout=rollout(f"sybil-{i}", sybil_texts), sender=f"sybil-{i}", nbytes=100)
                 for i in range(ids if sybils_on else 0)]
        items += [Received(rollout=rollout("alice", [right, wrong] * 2), sender="alice", nbytes=100)
                  for _ in range(HONEST_GROUPS if honest_on else 0)]
        intake.receive(items, current_round=rnd)
        graded = intake.pop_round_counts().get("accepted", 0)
        got = sum(g.rollout.node_id == "alice" for g in intake.take(rnd, limit=1_000_000))
        if sybils_on and honest_on:
            honest += got
            fair += fair_level(graded, ids)
            if got and first is None:
                first = rnd - lead
    return {"ids": ids, "order": order, "kind": kind, "rounds": rounds, "honest_graded": honest,
            "fair": round(fair, 2), "share_of_fair": round(honest / fair, 3) if fair else None,
            "first_graded_round": first, "cpu_s": round(time.process_time() - t0, 1)}


def summarise(runs: list[dict]) -> dict:
    """One case over several secrets: the mean share of fair (the honest peer's expectation), the
    worst run, how many runs graded it, the median first graded round (None where none did)."""
    shares = [r["share_of_fair"] or 0.0 for r in runs]
    firsts = sorted(r["first_graded_round"] for r in runs if r["first_graded_round"] is not None)
    return {**{k: runs[0][k] for k in ("ids", "order", "kind", "rounds")},
            "honest_graded": sum(r["honest_graded"] for r in runs) / len(runs),
            "fair": round(sum(r["fair"] for r in runs) / len(runs), 2),
            "share_of_fair": round(sum(shares) / len(shares), 3), "worst_share": min(shares),
            "runs_graded": sum(1 for r in runs if r["honest_graded"]),
            "first_graded_round": firsts[len(firsts) // 2] if firsts else None,
            "cpu_s": round(sum(r["cpu_s"] for r in runs), 1), "runs": runs}


def main() -> int:
    ap = parser(__doc__)
    ap.add_argument("--ids", default="2000,10000")
    ap.add_argument("--rounds", type=int, default=30, help="rounds measured (both sending)")
    ap.add_argument("--lead", type=int, default=2)
    ap.add_argument("--kinds", default="zero,signal")
    ap.add_argument("--orders", default=",".join(ORDERS))
    ap.add_argument("--budget", type=float, default=5.0, help="the round's re-grading budget (s)")
    ap.add_argument("--cost", type=float, default=3.0, help="ms of the made-up clock an answer costs")
    ap.add_argument("--repeats", type=int, default=1, help="runs of each case, each with a fresh ring secret")
    ap.add_argument("--rev", help="run ftis_edge/peers/ of this commit instead")
    a = ap.parse_args()
    orders, kinds = a.orders.split(","), a.kinds.split(",")
    if bad := set(orders) - set(ORDERS):
        ap.error(f"unknown order(s) {sorted(bad)}; choose from {ORDERS}")
    if bad := set(kinds) - {"zero", "signal"}:
        ap.error(f"unknown kind(s) {sorted(bad)}; choose from zero, signal")
    from ftis_edge.tasks import get_task
    task = get_task("arith")
    mod = load_peers(a.rev)
    rows = []
    for ids in (int(x) for x in a.ids.split(",")):
        for kind in kinds:
            for order in orders:
                runs = [run_one(mod, task, ids, order, kind, a.rounds, a.lead, a.budget, a.cost / 1000)
                        for _ in range(a.repeats)]
                r = dict(runs[0]) if a.repeats == 1 else summarise(runs)
                rows.append(r)
                share = "n/a" if r["share_of_fair"] is None else f"{r['share_of_fair']:.0%}"
                spread = "" if a.repeats == 1 else (f" (mean of {a.repeats} secrets; worst run {r['worst_share']:.0%},"
                                                   f" graded in {r['runs_graded']} of {a.repeats})")
                print(f"{ids:>6} ids {kind:>6} {order:>12}: honest graded {r['honest_graded']:.1f}/"
                      f"{HONEST_GROUPS * a.rounds}, fair share {r['fair']:.2f} -> {share} of fair{spread}; first "
                      f"graded in round {r['first_graded_round']} ({r['cpu_s']} s CPU)", flush=True)
                write_json(a.json, {"peers": a.rev or "this checkout", "budget_s": a.budget, "cost_ms": a.cost,
                                    "repeats": a.repeats, "rounds": a.rounds, "rows": rows})
    worst = min((r["share_of_fair"] or 0.0) for r in rows)
    print(f"worst honest share: {worst:.0%} of its fair share ({a.rev or 'this checkout'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
