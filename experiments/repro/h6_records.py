"""What H6's runs recorded, one seed: the in-run held-out evals, the guard, own tokens and what
the protections did (docs/results.md's "What the runs recorded" tables).

    .venv/bin/python -m experiments.repro.h6_records --runs docs/runs/h6 --seed 1

Sums are over the run's rounds; `reward/refused` (own answers the grader's rules refused unread,
e.g. a restated question) is recorded since seed 1 and shows "–" in older runs.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from experiments.repro import records

ARMS = ("alone", "ftis", "protect")
SUMMED = ("gen/tokens", "samples/foreign", "peers/refused_length", "is/foreign_capped")


def total(rounds: list[dict], key: str) -> int | None:
    values = [r[key] for r in rounds if isinstance(r.get(key), (int, float))]
    return round(sum(values)) if values else None


def guard_line(rounds: list[dict], alone: bool) -> str:
    """'–' for a twin (no peers to guard against), else the first round the guard acted, or 'quiet'."""
    if alone:
        return "–"
    fired = [(r["round"], r["swarm/guard_level"]) for r in rounds if (r.get("swarm/guard_level") or 0) > 0]
    return f"round {fired[0][0]}: level {fired[0][1]}" if fired else "quiet"


def row(name: str, rounds: list[dict]) -> str:
    evals = [f"{r['eval/accuracy']:.0%}" for r in rounds if r.get("eval/accuracy") is not None]
    sums = [total(rounds, k) for k in SUMMED]
    implausible, repeated = total(rounds, "trust/implausible"), total(rounds, "trust/repeated_tokens")
    refused = total(rounds, "reward/refused")
    cells = [name, ", ".join(evals) or "–", guard_line(rounds, name.startswith("alone")),
             *(str(s if s is not None else 0) for s in sums),
             f"{implausible or 0} / {repeated or 0}", "–" if refused is None else str(refused)]
    return "| " + " | ".join(cells) + " |"


def table(seed_dir: Path) -> list[str]:
    lines = ["| node | in-run held-out (32 prompts) | guard | own tokens | foreign samples "
             "| refused by length | IS capped | trust implausible / repeated tokens | own answers refused |",
             "|---|---|---|---|---|---|---|---|---|"]
    for arm in ARMS:
        for run in sorted(seed_dir.glob(f"{arm}-*")):
            if run.is_dir():
                lines.append(row(run.name, records.rounds(run)))
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=Path, default=Path("docs/runs/h6"), help="publish.py's DEST for h6")
    ap.add_argument("--batch", default="h6")
    ap.add_argument("--seed", type=int, required=True)
    args = ap.parse_args(argv)
    seed_dir = args.runs / args.batch / f"s{args.seed}"
    if not seed_dir.is_dir():
        ap.error(f"no runs for seed {args.seed} under {seed_dir}")
    print("\n".join(table(seed_dir)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
