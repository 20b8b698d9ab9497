"""Both directions of the math grader on a committed corpus (issue 51 item 7).

``tests/data/grader_corpus.jsonl``: one JSON object a line, ``kind`` = ``computation`` (the
question restated, or arithmetic left undone: must not score) or ``honest`` (a result as people
and models write it: must score), with ``answer``, ``reference`` and a ``note``. Each answer is
graded as a node grades it (``grader.score`` on ``<answer>…</answer>``: the pre-filters, the
bare-answer and computation refusals, then math-verify in the grader worker); math-verify's own
verdict (``rewards.answers_match``) is printed beside it, since a computation it rejects anyway
is no hole.

    python -m benchmarks.grader_corpus [--json out.json] [--verbose] [--tree OLD_CHECKOUT] [--generated]

(``--tree``: that checkout's grader is measured, the "before" numbers.) Also
arith's own questions restated in every spelling of their sign (``arith_restatements``), and,
with ``--generated``, the corpus of spellings generated from Unicode's and LaTeX's operator and
spacing classes (``tests/data/grader_corpus_generated.jsonl``, benchmarks/grader_spellings.py)
and arith's questions restated in each of those spellings (``class_restatements``).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from benchmarks.harness import parser, write_json

CORPUS = Path(__file__).resolve().parents[1] / "tests" / "data" / "grader_corpus.jsonl"
GENERATED = CORPUS.with_name("grader_corpus_generated.jsonl")


def load(path: Path = CORPUS) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def measure(entries: list[dict]) -> dict:
    """Per kind: entries, math-verify's accepts, graded correct, and the misses."""
    from ftis_edge.tasks.grader import score
    from ftis_edge.tasks.rewards import RewardSettings, answers_match
    settings = RewardSettings(timeout_s=10.0)
    out = {}
    for kind in ("computation", "honest"):
        rows = [e for e in entries if e["kind"] == kind]
        verdicts = []
        for e in rows:
            accepted = answers_match(e["answer"], e["reference"])
            value, breakdown = score(f"<answer>{e['answer']}</answer>", e["reference"], settings)
            verdicts.append((e, accepted, value >= 1.0, breakdown["reason"]))
        wrong = ([v for v in verdicts if v[2]] if kind == "computation"      # a computation scored
                 else [v for v in verdicts if v[1] and not v[2]])            # an honest result refused
        out[kind] = {"n": len(rows), "math_verify_accepts": sum(v[1] for v in verdicts),
                     "graded_correct": sum(v[2] for v in verdicts),
                     "misses": [{"answer": e["answer"], "reference": e["reference"], "note": e["note"],
                                 "reason": reason} for e, _, _, reason in wrong]}
    return out


# the sign arith shows, and spellings of the same operation a learner may try in its place
RESPELL = {"×": ("×", "⋅", "∗", "·", "\\cdot", "\\ast", "*"), "÷": ("÷", "∕", "\\div", "/")}


def arith_restatements(n: int = 10) -> dict:
    """H6's self-hack one character away: arith's own "What is A × B?" answered "A ⋅ B" (every
    spelling of its sign), over the first ``n`` prompts of each sign; how many scored."""
    import re
    from itertools import islice

    from ftis_edge.tasks import get_task
    from ftis_edge.tasks.grader import score
    from ftis_edge.tasks.rewards import RewardSettings
    settings = RewardSettings(timeout_s=10.0)
    pattern = re.compile(r"What is (\d+) ([×÷+-]) (\d+)\?")
    found: dict[str, list] = {"×": [], "÷": []}
    for p in islice(get_task("arith", level=[1, 2, 3]).prompts(seed=0), 2000):
        m = pattern.fullmatch(p.question)
        if m and m.group(2) in found and len(found[m.group(2)]) < n:
            found[m.group(2)].append((m.group(1), m.group(3), p.reference))
    out = {}
    for sign, items in found.items():
        for spelling in RESPELL[sign]:
            scored = sum(score(f"<answer>{a} {spelling} {b}</answer>", ref, settings)[0] >= 1.0 for a, b, ref in items)
            out[f"{a_sign(sign)} as {spelling}"] = [scored, len(items)]
    return out


