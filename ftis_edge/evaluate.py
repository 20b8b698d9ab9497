"""`ftis-edge eval`: accuracy of a model (+ adapter) on a task, greedy by default.

    ftis-edge eval --task gsm8k --limit 100
    python -m ftis_edge.evaluate --task arith --level 2 --temperature 1 --samples 8 --json out.json

Shows a progress bar (items, tok/s, running accuracy), then a table: accuracy with a 95% Wilson
interval, format rate, mean completion length, tok/s. With ``--samples G`` it also reports the
share of prompts whose G rewards are mixed, i.e. the GRPO groups that carry a learning signal.
Heavy imports (llama.cpp, torch) happen inside ``run`` so ``--help`` stays instant.
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import time
from dataclasses import dataclass, fields, replace
from pathlib import Path

from .errors import FtisError
from .generate.registry import BACKENDS, DEFAULT
from .metrics.stats import wilson_interval
from .common.task_names import BUILTIN as TASK_NAMES
from .common.task_names import name_problem

PRECISIONS = ("f16", "quantized")


class EvalError(FtisError):
    """A user-caused problem: printed as one line, exit code 2."""


@dataclass(frozen=True)
class EvalSpec:
    """What to evaluate and how: the options of ``ftis-edge eval`` as a value (``export``
    builds one directly). ``model`` may be a run directory (its newest weights)."""
    model: str | None = None
    adapter: str | None = None
    task: str = "gsm8k"
    level: str | tuple[int, ...] | None = None      # arith: 2, "1,2,3" or (1, 2, 3)
    path: str | None = None
    limit: int | None = None
    backend: str = DEFAULT
    precision: str = "f16"
    max_new_tokens: int = 256
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0
    samples: int = 1
    require_think: bool = False
    system_prompt: str | None = None
    few_shot: int | None = None
    grade_timeout: float = 5.0
    threads: int | None = None
    batch: int = 16
    json_out: str | None = None
    quiet: bool = False

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "EvalSpec":
        return cls(**{f.name: getattr(args, f.name) for f in fields(cls) if hasattr(args, f.name)})


_D = EvalSpec()
CLI_TASK = "arith"      # `ftis-edge eval` with no --task: one that needs no download


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The eval command's options (shared by `ftis-edge eval` and `python -m ftis_edge.evaluate`)."""
    parser.add_argument("--model", default=None,
                        help="model spec: alias (smollm2-135m, gemma3-270m), .gguf file, HF dir or hub id, or a "
                             "node's run directory (runs/<id>: its base model with its newest adapter) "
                             "(default smollm2-135m)")
    parser.add_argument("--adapter", default=None,
                        help="LoRA adapter: a GGUF LoRA file (llamacpp) or a peft directory (hf)")
    parser.add_argument("--task", default=CLI_TASK, help=f"one of {', '.join(TASK_NAMES)}, reasoning_gym:<dataset>,…, "
                        f"or module:Class (default {CLI_TASK}: generated, works offline; gsm8k and math500 need "
                        "./install.sh --data; docs/tasks.md)")
    parser.add_argument("--level", default=None, help="arith only: a level or a list, e.g. 2 or 1,2,3")
    parser.add_argument("--path", default=None, help="dataset JSONL file instead of the data folder (./install.sh --data)")
    parser.add_argument("--limit", type=int, default=None,
                        help="first N prompts of the eval set (default: all; arith: 50 per level)")
    parser.add_argument("--backend", default=_D.backend, help=f"one of {', '.join(BACKENDS)} (default {DEFAULT})")
    parser.add_argument("--precision", default=_D.precision, help="llamacpp weights: f16 (default) or quantized")
    parser.add_argument("--max-new-tokens", type=int, default=_D.max_new_tokens,
                        help=f"completion length cap in tokens (default {_D.max_new_tokens})")
    parser.add_argument("--temperature", type=float, default=_D.temperature, help="0 = greedy (default)")
    parser.add_argument("--top-k", type=int, default=_D.top_k, help="0 = off")
    parser.add_argument("--top-p", type=float, default=_D.top_p, help="1 = off")
    parser.add_argument("--seed", type=int, default=_D.seed, help=f"sampling seed (default {_D.seed})")
    parser.add_argument("--samples", type=int, default=_D.samples,
                        help="completions per prompt (needs --temperature > 0 when > 1)")
    parser.add_argument("--require-think", action="store_true",
                        help="also demand <think>…</think> before <answer> (the paper's rule)")
    parser.add_argument("--system-prompt", default=None, help="replace the task's system prompt")
    parser.add_argument("--few-shot", type=int, default=None,
                        help="worked examples shown before the question (0-2; default: the task's, 2)")
    parser.add_argument("--grade-timeout", type=float, default=_D.grade_timeout,
                        help="seconds to grade one completion (own outputs: generous; default 5)")
    parser.add_argument("--threads", type=int, default=None, help="CPU threads for generation")
    parser.add_argument("--batch", type=int, default=_D.batch,
                        help="sequences decoded together, their shared prefix decoded once (llamacpp: a finished "
                             "answer's slot takes the next prompt; hf: fixed batches, 32 is faster on a CPU); "
                             "1 = one prompt at a time; default 16")
    parser.add_argument("--json", dest="json_out", default=None, help="write the results to this JSON file")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")


