"""Will it fit? fit.py's estimate against the measured peak RSS of real node processes.

For each case (SmolLM2-135M and Gemma 3 270M, LoRA on llama.cpp; SmolLM2 full fine-tuning on hf),
start a real node (``ftis-edge start --headless``, one round, alone, the default task sizes) and
read its peak resident size from ``os.wait4`` (ru_maxrss; warm model cache, so no one-off
conversion is in it). ``task.max_completion_length`` is 32 by default, which nearly every completion
reaches, so the estimate at the configured lengths (what the node's preflight says) and the one at the
lengths the run really had nearly coincide; with --max-new 128 (the default config) the first is an
upper bound (completions end early) and the second is what the ±25% check compares. Also an idle process that imports what a node imports (the estimator's
``RUNTIME_BYTES``), and, on paper, the parameter counts fit.py derives from the published shapes
of Qwen2.5-0.5B/1.5B/3B and Llama-3.2-1B/3B against their model cards, with their estimates.

Run: .venv/bin/python -m benchmarks.bench_fit [--rounds 1] [--only smollm2-135m] [--json PATH]
"""
from __future__ import annotations

import json
import os
import subprocess
import tempfile
import sys
import tempfile
from pathlib import Path

from dataclasses import replace

from benchmarks.harness import ROOT, parser, write_json
from ftis_edge import config
from ftis_edge.learn import fit
from ftis_edge.metrics.records import read_rounds

CASES = {
    "smollm2-135m lora llamacpp": {"model": {"spec": "smollm2-135m"}},
    "gemma3-270m lora llamacpp": {"model": {"spec": "gemma3-270m"}},
    "smollm2-135m full hf": {"model": {"spec": "smollm2-135m", "backend": "hf"},
                             "train": {"trainable": "full", "learning_rate": 5e-6}},
}
# parameters on the model cards (Hugging Face), for the on-paper check of shape_from_hf_config
PUBLISHED = {"SmolLM2-135M": 134.5e6, "Gemma-3-270M": 268.1e6, "Qwen2.5-0.5B": 494e6, "Llama-3.2-1B": 1.24e9,
             "Qwen2.5-1.5B": 1.54e9, "Llama-3.2-3B": 3.21e9, "Qwen2.5-3B": 3.09e9}
IMPORTS = ("import torch, transformers, peft, llama_cpp, zmq, numpy; "
           "import ftis_edge.run.node, ftis_edge.learn.learner, ftis_edge.generate.llamacpp, ftis_edge.tasks.grader; "
           "from ftis_edge.models.resolve import resolve_model; resolve_model('smollm2-135m').tokenizer()")


def peak_rss(argv: list[str]) -> tuple[int, int]:
    """(peak resident bytes, exit status) of a child process (ru_maxrss is in KiB on Linux)."""
    # stderr to a file, not a pipe: a node that logs more than a pipe holds would block on it
    # while we wait for it to exit
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=err)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode:
            err.seek(0)
            sys.stderr.write(err.read().decode(errors="replace")[-2000:])
    return usage.ru_maxrss * 1024, proc.returncode


def measure_case(name: str, sections: dict, work: Path, rounds: int) -> dict:
    """Run one real node; what it measured: peak RSS, its first-round prompt, its completions' mean length."""
    data = {s: dict(v) for s, v in sections.items()}
    data.setdefault("node", {}).update({"id": "-".join(name.split()), "run_dir": str(work / "{id}"),
                                        "rounds": rounds, "checkpoint_every": 1000})
    data.setdefault("model", {})["threads"] = 2
    data.setdefault("eval", {})["every"] = 0      # the eval shares the loaded generator: no memory of its own
    cfg = config.from_dict(data)
    path = work / f"{cfg.node.id}.toml"
    path.write_text(config.to_toml(cfg, comments=False))
    from ftis_edge.models.resolve import resolve_model
    from ftis_edge.run.preflight import longest_first_prompt
    from ftis_edge.tasks import get_task
    bundle = resolve_model(cfg.model.spec)
    task = get_task(cfg.task.name, few_shot=cfg.task.few_shot, reward=cfg.task.reward)
    rss, rc = peak_rss([sys.executable, "-m", "ftis_edge.cli", "start", str(path), "--headless"])
    rounds_done = read_rounds(cfg.run_path)
    return {"case": name, "sections": data, "measured": rss, "rc": rc,
            "prompt": longest_first_prompt(cfg, bundle, task),
            "mean_completion": max((r.get("completions/mean_length") or 0) for r in rounds_done) if rounds_done else 0}


