"""Attack: many ids whose answers grade just under the time limit, against an honest peer's
grading (real Intake, real math-verify grader, real SmolLM2 tokenizer).

Each round --fakes ids send one rollout each of 4 answers ``x!!…!`` (a 26-fold factorial of a
symbol, ~0.15 s each; the limit is 0.5 s; a computation on numbers such as ``\\sqrt{99999^{45000}}``
is refused unread now, which costs nothing) ahead of an honest peer's 2 groups; the round's
re-grading budget is 5 s (the default). Control: the honest peer alone. Prints honest groups
graded of sent, and the grader timeouts charged to the honest peer.

    python -m benchmarks.attacks.grading_flood [--fakes 40] [--rounds 6] [--intake FILE] [--json PATH]

--intake runs another version of ftis_edge/peers/intake.py (e.g. ``git show REV:ftis_edge/peers/intake.py``).
"""
from __future__ import annotations

import importlib.util
import sys

from benchmarks.harness import parser, write_json

SLOW_ANSWER = "<answer>x" + "!" * 26 + "</answer>"   # symbolic: graded, slowly, not refused unread


def main() -> int:
    ap = parser(__doc__)
    ap.add_argument("--fakes", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--intake", help="another ftis_edge/peers/intake.py to run")
    a = ap.parse_args()
    if a.intake:
        spec = importlib.util.spec_from_file_location("ftis_edge.peers.intake", a.intake)
        mod = importlib.util.module_from_spec(spec)
        sys.modules["ftis_edge.peers.intake"] = mod
        spec.loader.exec_module(mod)
    from ftis_edge.models.resolve import resolve_model
    from ftis_edge.peers.swarm import Received
    from ftis_edge.tasks import get_task, warm_up
    from testkit.peers import intake_for, rollout      # an honest peer's rollouts (real tokenizer)

    task, smol = get_task("arith"), resolve_model("smollm2-135m")
    smol.tokenizer()
    prompt = next(task.prompts(seed=3))
    rows = []
    for n_fakes in (0, a.fakes):
        intake = intake_for(smol, task, rescore_budget_s=5.0)
        graded = sent = 0
        per_round = []
        for rnd in range(1, a.rounds + 1):
            warm_up()
            fakes = [Received(rollout=rollout(smol, task, node=f"fake-{i}", prompt=prompt,
                                              texts=[SLOW_ANSWER] * 4)[0],
                              sender=f"fake-{i}", nbytes=100) for i in range(n_fakes)]
            honest = [Received(rollout=rollout(smol, task, node="alice", prompt=prompt,
                                               texts=[f"<answer>{prompt.reference}</answer>", "<answer>1</answer>"] * 2)[0],
                               sender="alice", nbytes=100) for _ in range(2)]
            intake.receive(fakes + honest, current_round=rnd)
            got = sum(g.rollout.node_id == "alice" for g in intake.take(rnd, limit=1024))
            per_round.append(got)
            graded, sent = graded + got, sent + 2
        alice = intake.book.snapshot()["alice"]
        rows.append({"fakes": n_fakes, "honest_graded": graded, "honest_sent": sent, "per_round": per_round,
                     "honest_grader_timeouts": alice["grader_timeouts"],
                     "honest_refused": alice["rejected_by_reason"]})
    write_json(a.json, {"intake": a.intake or "this checkout", "rows": rows})
    for r in rows:
        print(f"fake ids {r['fakes']:>3}: honest groups graded {r['honest_graded']}/{r['honest_sent']} "
              f"(per round {r['per_round']}), grader timeouts charged to it {r['honest_grader_timeouts']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
