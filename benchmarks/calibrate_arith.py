"""Calibrate the arith levels: accuracy of the default model on each level, greedy and sampled.

GRPO learns only from groups whose rewards differ, so the useful levels are those where the
base model, sampling at T=1 in groups of G=8, is right sometimes but not always (mixed groups).

    .venv/bin/python -m benchmarks.calibrate_arith                      # 40 prompts per level
    .venv/bin/python -m benchmarks.calibrate_arith --prompts 16 --levels 1,2,3 --json out.json

Prints one table row per (level, decoding); `--json` keeps every completion.
"""
from __future__ import annotations

import sys
import time

from rich.console import Console
from rich.table import Table

from benchmarks.harness import eval_args, parser, write_json
from ftis_edge import evaluate


def main() -> int:
    ap = parser(__doc__)
    ap.add_argument("--model", default=None)
    ap.add_argument("--levels", default="1,2,3,4,5,6")
    ap.add_argument("--prompts", type=int, default=40, help="prompts per level")
    ap.add_argument("--group", type=int, default=8, help="samples per prompt at T=1")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--few-shot", type=int, default=None, help="override the task default")
    ap.add_argument("--no-greedy", action="store_true")
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()

    runs = []
    for level in [int(x) for x in a.levels.split(",")]:
        configs = [] if a.no_greedy else [("greedy", dict(temperature=0.0, samples=1))]
        configs.append((f"T=1 G={a.group}", dict(temperature=1.0, samples=a.group)))
        for name, cfg in configs:
            args = eval_args(task="arith", level=str(level), limit=a.prompts, model=a.model,
                             max_new_tokens=a.max_new_tokens, threads=a.threads, quiet=True,
                             few_shot=a.few_shot, **cfg)
            t0 = time.time()
            result = evaluate.evaluate(args)
            result["decoding"] = name
            runs.append(result)
            lo, hi = result["accuracy_ci95"]
            print(f"level {level} {name}: acc {result['accuracy']:.1%} [{lo:.1%}, {hi:.1%}] "
                  f"format {result['format_rate']:.1%} mixed {result.get('mixed_group_rate', float('nan')):.1%} "
                  f"({time.time() - t0:.0f} s, {result['tok_s']:.0f} tok/s)", file=sys.stderr, flush=True)

    table = Table(title=f"arith calibration · {runs[0]['model']} · {a.prompts} prompts/level · "
                        f"few_shot={runs[0]['few_shot']} · max_new_tokens={a.max_new_tokens}")
    for col in ["level", "decoding", "n", "accuracy", "95% CI", "format ok", "answer ok",
                "mixed groups", "pass@G", "mean tokens"]:
        table.add_column(col, justify="left" if col in ("level", "decoding") else "right")
    for r in runs:
        lo, hi = r["accuracy_ci95"]
        table.add_row(",".join(map(str, r["level"])), r["decoding"], str(r["n"]), f"{r['accuracy']:.1%}",
                      f"{lo:.1%} – {hi:.1%}", f"{r['format_rate']:.1%}", f"{r['answer_correct_rate']:.1%}",
                      f"{r['mixed_group_rate']:.1%}" if "mixed_group_rate" in r else "–",
                      f"{r['pass_at_k']:.1%}" if "pass_at_k" in r else "–",
                      f"{r['mean_completion_tokens']:.0f}")
    Console(width=140).print(table)
    write_json(a.json, runs)          # every run's summary and completions
    return 0


if __name__ == "__main__":
    sys.exit(main())