def class_restatements(n: int = 10, entries: list[dict] | None = None) -> dict:
    """arith's "A × B" / "A ÷ B" restated in every spelling of the generated corpus that
    math-verify read as that operation (an operator symbol, or spacing around the sign):
    {operation: [spellings that let any prompt score, spellings tried]}."""
    import re
    from itertools import islice

    from ftis_edge.tasks import get_task
    from ftis_edge.tasks.grader import score
    from ftis_edge.tasks.rewards import RewardSettings
    settings = RewardSettings(timeout_s=10.0)
    entries = load(GENERATED) if entries is None else entries
    probe = re.compile(r"(12)(.*?)(4)")
    spellings: dict[str, set] = {"×": set(), "÷": set()}
    for e in entries:
        m = probe.fullmatch(e["answer"])
        op = e["note"].rsplit(" read as ", 1)[-1]
        if e["kind"] == "computation" and m and op in spellings:
            spellings[op].add(m.group(2))               # what stood between the operands
    pattern = re.compile(r"What is (\d+) ([×÷]) (\d+)\?")
    found: dict[str, list] = {"×": [], "÷": []}
    for p in islice(get_task("arith", level=[1, 2, 3]).prompts(seed=0), 2000):
        m = pattern.fullmatch(p.question)
        if m and len(found[m.group(2)]) < n:
            found[m.group(2)].append((m.group(1), m.group(3), p.reference))
    out = {}
    for sign, middles in spellings.items():
        through = sum(any(score(f"<answer>{a}{mid}{b}</answer>", ref, settings)[0] >= 1.0 for a, b, ref in found[sign])
                      for mid in sorted(middles))
        out[a_sign(sign)] = [through, len(middles)]
    return out


def a_sign(sign: str) -> str:
    return {"×": "A × B", "÷": "A ÷ B"}[sign]


def main(argv=None) -> int:
    ap = parser(__doc__)
    ap.add_argument("--corpus", type=Path, default=CORPUS)
    ap.add_argument("--tree", type=Path, help="measure the grader of this checkout (the \"before\" numbers)")
    ap.add_argument("--verbose", action="store_true", help="list every miss")
    ap.add_argument("--generated", action="store_true", help="also the corpus generated from the classes")
    args = ap.parse_args(argv)
    if args.tree:                               # before anything imports ftis_edge
        sys.path.insert(0, str(args.tree.resolve()))
    r = measure(load(args.corpus))
    comp, honest = r["computation"], r["honest"]
    print(f"computations graded correct: {comp['graded_correct']} of {comp['n']} "
          f"(math-verify alone accepts {comp['math_verify_accepts']})")
    print(f"honest results refused: {len(honest['misses'])} of the {honest['math_verify_accepts']} "
          f"math-verify accepts ({honest['n']} in the corpus)")
    arith = arith_restatements()
    print("arith's question restated (scored of prompts): "
          + ", ".join(f"{k} {v[0]}/{v[1]}" for k, v in arith.items()))
    r["arith_restatements"] = arith
    if args.generated:
        gen = load(GENERATED)
        g = r["generated"] = measure(gen)
        print(f"generated corpus: computations graded correct {g['computation']['graded_correct']} of "
              f"{g['computation']['n']} (all accepted by math-verify); honest results refused "
              f"{len(g['honest']['misses'])} of {g['honest']['math_verify_accepts']}")
        cls = r["class_restatements"] = class_restatements(entries=gen)
        print("arith's question in each generated spelling (spellings letting any of 10 prompts score / tried): "
              + ", ".join(f"{k} {v[0]}/{v[1]}" for k, v in cls.items()))
    if args.verbose:
        for kind in ("computation", "honest"):
            for m in r[kind]["misses"] + (r["generated"][kind]["misses"] if args.generated else []):
                print(f"  {kind}: {m['answer']!r} for {m['reference']!r} ({m['note']}): {m['reason']}")
    write_json(args.json, r)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