def exit_note(m: dict) -> str:
    return f" (node exit {m['rc']})" if m["rc"] else ""


def estimates(m: dict) -> tuple[fit.Estimate, fit.Estimate]:
    """fit.py's estimate for a measured case: at the configured lengths (what the node's preflight
    says, compared with the measurement) and at the mean length its completions really had."""
    from ftis_edge.models.resolve import resolve_model
    cfg = config.from_dict(m["sections"])
    setup = fit.Setup.from_config(cfg, device="cpu", prompt_tokens=m["prompt"])
    shape = fit.shape_of(resolve_model(cfg.model.spec))
    real = replace(setup, completion_tokens=max(1, round(m["mean_completion"])))
    return fit.estimate(shape, setup), fit.estimate(shape, real)


def main(argv=None) -> int:
    ap = parser(__doc__)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--max-new", type=int, default=32,
                    help="task.max_completion_length (default 32: nearly every completion reaches it, so the "
                         "estimate at the configured lengths is the one compared)")
    ap.add_argument("--only", action="append", help="run only cases whose name contains this")
    ap.add_argument("--measured", type=Path, nargs="+",
                    help="re-estimate saved measurements (--json files) instead of running nodes")
    args = ap.parse_args(argv)
    GB = fit.GB
    if args.measured:
        saved = [json.loads(p.read_text()) for p in args.measured]
        runtime, rows = max(x["runtime"] for x in saved), [c for x in saved for c in x["cases"]]
    else:
        runtime, _ = peak_rss([sys.executable, "-c", IMPORTS])
        rows = []
        with tempfile.TemporaryDirectory(prefix="bench_fit-") as tmp:
            for name, sections in CASES.items():
                if not args.only or any(o in name for o in args.only):
                    sections = {**sections, "task": {"max_completion_length": args.max_new}}
                    rows.append(measure_case(name, sections, Path(tmp), args.rounds))
                    print(f"measured {name}: {rows[-1]['measured'] / GB:.2f} GB", file=sys.stderr, flush=True)
        write_json(args.json, {"runtime": runtime, "cases": rows})
    print(f"idle process with a node's imports + tokenizer: peak RSS {runtime / GB:.2f} GB "
          f"(fit.RUNTIME_BYTES = {fit.RUNTIME_BYTES / GB:.2f} GB: that + allocator and thread arenas)")
    print("\nestimate: at the configured lengths (what the node says at start: every completion at max new);"
          "\nat mean: at the mean length the run's completions had; ratios are estimate / measured, ±25% on 'at mean'")
    print(f"\n{'case':<28}{'prompt':>7}{'max new':>8}{'mean new':>9}{'estimate':>9}{'at mean':>8}{'measured':>10}"
          f"{'ratio':>7}{'at mean':>8}  ±25%")
    bad = []
    for m in rows:
        upper, real = estimates(m)
        ratio, ratio_real = upper.ram_bytes / m["measured"], real.ram_bytes / m["measured"]
        ok = abs(ratio_real - 1) <= 0.25 and not m["rc"]
        bad += [] if ok else [m["case"]]
        max_new = m["sections"].get("task", {}).get("max_completion_length", 128)
        print(f"{m['case']:<28}{m['prompt']:>7}{max_new:>8}{m['mean_completion']:>9.0f}{upper.ram_bytes / GB:>8.2f}G"
              f"{real.ram_bytes / GB:>7.2f}G{m['measured'] / GB:>9.2f}G{ratio:>7.2f}{ratio_real:>8.2f}  "
              f"{'yes' if ok else 'NO'}{exit_note(m)}")
        print(f"{'':<28}{upper.line()}")
    print("\non paper (published shapes; default settings: G 8, 128 new tokens, micro-batch 8, prompt "
          f"{fit.DEFAULT_PROMPT_TOKENS}, CPU, llama.cpp F16 generator):")
    print(f"{'model':<15}{'params (fit)':>13}{'model card':>12}{'LoRA RAM':>10}{'full RAM':>10}")
    for name, shape_cfg in fit.KNOWN_SHAPES.items():
        shape = fit.shape_from_hf_config(shape_cfg, name)
        lora = fit.estimate(shape, fit.Setup(trainable="lora")).ram_bytes
        full = fit.estimate(shape, fit.Setup(trainable="full")).ram_bytes
        print(f"{name:<15}{shape.n_params / 1e9:>12.3f}B{PUBLISHED[name] / 1e9:>11.3f}B{lora / GB:>9.1f}G{full / GB:>9.1f}G")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