def summarize(items: list[dict], seconds: float) -> dict:
    """Accuracy (with CI), format rate, lengths, speed, and per-group signal from scored items."""
    n = len(items)
    k = sum(1 for it in items if it["reward"] >= 1.0)
    tokens = sum(it["tokens"] for it in items)
    lo, hi = wilson_interval(k, n)
    groups: dict[str, list[float]] = {}
    for it in items:
        groups.setdefault(it["id"], []).append(it["reward"])
    multi = [g for g in groups.values() if len(g) > 1]
    out = {
        "n": n,
        "n_prompts": len(groups),
        "accuracy": k / n if n else 0.0,
        "accuracy_ci95": [lo, hi],
        "format_rate": sum(it["format_ok"] for it in items) / n if n else 0.0,
        "answer_correct_rate": sum(it["correct"] for it in items) / n if n else 0.0,
        "timed_out": sum(it["timed_out"] for it in items),
        "mean_completion_tokens": tokens / n if n else 0.0,
        "truncated_rate": sum(it["finish_reason"] == "length" for it in items) / n if n else 0.0,
        "tok_s": tokens / seconds if seconds > 0 else 0.0,
        "seconds": seconds,
    }
    if multi:
        out["mixed_group_rate"] = sum(1 for g in multi if min(g) != max(g)) / len(multi)
        out["pass_at_k"] = sum(1 for g in multi if max(g) >= 1.0) / len(multi)
    levels = sorted({it["level"] for it in items if it.get("level") is not None})
    if levels:
        out["by_level"] = {}
        for lv in levels:
            sub = [it for it in items if it.get("level") == lv]
            out["by_level"][str(lv)] = {k2: v for k2, v in summarize(
                [dict(it, level=None) for it in sub], seconds).items()
                if k2 in ("n", "accuracy", "accuracy_ci95", "format_rate", "answer_correct_rate",
                          "mixed_group_rate", "pass_at_k", "mean_completion_tokens")}
    return out


# --- set-up --------------------------------------------------------------------------------

def _check_spec(spec: EvalSpec) -> None:
    if name_problem(spec.task):
        raise EvalError(name_problem(spec.task))
    if spec.level is not None and spec.task != "arith":
        raise EvalError("--level only applies to --task arith")
    if spec.backend not in BACKENDS:
        raise EvalError(f"unknown backend {spec.backend!r}; choose one of {', '.join(BACKENDS)}")
    if spec.precision not in PRECISIONS:
        raise EvalError(f"unknown precision {spec.precision!r}; choose one of {', '.join(PRECISIONS)}")
    if spec.limit is not None and spec.limit < 1:
        raise EvalError(f"--limit must be >= 1, got {spec.limit}")
    if spec.samples < 1:
        raise EvalError(f"--samples must be >= 1, got {spec.samples}")
    if spec.samples > 1 and spec.temperature == 0:
        raise EvalError("--samples > 1 needs --temperature > 0 (greedy gives the same answer every time)")
    if spec.batch < 1:
        raise EvalError(f"--batch must be >= 1, got {spec.batch}")
    if spec.max_new_tokens < 1:
        raise EvalError(f"--max-new-tokens must be >= 1, got {spec.max_new_tokens}")
    if not spec.temperature >= 0 or not math.isfinite(spec.temperature):
        raise EvalError(f"--temperature must be >= 0, got {spec.temperature}")
    if spec.top_k < 0 or not 0 < spec.top_p <= 1:
        raise EvalError("--top-k must be >= 0 and --top-p in (0, 1]")
    if spec.adapter is not None:
        from .generate.registry import adapter_problem
        problem = adapter_problem(spec.backend, spec.adapter)
        if problem:
            raise EvalError(f"--adapter {spec.adapter}: {problem}")
    if spec.json_out is not None:
        parent = Path(spec.json_out).expanduser().resolve().parent
        if not parent.is_dir():
            raise EvalError(f"--json {spec.json_out}: folder {parent} does not exist")


