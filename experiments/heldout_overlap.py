"""How much of H4–H6's "held-out" ID evals the nodes could have trained on (issue 48.4).

Before held-out meant unseen (ftis_edge/tasks/unseen.py), arith's eval ids (n >= 10^9) held
prompts apart by id only: a question whose text also comes up under a training id is the same
question. For each committed final ID eval of an arith run this counts, by question text:

* ``distinct``: distinct questions among the eval's prompts;
* ``twin``: eval prompts whose question some training id of the node's levels also gives
  (the first TWIN_SCAN training ids of each level; level 1's and 2's spaces are covered);
* ``own``: eval prompts whose question is in the node's own prompt stream for the rounds it ran
  (the stream of the code they ran: ``Random("arith:<seed>:<i>")``, prompts_per_round a round;
  with batch fill the node generates only some of them, so this bounds what it trained from above);
* ``arm``: eval prompts whose question any node of its swarm arm drew (what peers could send
  it; for a node alone, its own stream).

Run: ``python -m experiments.heldout_overlap [--runs docs/runs] [--json out.json]``.
"""
from __future__ import annotations

import argparse
import json
import random
import tomllib
from collections import defaultdict
from pathlib import Path

from experiments.repro import records
from ftis_edge.tasks.arith import EVAL_OFFSET, make_problem, parse_levels
from ftis_edge.tasks.unseen import question_key

STUDIES = {"H4": "fill/fill4", "H5": "fill/fill-hetero", "H6": "h6/h6"}
TWIN_SCAN = 60_000


def old_stream(seed: int, levels, count: int) -> list[str]:
    """The questions the pre-48.4 training stream drew: draw i of seed, ids below 10^9."""
    out = []
    for i in range(count):
        rng = random.Random(f"arith:{seed}:{i}")
        out.append(question_key(make_problem(rng.choice(levels), rng.randrange(EVAL_OFFSET)).question))
    return out


def twins(level: int, cache: dict) -> set[str]:
    if level not in cache:
        cache[level] = {question_key(make_problem(level, n).question) for n in range(TWIN_SCAN)}
    return cache[level]


def run_facts(folder: Path) -> dict | None:
    config = tomllib.loads((folder / "config.toml").read_text())
    task = config.get("task", {})
    evals = records.eval_of(folder, "id")
    if task.get("name", "arith") != "arith" or evals is None:
        return None
    levels = parse_levels(task.get("level") or None)
    rounds = len(records.rounds(folder))
    drawn = old_stream(config["node"]["seed"], levels, rounds * task.get("prompts_per_round", 4))
    items = evals["items"]
    return {"levels": levels, "drawn": set(drawn), "eval": [question_key(make_problem(
        int(i["id"].split("/")[1][1:]), int(i["id"].split("/")[2])).question) for i in items]}


def study_rows(root: Path, twin_cache: dict) -> list[dict]:
    rows = []
    for study, sub in STUDIES.items():
        runs = {p.parent: run_facts(p.parent) for p in sorted((root / sub).glob("s*/*/config.toml"))}
        arms = defaultdict(set)
        for folder, facts in runs.items():
            if facts:
                arms[(folder.parent, folder.name.rsplit("-", 1)[0])] |= facts["drawn"]
        for folder, facts in runs.items():
            if not facts:
                continue
            ev = facts["eval"]
            reach = set().union(*(twins(lv, twin_cache) for lv in facts["levels"]))
            name = folder.name.rsplit("-", 1)[0]
            arm = facts["drawn"] if name == "alone" else arms[(folder.parent, name)]   # alone: no peers
            rows.append({"study": study, "run": str(folder.relative_to(root)), "n": len(ev),
                         "distinct": len(set(ev)), "twin": sum(q in reach for q in ev),
                         "own": sum(q in facts["drawn"] for q in ev), "arm": sum(q in arm for q in ev)})
    return rows


def summary(rows: list[dict]) -> str:
    lines = ["| study | runs | eval prompts | distinct questions | with a training twin | drawn by the node | "
             "drawn by its arm |", "|---|---|---|---|---|---|---|"]
    for study in STUDIES:
        sel = [r for r in rows if r["study"] == study]
        if not sel:
            continue
        n = sum(r["n"] for r in sel)

        def share(key):
            return f"{sum(r[key] for r in sel) / n:.1%}"
        lines.append(f"| {study} | {len(sel)} | {sel[0]['n']} each | {sum(r['distinct'] for r in sel) / len(sel):.0f} "
                     f"a run | {share('twin')} | {share('own')} | {share('arm')} |")
    return "\n".join(lines)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=Path, default=Path("docs/runs"))
    ap.add_argument("--json", type=Path, help="also write every run's counts here")
    args = ap.parse_args(argv)
    rows = study_rows(args.runs, {})
    print(summary(rows))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
