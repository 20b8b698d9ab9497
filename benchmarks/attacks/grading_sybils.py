"""Attack: many Sybil ids with cheap answers, one rollout each a round, against an honest peer's
share of the round's grading budget (real Intake, real math-verify grader worker, real SmolLM2
tokenizer, rollouts through the real wire).

Each round --ids Sybil ids send one group of 4 answers each (``--kind signal``: the public
reference and a wrong number, so their groups carry signal and look useful; ``--kind zero``: four
copies of one wrong number) and an honest peer sends 2 groups of 4 (right and wrong answers). Arrival orders:
``sybils-first`` (the Sybils send alone for --lead rounds, then the honest peer joins),
``honest-first`` (the other way round) and ``together``; within a round the Sybils' messages come
first, the worst place for the honest peer. Measured over the --rounds rounds in which both send.

The honest peer's fair share is its max-min fair share of what the round graded: with
``graded`` groups graded (all senders) and demands of 1 group per Sybil id and 2 for the honest
peer, the level x with ``ids * min(1, x) + min(2, x) = graded``; it gets ``min(2, x)`` a round.
That judges how the intake splits what it graded; whether it wasted the budget shows beside it:
before each run 40 Sybil-like groups from distinct ids are graded with an ample budget and timed,
``capacity = budget / seconds per group`` (a loaded machine's capacity swings by 2-3x between
rounds, so it is shown, not used as the yardstick). Printed: honest groups graded / fair share
over the rounds (>= 90 % is the goal), and per round (honest, all graded).

    python -m benchmarks.attacks.grading_sybils [--ids 200] [--rounds 6] [--runs 3]
        [--orders sybils-first,honest-first,together] [--kind signal] [--intake FILE] [--json PATH]

--intake runs another version of ftis_edge/peers/intake.py (e.g. ``git show main:ftis_edge/peers/intake.py``).
"""
from __future__ import annotations

import importlib.util
import sys
import time

from benchmarks.harness import parser, write_json

ORDERS = ("sybils-first", "honest-first", "together")
HONEST_GROUPS = 2
PROBE = 40                                # groups timed to estimate what the budget can grade


def fair_level(graded: float, ids: int, honest_demand: int = HONEST_GROUPS) -> float:
    """The honest peer's max-min fair share (groups) of ``graded`` groups among ``ids`` Sybil ids
    wanting 1 group each and the honest peer wanting ``honest_demand``."""
    if graded >= ids + honest_demand:
        return float(honest_demand)
    if graded <= ids + 1:                 # every one below 1 group: an equal split
        return graded / (ids + 1)
    return float(graded - ids)            # Sybils full, the honest peer the rest


def _pct(share: float | None) -> str:
    return "n/a (nothing graded)" if share is None else f"{share:.0%}"


def _load_intake(path: str) -> None:
    spec = importlib.util.spec_from_file_location("ftis_edge.peers.intake", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["ftis_edge.peers.intake"] = mod
    spec.loader.exec_module(mod)


def main() -> int:
    ap = parser(__doc__)
    ap.add_argument("--ids", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=6, help="rounds measured (both sending)")
    ap.add_argument("--lead", type=int, default=2, help="rounds one side sends alone first")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--orders", default=",".join(ORDERS))
    ap.add_argument("--kind", choices=("signal", "zero"), default="signal")
    ap.add_argument("--budget", type=float, default=5.0, help="the round's re-grading budget (s)")
    ap.add_argument("--intake", help="another ftis_edge/peers/intake.py to run")
    a = ap.parse_args()
    orders = a.orders.split(",")
    if bad := set(orders) - set(ORDERS):
        ap.error(f"unknown order(s) {sorted(bad)}; choose from {ORDERS}")
    if a.intake:
        _load_intake(a.intake)
    from ftis_edge.models.resolve import resolve_model
    from ftis_edge.peers.swarm import Received
    from ftis_edge.tasks import get_task, warm_up
    from testkit.peers import intake_for, rollout

    task, smol = get_task("arith"), resolve_model("smollm2-135m")
    smol.tokenizer()
    prompt = next(task.prompts(seed=3))
    right, wrong = f"<answer>{prompt.reference}</answer>", "<answer>1</answer>"
    sybil_texts = [right, wrong] * 2 if a.kind == "signal" else [wrong] * 4
    sybil_r = rollout(smol, task, node="s", prompt=prompt, texts=sybil_texts)[0]
    honest_r = rollout(smol, task, node="alice", prompt=prompt, texts=[right, wrong] * 2)[0]

    def copy(r, node):                   # intake rewrites node_id: one object per message
        return type(r)(**{**r.__dict__, "node_id": node})

    rows = []
    for order in orders:
        for run in range(1, a.runs + 1):
            warm_up()
            probe = intake_for(smol, task, rescore_budget_s=600.0)
            t0 = time.monotonic()
            probe.receive([Received(rollout=copy(sybil_r, f"probe-{i}"), sender=f"probe-{i}", nbytes=100)
                           for i in range(PROBE)], current_round=1)
            capacity = a.budget / ((time.monotonic() - t0) / PROBE)
            intake = intake_for(smol, task, rescore_budget_s=a.budget)
            lead = 0 if order == "together" else a.lead
            per_round, lead_rounds = [], []
            for rnd in range(1, lead + a.rounds + 1):
                warm_up()
                sybils_on = order != "honest-first" or rnd > lead
                honest_on = order != "sybils-first" or rnd > lead
                items = [Received(rollout=copy(sybil_r, f"sybil-{i}"), sender=f"sybil-{i}", nbytes=100)
                         for i in range(a.ids if sybils_on else 0)]
                items += [Received(rollout=copy(honest_r, "alice"), sender="alice", nbytes=100)
                          for _ in range(HONEST_GROUPS if honest_on else 0)]
                intake.receive(items, current_round=rnd)
                graded = intake.pop_round_counts().get("accepted", 0)
                got = sum(g.rollout.node_id == "alice" for g in intake.take(rnd, limit=100_000))
                if sybils_on and honest_on:
                    per_round.append({"honest": got, "graded": graded, "fair": round(fair_level(graded, a.ids), 3)})
                else:
                    lead_rounds.append(graded)
            honest = sum(r["honest"] for r in per_round)
            fair = sum(r["fair"] for r in per_round)
            rows.append({"order": order, "run": run, "capacity_groups": round(capacity, 1),
                         "lead_rounds_graded": lead_rounds,
                         "honest_graded": honest,
                         "honest_sent": HONEST_GROUPS * len(per_round), "fair": round(fair, 2),
                         "share_of_fair": round(honest / fair, 3) if fair else None,
                         "per_round": per_round})
            r = rows[-1]
            print(f"{order:>12} run {run}: capacity {capacity:.0f} groups/round; honest graded {honest}/{r['honest_sent']}, fair share "
                  f"{fair:.2f} -> {_pct(r['share_of_fair'])} of fair; lead rounds graded {lead_rounds}, per round "
                  f"{[(p['honest'], p['graded']) for p in per_round]} (honest, all graded)", flush=True)
            write_json(a.json, {"intake": a.intake or "this checkout", "ids": a.ids, "kind": a.kind,
                                "budget_s": a.budget, "rows": rows})
    shares = [r["share_of_fair"] for r in rows]
    worst = None if None in shares else min(shares)
    print(f"worst honest share: {_pct(worst)} of its fair share; honest graded "
          f"{sum(r['honest_graded'] for r in rows)}/{sum(r['honest_sent'] for r in rows)} "
          f"({a.ids} ids, {a.kind} Sybil groups)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