def _build_task(spec: EvalSpec):
    from .tasks import TaskError, get_task

    options = {"timeout_s": spec.grade_timeout, "require_think": spec.require_think}
    if spec.system_prompt is not None:
        options["system_prompt"] = spec.system_prompt
    if spec.few_shot is not None:
        options["few_shot"] = spec.few_shot
    if spec.task == "arith" and spec.level is not None:
        options["level"] = list(spec.level) if isinstance(spec.level, tuple) else spec.level
    if spec.path is not None:
        if spec.task == "arith":
            raise EvalError("--path does not apply to --task arith (it is generated)")
        options["path"] = spec.path
        if spec.task == "gsm8k":
            options["split"] = "test" if Path(spec.path).name.startswith("test") else "train"
    try:
        return get_task(spec.task, **options)
    except TaskError as e:
        raise EvalError(str(e)) from None


def _pool_plan(spec: EvalSpec, bundle, all_ids: list[list[int]]) -> tuple[int, int]:
    """(batch, shared): spec.batch, lowered so that the sequences decoded together fit the model's
    trained context (llama.cpp's unified cache holds them all: no n_ctx_seq > n_ctx_train), and the
    prompts' common prefix. The pool stores that prefix once, so each slot needs only its own tail
    + max_new_tokens cells: more slots fit than (whole prompt + max new) per slot would allow."""
    from .generate.loop import shared_prefix_len

    longest = max(len(ids) for ids in all_ids)
    shared = shared_prefix_len(all_ids) if len(all_ids) > 1 and spec.batch > 1 else 0
    per_slot = longest - shared + spec.max_new_tokens
    trained = bundle.n_ctx_train or 0
    if trained <= 0:
        return spec.batch, shared
    batch = max(1, min(spec.batch, (trained - shared) // (per_slot * spec.samples)))
    return batch, (shared if batch > 1 else 0)


def _build_generator(spec: EvalSpec, bundle, longest_prompt: int, batch: int, shared: int = 0):
    from .generate.base import GenerationError, GeneratorOptions
    from .generate.registry import create_generator

    # the context follows the eval: its longest prompt + the completion budget, per sequence; the
    # pool's shared prefix is stored once (``shared`` cells, not ``shared`` per slot)
    options = GeneratorOptions(precision=spec.precision, threads=spec.threads or min(os.cpu_count() or 1, 8),
                               n_ctx=longest_prompt + spec.max_new_tokens, max_group=spec.samples * batch,
                               batch_rows=spec.samples * batch, n_shared=shared, adapter=spec.adapter)
    try:
        return create_generator(spec.backend, bundle, options)
    except GenerationError as e:
        raise EvalError(str(e)) from None


# --- the run --------------------------------------------------------------------------------

def _run_dir_weights(spec: EvalSpec) -> EvalSpec:
    """``--model RUN_DIR``: the spec of the run's newest weights (its adapter on the base model,
    or its merged model as written); any other model spec is returned as it is."""
    from .store import rundir
    if not (spec.model and rundir.is_run_dir(spec.model)):
        return spec
    if spec.adapter:
        raise EvalError("--model RUN_DIR already names the run's adapter; drop --adapter")
    from .generate.registry import backend_class
    if not backend_class(spec.backend).gguf_weights:
        gguf = " or ".join(n for n in BACKENDS if backend_class(n).gguf_weights)
        raise EvalError(f"--model RUN_DIR evaluates the run's GGUF weights on {gguf}; for --backend {spec.backend}, "
                        "`ftis-edge export RUN_DIR` and pass --adapter RUN_DIR/export/peft")
    try:
        model, adapter = rundir.eval_weights(spec.model)
    except rundir.RunDirError as e:
        raise EvalError(str(e)) from None
    # a merged model is used as written (F32): no F16 re-export of it
    return replace(spec, model=model, adapter=adapter, precision=spec.precision if adapter else "quantized")


def evaluate(spec: EvalSpec | argparse.Namespace, console=None) -> dict:
    """Generate and score; returns the result dict that ``--json`` writes. A parsed command line
    is read into an ``EvalSpec`` once, here; nothing changes it afterwards."""
    from .tasks import warm_up

    if not isinstance(spec, EvalSpec):
        spec = EvalSpec.from_args(spec)
    _check_spec(spec)
    task = _build_task(spec)
    prompts = task.eval_prompts(spec.limit)
    if not prompts:
        raise EvalError(f"task {spec.task} has no eval prompts")
    spec = _run_dir_weights(spec)
    bundle, all_ids, gen, batch = _load_model(spec, task, prompts)
    warm_up()

    t0 = time.perf_counter()
    with _progress(console, spec.quiet) as bar:
        grader = _Grader(spec, task, prompts, bar)
        try:
            _generate(gen, all_ids, prompts, _samplers(spec, len(prompts)), spec.samples, batch, grader)
        finally:
            grader.stop()
    items = grader.items_in_order()
    gen.close()
    summary = summarize(items, grader.gen_seconds)
    summary["tok_s"] = grader.tokens / max(grader.gen_seconds, 1e-9)
    summary["wall_seconds"] = time.perf_counter() - t0
    return _result(spec, task, bundle, gen, summary, items)


def _load_model(spec: EvalSpec, task, prompts):
    """The model, every prompt's token ids, and a generator sized for them (how many decode
    together, the prefix they share); a model that cannot be had is an ``EvalError``."""
    from .models.resolve import ModelError, resolve_model
    try:
        bundle = resolve_model(spec.model)
        all_ids = [bundle.encode(bundle.render_prompt(task.messages(p.question))) for p in prompts]
        longest = max(len(ids) for ids in all_ids)
        batch, shared = _pool_plan(spec, bundle, all_ids)
        gen = _build_generator(spec, bundle, longest, batch, shared)
    except ModelError as e:
        raise EvalError(str(e)) from None
    return bundle, all_ids, gen, batch


def _samplers(spec: EvalSpec, n: int) -> list:
    """One sampler per prompt, seeded by its place (the same answers whatever order they finish in)."""
    from .generate.base import SamplerSettings
    return [SamplerSettings(temperature=spec.temperature, top_k=spec.top_k, top_p=spec.top_p,
                            max_new_tokens=spec.max_new_tokens, seed=spec.seed + i) for i in range(n)]


def _progress(console, quiet: bool):
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    columns = [TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
               TextColumn("{task.fields[tok_s]:.0f} tok/s"), TextColumn("acc {task.fields[acc]:.1%}"),
               TimeElapsedColumn()]
    return Progress(*columns, console=console or Console(stderr=True), disable=quiet, transient=False)


class _Grader:
    """Grades a prompt's completions when the generator hands them over (in any order: continuous
    batching), keeps the items and the bar's tokens/s and accuracy; the seconds spent grading inside
    the generation call are kept apart, so tokens/s counts generation only."""

    def __init__(self, spec: EvalSpec, task, prompts, bar):
        self.spec, self.task, self.prompts, self.bar = spec, task, prompts, bar
        self.job = bar.add_task(f"{spec.task}", total=len(prompts), tok_s=0.0, acc=0.0)
        self.items: list[dict] = []
        self.tokens = 0
        self.grading_s = 0.0
        self.gen_seconds = 0.0
        self.started = time.perf_counter()

    def __call__(self, i: int, completions) -> None:
        r0 = time.perf_counter()
        p = self.prompts[i]
        for c in completions:
            value, b = self.task.reward(c.text, p.reference)
            self.tokens += len(c.token_ids)
            self.items.append({"id": p.id, "level": p.meta.get("level") if self.spec.task == "arith" else None,
                               "reference": p.reference, "answer": b["answer"], "reward": value,
                               "format_ok": b["format_ok"], "correct": b["correct"],
                               "timed_out": b["timed_out"], "reason": b["reason"],
                               "tokens": len(c.token_ids), "finish_reason": c.finish_reason,
                               "text": c.text, "_order": i})
        acc = sum(it["reward"] >= 1.0 for it in self.items) / len(self.items)
        self.grading_s += time.perf_counter() - r0
        tok_s = self.tokens / max(time.perf_counter() - self.started - self.grading_s, 1e-9)
        self.bar.update(self.job, advance=1, tok_s=tok_s, acc=acc)

    def stop(self) -> None:
        self.gen_seconds = time.perf_counter() - self.started - self.grading_s

    def items_in_order(self) -> list[dict]:
        """The items in the prompts' order, whatever finished first."""
        self.items.sort(key=lambda it: it.pop("_order"))
        return self.items


def _generate(gen, all_ids, prompts, samplers, samples: int, batch: int, grade) -> None:
    """Every prompt's completions, handed to ``grade`` as they finish: one prompt at a time
    (batch 1), else continuous batching (``batch`` sequences decode together, refilled as they end)."""
    from .generate.base import GenerationError
    if batch == 1:
        for i, s in enumerate(samplers):
            try:
                grade(i, gen.generate(all_ids[i], samples, s))
            except GenerationError as e:
                raise EvalError(f"{prompts[i].id}: {e}") from None
        return
    try:
        gen.generate_many(all_ids, samples, samplers, on_done=grade)
    except GenerationError as e:
        raise EvalError(f"{prompts[0].id}..{prompts[-1].id}: {e}") from None


def _result(spec: EvalSpec, task, bundle, gen, summary: dict, items: list[dict]) -> dict:
    """What ``--json`` writes: the settings the answers came from, the summary, every item."""
    return {
        "task": spec.task,
        "level": list(getattr(task, "levels", [])) or None,
        "model": bundle.spec,
        "model_fingerprint": bundle.fingerprint,
        "adapter": spec.adapter,
        "backend": spec.backend,
        "precision": gen.precision,
        "sampler": {"temperature": spec.temperature, "top_k": spec.top_k, "top_p": spec.top_p,
                    "max_new_tokens": spec.max_new_tokens, "seed": spec.seed},
        "samples_per_prompt": spec.samples,
        "few_shot": task.few_shot,
        "reward": {"mode": task.reward_settings.mode, "require_think": task.reward_settings.require_think},
        **summary,
        "items": items,
    }


def print_table(result: dict, console=None) -> None:
    """The summary table (and one row per arith level)."""
    from rich.console import Console
    from rich.table import Table

    from .common.text_safety import shown
    console = console or Console()
    # the model and adapter are paths from disk (a folder's name may carry markup): printed inert
    title = (f"{shown(result['task'], markup=True)} · {shown(result['model'], markup=True)}"
             + (f" + {shown(result['adapter'], markup=True)}" if result["adapter"] else "")
             + f" · {result['backend']}/{result['precision']} · T={result['sampler']['temperature']}"
             + (f" · G={result['samples_per_prompt']}" if result["samples_per_prompt"] > 1 else ""))
    table = Table(title=title)
    grouped = result["samples_per_prompt"] > 1
    for col in ["set", "n", "accuracy", "95% CI", "format ok", "answer ok", "mean tokens"] + \
               (["mixed groups", "pass@G"] if grouped else []):
        table.add_column(col, justify="right" if col != "set" else "left")

    def row(name, r):
        lo, hi = r["accuracy_ci95"]
        cells = [name, str(r["n"]), f"{r['accuracy']:.1%}", f"{lo:.1%} – {hi:.1%}",
                 f"{r['format_rate']:.1%}", f"{r['answer_correct_rate']:.1%}",
                 f"{r['mean_completion_tokens']:.0f}"]
        if grouped:
            cells += [f"{r.get('mixed_group_rate', 0):.1%}", f"{r.get('pass_at_k', 0):.1%}"]
        table.add_row(*cells)

    for lv, r in (result.get("by_level") or {}).items():
        row(f"level {lv}", r)
    row("all", result)
    console.print(table)
    console.print(f"{result['tok_s']:.1f} tok/s · {result['seconds']:.0f} s generating · "
                  f"{result['timed_out']} grading time-outs · truncated {result['truncated_rate']:.0%}")


def run(args) -> int:
    """Entry point of `ftis-edge eval`: 0 on success, 2 (one line on stderr) for bad input."""
    import orjson

    try:
        spec = EvalSpec.from_args(args)
        result = evaluate(spec)
    except EvalError as e:        # names a model folder, a file: each line printed inert
        from .common.text_safety import shown
        print("ftis-edge eval: error: " + "\n".join(shown(ln) for ln in str(e).split("\n")), file=sys.stderr)
        return 2
    except FtisError as e:        # a run directory's checkpoint, model or config: one line, no traceback
        from .errors import one_line
        from .common.text_safety import shown
        print(f"ftis-edge eval: error: {shown(one_line(e))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("ftis-edge eval: interrupted", file=sys.stderr)
        return 130
    print_table(result)
    if spec.json_out:
        Path(spec.json_out).expanduser().write_bytes(orjson.dumps(result, option=orjson.OPT_INDENT_2))
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ftis_edge.evaluate",
                                     description="Accuracy of a model (+ adapter) on a task.")
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
