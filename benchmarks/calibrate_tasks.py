"""Which reasoning-gym datasets can a small model learn? Base accuracy at T = 1, easiest settings.

GRPO learns from groups whose rewards differ, so a dataset is a good start when the base model,
sampling at T = 1, is right sometimes. Each dataset runs at curriculum level 0 (its easiest
settings) on its held-out eval items, with the node's prompt (system prompt + 2 worked examples).

    .venv/bin/python -m benchmarks.calibrate_tasks --prompts 16
    .venv/bin/python -m benchmarks.calibrate_tasks --model gemma3-270m --datasets chain_sum,leg_counting

Easier (or harder) than level 0: ``--settings`` gives datasets their own fields, and
``--temperature 0`` measures greedy accuracy (how the expert's task was picked, docs/results.md,
"The expert for H8"):

    .venv/bin/python -m benchmarks.calibrate_tasks --temperature 0 --prompts 20 --threads 1 --max-new-tokens 96 \
        --datasets letter_counting,count_bits --settings '{"letter_counting": {"min_words": 3, "max_words": 5}}'

Prints a row per (model, dataset): accuracy (reward 1) with a 95% Wilson interval, mean reward
(partial credit included), format rate. ``--json`` keeps every completion.
"""
from __future__ import annotations

import json
import sys
import time

from benchmarks.harness import eval_args, parser, write_json
from ftis_edge import evaluate

# SAPO's nine, then three that are easy to read
DATASETS = ("base_conversion,basic_arithmetic,arc_1d,bf,propositional_logic,fraction_simplification,"
            "decimal_arithmetic,calendar_arithmetic,binary_matrix,chain_sum,leg_counting,spell_backward")


def main() -> int:
    ap = parser(__doc__)
    ap.add_argument("--models", default="smollm2-135m", help="comma-separated model specs")
    ap.add_argument("--datasets", default=DATASETS)
    ap.add_argument("--prompts", type=int, default=16, help="held-out prompts per dataset")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--temperature", type=float, default=1.0, help="0 = greedy (default %(default)s: GRPO's sampling)")
    ap.add_argument("--settings", type=json.loads, default={},
                    help='JSON: dataset -> its settings, e.g. \'{"count_bits": {"max_n": 16}}\' (default: level 0)')
    a = ap.parse_args()
    if not isinstance(a.settings, dict) or not all(isinstance(v, dict) for v in a.settings.values()):
        ap.error("--settings: a JSON object of dataset -> settings object")

    rows, runs = [], []
    for model in a.models.split(","):
        for dataset in a.datasets.split(","):
            task = (json.dumps({"name": "reasoning_gym", "options": {"datasets": {dataset: a.settings[dataset]}}})
                    if dataset in a.settings else f"reasoning_gym:{dataset}")
            args = eval_args(task=task, limit=a.prompts, model=model, temperature=a.temperature,
                             max_new_tokens=a.max_new_tokens, threads=a.threads, quiet=True)
            t0 = time.time()
            r = evaluate.evaluate(args)
            mean = sum(it["reward"] for it in r["items"]) / max(1, len(r["items"]))
            lo, hi = r["accuracy_ci95"]
            settings = json.dumps(a.settings.get(dataset, {}))
            row = (f"| {model} | {dataset} | {settings} | {r['n']} | {r['accuracy']:.1%} | {lo:.1%} – {hi:.1%} | "
                   f"{mean:.3f} | {r['format_rate']:.1%} | {r['mean_completion_tokens']:.0f} |")
            print(row + f"  ({time.time() - t0:.0f} s, {r['tok_s']:.0f} tok/s)", file=sys.stderr, flush=True)
            rows.append(row)
            runs.append(r)
    print("| model | dataset | settings | n | accuracy | 95% CI | mean reward | format ok | mean tokens |")
    print("|---|---|---|---|---|---|---|---|---|")
    print("\n".join(rows))
    write_json(a.json, runs)          # every run's summary and completions
    return 0


if __name__ == "__main__":
    sys.exit(main())
