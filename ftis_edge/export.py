"""`ftis-edge export RUN_DIR`: a trained node's weights in forms people use elsewhere.

From the run's last checkpoint (so it works the same for LoRA and full fine-tuning, llama.cpp and
HF backends) it writes into ``--to`` (default ``RUN_DIR/export``)::

    peft/               LoRA: adapter_config.json + adapter_model.safetensors (PeftModel.from_pretrained)
    hf/                 full fine-tuning: the model as a transformers directory (+ tokenizer)
    adapter.gguf        LoRA: the GGUF LoRA adapter for llama.cpp (--lora)
    model-f16.gguf      the merged model, F16
    model-<quant>.gguf  the merged model quantized by llama.cpp (q8_0, q4_k_m); from an F32 export
    Modelfile           for Ollama: FROM the quantized GGUF, chat template and stop tokens
    README.md           model card: base model + fingerprint, rounds, method, reward curve, eval
    export.json         the same facts, machine-readable

What it reads of the run directory (its config, its checkpoint) comes from ``rundir`` and
``checkpoint``; the held-out eval is ``evaluate`` with an ``EvalSpec``.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from .store import rundir
from .errors import FtisError
from .metrics.best import BASE_ROUND
from .common.turns import PLAIN_TURN_STOP

QUANTS = ("f16", "q8_0", "q4_k_m")
AUTO = "auto"                 # --quant's default: chosen by the model's size (default_quant)
# Below this many parameters the shipped file is Q8_0: on a SmolLM2-135M run (benchmarks/quant_cost.py,
# 50 held-out arith prompts, paired against F16) Q4_K_M lost 4 answers and gained none, -8.0 points
# (95% interval -15.5 to -0.5), Q8_0 -4.0 (-9.4 to +1.4; 2 lost): 4 bits cost a small model more than
# a short run gains; larger models have the redundancy that ~4.5 bits per weight keeps (docs/bridge.md).
SMALL_MODEL_PARAMS = 1_000_000_000


def default_quant(n_params: int) -> str:
    """The shipped quantisation for a model of ``n_params`` parameters: q8_0 for a small model,
    q4_k_m from SMALL_MODEL_PARAMS up."""
    return "q8_0" if n_params < SMALL_MODEL_PARAMS else "q4_k_m"
LOG_NAME = "export.log"       # llama.cpp's loader and quantizer output, warnings


class ExportError(FtisError):
    """The run cannot be exported; the message is one readable line."""


# --- reading a run ------------------------------------------------------------------------------

def _span(first: int, last: int) -> str:
    return str(first) if first == last else f"{first}–{last}"


def _reward_curve(run_dir: Path, points: int = 10) -> list[dict]:
    """Mean reward of own groups over ~``points`` equal spans of rounds (from metrics.jsonl)."""
    from .metrics.records import read_metrics
    rows = [(rec["round"], rec["reward/own"]) for rec in read_metrics(run_dir)
            if "round" in rec and rec.get("reward/own") is not None]
    if not rows:
        return []
    size = max(1, -(-len(rows) // points))
    return [{"rounds": _span(chunk[0][0], chunk[-1][0]), "reward": sum(r for _, r in chunk) / len(chunk)}
            for chunk in (rows[i:i + size] for i in range(0, len(rows), size))]


# --- the Ollama Modelfile -------------------------------------------------------------------------

_TEMPLATES = {   # Ollama (Go template) spellings of the chat formats our models use
    "chatml": ('{{ if .System }}<|im_start|>system\n{{ .System }}<|im_end|>\n{{ end }}'
               '{{ if .Prompt }}<|im_start|>user\n{{ .Prompt }}<|im_end|>\n{{ end }}'
               '<|im_start|>assistant\n{{ .Response }}<|im_end|>\n', ["<|im_end|>"]),
    "gemma": ('<start_of_turn>user\n{{ if .System }}{{ .System }}\n\n{{ end }}{{ .Prompt }}<end_of_turn>\n'
              '<start_of_turn>model\n{{ .Response }}<end_of_turn>\n', ["<end_of_turn>"]),
    "llama3": ('{{ if .System }}<|start_header_id|>system<|end_header_id|>\n\n{{ .System }}<|eot_id|>{{ end }}'
               '<|start_header_id|>user<|end_header_id|>\n\n{{ .Prompt }}<|eot_id|>'
               '<|start_header_id|>assistant<|end_header_id|>\n\n{{ .Response }}<|eot_id|>', ["<|eot_id|>"]),
    "phi3": ('{{ if .System }}<|system|>\n{{ .System }}<|end|>\n{{ end }}<|user|>\n{{ .Prompt }}<|end|>\n'
             '<|assistant|>\n{{ .Response }}<|end|>\n', ["<|end|>"]),
    # models without a chat template: ModelBundle.render_prompt's plain format
    "plain": ('{{ if .System }}System: {{ .System }}\n\n{{ end }}User: {{ .Prompt }}\n\nAssistant:{{ .Response }}',
              [PLAIN_TURN_STOP]),     # where the node's generator stops too
}


def chat_format(chat_template: str | None) -> str:
    t = chat_template or ""
    for marker, name in (("<|im_start|>", "chatml"), ("<start_of_turn>", "gemma"),
                         ("<|start_header_id|>", "llama3"), ("<|user|>", "phi3")):
        if marker in t:
            return name
    return "plain"


def modelfile(gguf_name: str, bundle, context: list[dict], temperature: float) -> str:
    """Ollama Modelfile; ``context`` = the task's system prompt and worked examples, as in training."""
    template, stops = _TEMPLATES[chat_format(getattr(bundle.tokenizer(), "chat_template", None))]
    stops = list(stops)
    for i in bundle.eos_token_ids:
        text = bundle.decode([i])
        if text and text not in stops:
            stops.append(text)
    lines = [f"FROM ./{gguf_name}", f'TEMPLATE """{template}"""']
    for m in context:
        if m["role"] == "system":
            lines.append(f'SYSTEM """{m["content"]}"""')
        else:
            lines.append(f'MESSAGE {m["role"]} """{m["content"]}"""')
    lines += [f"PARAMETER stop {json.dumps(s)}" for s in stops]
    lines.append(f"PARAMETER temperature {temperature:g}")
    return "\n".join(lines) + "\n"


# --- the export -------------------------------------------------------------------------------------

def _latest_state(run_dir: Path) -> dict:
    """The run's newest verified checkpoint (read before any model loads: a bad one fails fast)."""
    from .store import checkpoint
    state = checkpoint.load_latest(run_dir)
    if state is None:
        raise ExportError(f"{run_dir} has no checkpoint yet (the node writes one every "
                          f"node.checkpoint_every rounds and at the end)")
    return state


def _learner_from_checkpoint(state: dict, cfg, bundle, run_dir: Path):
    from .store import checkpoint
    from .learn.learner import Learner

    learner = Learner(bundle, trainable=cfg.train.trainable, lora_r=cfg.train.lora_r,
                      lora_alpha=cfg.train.lora_alpha, lora_dropout=cfg.train.lora_dropout,
                      lora_targets=tuple(bundle.lora_targets(cfg.train.lora_targets)), seed=cfg.node.seed,
                      device="cpu")
    checkpoint.into_learner(learner, state["learner"], run_dir)
    return learner, state["round"]


def _eval(cfg, model: str, precision: str, limit: int, threads: int | None) -> dict:
    from . import evaluate
    from .tasks import task_spec
    spec = evaluate.EvalSpec(model=model, task=task_spec(cfg.task), limit=limit, precision=precision,
                             max_new_tokens=cfg.task.max_completion_length, few_shot=cfg.task.few_shot,
                             level=tuple(cfg.task.level) if cfg.task.name == "arith" and cfg.task.level else None,
                             path=cfg.task.path if cfg.task.path and cfg.task.name in ("gsm8k", "math500") else None,
                             require_think=cfg.task.require_think,
                             threads=threads or None, quiet=True)
    try:
        r = evaluate.evaluate(spec)
    except evaluate.EvalError as e:
        raise ExportError(f"eval of {model}: {e}") from None
    out = {k: r[k] for k in ("n", "accuracy", "accuracy_ci95", "format_rate", "mean_completion_tokens")}
    # right or wrong per prompt, in the prompts' order: two files compared on the same prompts (paired)
    out["correct"] = [it["reward"] >= 1.0 for it in r["items"]]
    return out


def paired(now: dict, ref: dict) -> dict:
    """``now`` − ``ref`` accuracy on the same greedy prompts, with its 95% interval: only prompts
    whose answer changed add noise (metrics.stats.paired_change), so this is far tighter than two
    separate intervals."""
    from .metrics.stats import paired_change
    c = paired_change(now["correct"], ref["correct"])
    lo, hi = c.interval
    return {"diff": c.diff, "interval": [lo, hi], "lost": c.lost, "gained": c.gained, "n": c.n}


def change_words(change: dict, against: str) -> str:
    """A paired change in words: ``-2.0 points against F16 on the same 50 prompts (95% interval
    -6.1 to +2.1; 3 answers lost, 2 gained)``, or that no answer changed."""
    if change["lost"] == change["gained"] == 0:
        return f"the same answers as {against} on all {change['n']} prompts"
    lo, hi = change["interval"]
    return (f"{100 * change['diff']:+.1f} points against {against} on the same {change['n']} prompts (95% interval "
            f"{100 * lo:+.1f} to {100 * hi:+.1f}; {change['lost']} answers lost, {change['gained']} gained)")


K_BLOCK = 256      # llama.cpp's k-quants (Q4_K ...) quantize rows in super-blocks of 256 weights


def quant_summary(path: Path, quant: str) -> dict:
    """What a quantized GGUF really holds: bits per weight over all tensors, tensors per type,
    and why some are not the requested type (llama.cpp's "fallback quantization")."""
    import gguf
    tensors = gguf.GGUFReader(path).tensors
    weights = sum(int(t.n_elements) for t in tensors)
    counts: dict[str, int] = {}
    for t in tensors:
        counts[t.tensor_type.name] = counts.get(t.tensor_type.name, 0) + 1
    fallback: dict[str, int] = {}
    if quant.endswith(("_k_m", "_k_s")):
        for t in tensors:
            if len(t.shape) >= 2 and int(t.shape[0]) % K_BLOCK:
                fallback[t.tensor_type.name] = fallback.get(t.tensor_type.name, 0) + 1
    return {"bits_per_weight": round(8 * sum(int(t.n_bytes) for t in tensors) / max(weights, 1), 2),
            "tensor_types": _by_count(counts), "fallback": _by_count(fallback)}


def _by_count(counts: dict[str, int]) -> dict[str, int]:
    return dict(sorted(counts.items(), key=lambda kv: -kv[1]))


def _listing(counts: dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in counts.items())


def quant_line(q: dict) -> str:
    """The quantized file in one line, e.g. ``6.17 bits/weight (Q5_0 180, Q4_K 60, ...)``."""
    line = f"{q['file']}: {q['bits_per_weight']:.2f} bits/weight on average (tensors: {_listing(q['tensor_types'])})"
    if q["fallback"]:
        line += (f"; {sum(q['fallback'].values())} tensors have rows that are not a multiple of {K_BLOCK}, which "
                 f"k-quants need, so llama.cpp stored them as {_listing(q['fallback'])} "
                 f"(its 'fallback quantization')")
    return line


class _Steps:
    """Runs the export's steps: one line each to ``log`` with its time; what llama.cpp and the
    libraries print goes to the ``noise`` file (export.log)."""

    def __init__(self, noise: Path, log):
        self.noise, self.log = noise, log

    def __call__(self, title: str, fn, *args):
        from .run.logs import output_to
        t0 = time.time()
        with output_to(self.noise):
            result = fn(*args)
        self.log(f"{title} ({time.time() - t0:.1f} s)")
        return result


def _own_format(learner, bundle, out: Path, files: dict) -> None:
    """The trainer's own format: PEFT + GGUF LoRA adapter, or the full HF model (+ tokenizer)."""
    from .models.gguf_io import write_gguf_lora
    if learner.trainable == "lora":
        learner.model.save_pretrained(out / "peft")
        files["peft"] = "peft/"
        files["adapter"] = write_gguf_lora(learner.model, out / "adapter.gguf", arch=bundle.arch,
                                           n_head=bundle.n_head, n_head_kv=bundle.n_head_kv).name
    else:
        learner.model.save_pretrained(out / "hf")
        bundle.tokenizer().save_pretrained(out / "hf")
        files["hf"] = "hf/"


def _merged_f16(learner, base: Path, out: Path) -> str:
    from .models.gguf_io import export_merged_gguf
    return export_merged_gguf(learner.model, base, out / "model-f16.gguf", dtype="f16").name


def _quantized(learner, base: Path, out: Path, quant: str) -> str:
    """model-<quant>.gguf, quantized from an F32 export: one full fine-tuning step is often below
    F16's resolution (docs/bridge.md)."""
    from .models.gguf_io import export_merged_gguf, quantize_gguf
    f32 = export_merged_gguf(learner.model, base, out / ".model-f32.gguf", dtype="f32")
    try:
        return quantize_gguf(f32, out / f"model-{quant}.gguf", quant).name
    finally:
        f32.unlink(missing_ok=True)


def _restore_weights(state: dict, cfg, bundle, run_dir: Path, best: dict | None):
    """(learner, newest round): the newest checkpoint restored, then the kept best weights put in."""
    learner, rounds = _learner_from_checkpoint(state, cfg, bundle, run_dir)
    if best is not None:
        _use_weights(learner, best.pop("trainable"))
    return learner, rounds


def _same_shapes(best: dict, newest: dict) -> None:
    """The kept best weights against the newest checkpoint's (the model's trainable tensors, as
    the learner saved them), before any model loads: the same names, exactly the same shapes."""
    if set(best) != set(newest):
        raise ExportError("the kept best weights do not match the model (other tensor names: another trainable "
                          "mode or LoRA targets?); export the newest with --latest")
    wrong = [n for n in newest if tuple(best[n].shape) != tuple(newest[n].shape)]
    if wrong:
        n = wrong[0]
        raise ExportError(f"the kept best weights do not fit the model: {len(wrong)} tensors have other shapes "
                          f"(one is {tuple(best[n].shape)}, the model's {tuple(newest[n].shape)}); export the "
                          f"newest checkpoint with --latest")


def _use_weights(learner, weights: dict) -> None:
    """Put the best eval's trainable weights (checkpoint.save_best) into a restored learner."""
    import torch
    own = learner.trainable_state()
    _same_shapes(weights, own)      # exactly the model's: copy_ would broadcast a (1,) tensor into every matrix
    with torch.no_grad():
        for name, p in own.items():
            p.copy_(weights[name].to(p.device, p.dtype))


def _held_out_history(run_dir: Path) -> dict:
    """Base, best and latest held-out evals as metrics.jsonl recorded them ({} for a run without)."""
    from .metrics.best import from_records
    from .metrics.records import read_metrics, round_records
    records = read_metrics(run_dir)
    evals = [r for r in round_records(records) if _fraction(r.get("eval/accuracy"))]
    base = next((r for r in records if _fraction(r.get("eval/base_accuracy"))), None)
    if not evals and base is None:
        return {}

    def row(rec, key="eval/accuracy", lo="eval/accuracy_lo", hi="eval/accuracy_hi", rnd=None):
        n = rec.get("eval/n")       # numbers only: the card prints them
        return {"round": _whole(rec.get("eval/round", rec.get("round"))) if rnd is None else rnd,
                "accuracy": rec.get(key), "interval": [v if _fraction(v) else None for v in (rec.get(lo), rec.get(hi))],
                "n": _whole(n)}
    out = {}
    if base is not None:
        out["base"] = row(base, "eval/base_accuracy", "eval/base_lo", "eval/base_hi", rnd=0)
    if evals:
        out["latest"] = row(evals[-1])
        best = from_records(records)      # the one rule (best.py), as the node and the dashboard
        if best is not None:
            out["beat_base"] = best.beat_base
            rec = next((r for r in evals if r.get("eval/round", r.get("round")) == best.round), evals[-1])
            out["best"] = dict(out["base"]) if not best.beat_base and "base" in out else row(rec)
    return out


def _fraction(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and 0.0 <= v <= 1.0


def _whole(v) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def export_run(run_dir, to=None, *, quant: str = AUTO, eval_limit: int = 50, threads: int | None = None,
               log=print, latest: bool = False) -> dict:
    """Write every artefact listed in the module docstring; returns what export.json holds.

    The weights: the best held-out eval's that the node kept (``checkpoints/best-NNNNNN``), or the
    newest checkpoint's with ``latest`` (or when the run kept none: eval off, an older run).
    ``log`` gets one line per step; what llama.cpp and the libraries print goes to
    ``export.log`` in the output directory."""
    from .store import checkpoint
    from .models.gguf_io import GGUFError
    from .models.resolve import ModelError, resolve_model

    if quant not in (AUTO, *QUANTS):
        raise ExportError(f"--quant must be one of {', '.join((AUTO, *QUANTS))}, got {quant!r}")
    from .common.text_safety import shown
    say = log
    log = lambda line: say(shown(line))      # noqa: E731 - a shared run names its model folder: printed inert
    run_dir = Path(run_dir).expanduser()
    if not rundir.is_run_dir(run_dir):
        raise ExportError(f"{run_dir} is not a run directory (no {rundir.CONFIG_FILE})")
    cfg = rundir.load_config(run_dir)
    from .store.resume_check import checkpoint_changes
    changed = checkpoint_changes(run_dir, cfg)
    if changed:
        raise ExportError(f"{(run_dir / rundir.CONFIG_FILE).resolve()} differs from the settings the run's "
                          f"checkpoints were made with ({'; '.join(changed)}): put them back to export this run")
    state = _latest_state(run_dir)
    best = None if latest else checkpoint.load_best(run_dir)
    if best is not None:
        _same_shapes(best["trainable"], (state.get("learner") or {}).get("trainable") or {})
    if best is not None and best["round"] == BASE_ROUND:     # best.py: no eval beat the base model
        base_only, best = best, None
    else:
        base_only = None
    weights = _weights_line(state["round"], best, latest, base_only)
    log(weights["line"])
    out = Path(to).expanduser() if to else run_dir / "export"
    _writable(out, default=to is None)
    noise = out / LOG_NAME
    step = _Steps(noise, log)

    files = {}
    try:
        bundle = step(f"loaded {cfg.model.spec}", resolve_model, cfg.model.spec)
        bundle.require_supported()
        if quant == AUTO:
            from .learn.fit import shape_of
            n_params = shape_of(bundle).n_params
            quant = default_quant(n_params)
            log(f"quantisation {quant}: the default for a model of {n_params / 1e6:,.0f}M parameters (q8_0 below "
                f"{SMALL_MODEL_PARAMS / 1e9:g}B, where 4-bit files cost a small model its training; --quant chooses)")
        restored = (f"restored the weights of round {weights['round']}"
                    + (f" (the best held-out eval's; the newest checkpoint is round {state['round']})"
                       if best is not None else ""))
        learner, rounds = step(restored, _restore_weights, state, cfg, bundle, run_dir, best)
        del state
        step("wrote " + ("peft/ and adapter.gguf" if learner.trainable == "lora" else "hf/"),
             _own_format, learner, bundle, out, files)
        base = step("found the base GGUF", bundle.base_gguf)
        files["f16"] = step("wrote model-f16.gguf (the merged model, F16)", _merged_f16, learner, base, out)
        quantized = None
        if quant != "f16":
            files[quant] = step(f"wrote model-{quant}.gguf (llama.cpp's quantizer)", _quantized, learner, base, out,
                                quant)
            quantized = {"file": files[quant], **quant_summary(out / files[quant], quant)}
            log(quant_line(quantized))
    except (ModelError, GGUFError) as e:
        raise ExportError(f"{e} (llama.cpp's output: {noise})") from None
    shipped = files[quant]
    from .tasks import TaskError, task_from_config
    try:
        task = task_from_config(cfg.task)
        context = task.messages("")[:-1]
    except TaskError:       # the dataset is not on this machine: no worked examples in the Modelfile
        context = []
    (out / "Modelfile").write_text(modelfile(shipped, bundle, context, cfg.task.temperature))
    del learner

    info = {"base_model": cfg.model.spec, "base_name": bundle.name, "model_name": cfg.model_label, "arch": bundle.arch,
            "base_fingerprint": bundle.fingerprint, "rounds": rounds, "method": cfg.train.method,
            "trainable": cfg.train.trainable, "backend": cfg.model.backend, "task": cfg.task.name,
            "weights": {k: v for k, v in weights.items() if k != "line"},
            "held_out": _held_out_history(run_dir),
            "files": files, "quantized": quantized, "reward_curve": _reward_curve(run_dir), "eval": None,
            "context": context, "temperature": cfg.task.temperature, "shipped": shipped,
            "max_tokens": cfg.task.max_completion_length}
    if eval_limit > 0:
        # like with like: base and trained both at F16 (the effect of training); the shipped
        # quantized file on its own row (the effect of quantization on top)
        trained = f"round {weights['round']}"          # which weights, never just "trained"
        runs = [("before", f"{cfg.model.spec} (base model, F16)", cfg.model.spec, "f16"),
                ("after", f"{files['f16']} ({trained}, F16)", str(out / files["f16"]), "quantized")]
        if shipped != files["f16"]:
            runs.append(("shipped", f"{shipped} ({trained}, {quant.upper()})", str(out / shipped), "quantized"))
        info["eval"] = {"prompts": eval_limit, "sampler": "greedy"}
        answers = {}
        for key, label, model, precision in runs:
            r = step(f"evaluated {label} on {eval_limit} held-out {cfg.task.name} prompts",
                     _eval, cfg, model, precision, eval_limit, threads)
            answers[key] = r
            info["eval"][key] = {"model": label, **{k: v for k, v in r.items() if k != "correct"}}
            log(f"  accuracy {r['accuracy']:.1%}")
        # paired on the same prompts: what training changed (F16 both), what quantisation cost on top
        info["eval"]["training"] = paired(answers["after"], answers["before"])
        if "shipped" in answers:
            info["eval"]["quant_cost"] = {"file": shipped, "quant": quant,
                                          **paired(answers["shipped"], answers["after"])}
    (out / "export.json").write_text(json.dumps(info, indent=1))
    (out / "README.md").write_text(model_card(info))
    return info


def _writable(out: Path, *, default: bool) -> None:
    """The output folder, made and known writable before any model loads: a read-only run
    directory (a shared one, a mounted backup) is said in one line with the option that works."""
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / ".write-test"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        hint = ("; export it elsewhere with --to DIR" if default else "; choose another --to DIR")
        raise ExportError(f"cannot write the export to {out} ({e.strerror or e}){hint}") from None


def _weights_line(latest_round: int, best: dict | None, latest: bool, base_only: dict | None = None) -> dict:
    """Which weights the export takes, and the line that says so. ``base_only``: the kept "best" is
    the base model's own eval (round 0): no eval of trained weights beat it, and the base model is
    no trained model, so the newest checkpoint's weights ship, said to be no better on held-out."""
    if base_only is not None:
        b = base_only["best"]
        return {"which": "latest", "round": latest_round, "accuracy": None, "n": b.get("n"),
                "latest_round": latest_round, "beat_base": False,
                "line": f"no held-out eval beat the base model ({100 * b['accuracy']:.1f}% on {b.get('n')} prompts): "
                        f"exporting the newest checkpoint's weights, round {latest_round}, which are not measured "
                        f"better than the base model"}
    if best is not None:
        b = best["best"]
        lo, hi = b.get("interval") or (None, None)
        interval = f" [{100 * lo:.0f}–{100 * hi:.0f}]" if lo is not None and hi is not None else ""
        return {"which": "best", "round": best["round"], "accuracy": b.get("accuracy"), "n": b.get("n"),
                "latest_round": latest_round,
                "line": f"exporting the best held-out eval's weights: round {best['round']}, accuracy "
                        f"{100 * b['accuracy']:.1f}%{interval} on {b.get('n')} held-out prompts (the newest "
                        f"checkpoint is round {latest_round}: --latest takes it)"}
    why = "as asked (--latest)" if latest else "this run kept no best held-out weights (eval.every = 0, or a run " \
                                                "from before the held-out eval)"
    return {"which": "latest", "round": latest_round, "accuracy": None, "n": None, "latest_round": latest_round,
            "line": f"exporting the newest checkpoint's weights, round {latest_round}: {why}"}


def eval_lines(ev: dict) -> list[str]:
    """The export's held-out result: training's effect at F16 and the shipped file's cost against
    F16, each paired on the same prompts with its 95% interval (how large a change noise makes)."""
    lines = [f"held-out accuracy at F16: before {ev['before']['accuracy']:.1%}, after {ev['after']['accuracy']:.1%} "
             f"(greedy, n={ev['after']['n']}): training " + change_words(ev["training"], "the base model")]
    cost = ev.get("quant_cost")
    if cost:
        lines.append(f"the {cost['quant']} file ({cost['file']}) {ev['shipped']['accuracy']:.1%}: "
                     + change_words(cost, "F16"))
    return lines


def model_card(info: dict) -> str:
    from .common.text_safety import shown
    method = {"lora": "LoRA", "full": "full fine-tuning"}[info["trainable"]]
    # the model as the user called it (config.model_label), not the GGUF's internal general.name;
    # names from disk pass the one sanitiser (a code span must not be closed by the name either)
    name = shown(info.get("model_name") or info["base_name"])
    lines = [f"# {name} + ftis-edge ({info['method']}, {info['task']})", "",
             f"* Base model: `{shown(info['base_model']).replace('`', chr(39))}` ({shown(info['arch'])}), "
             f"weights fingerprint `{info['base_fingerprint']}`",
             f"* Training: {info['rounds']} round{'' if info['rounds'] == 1 else 's'} of GRPO with {info['method'].upper()} ({method}), "
             f"{info['backend']} backend, task `{info['task']}`",
             f"* Files: {', '.join('`' + f + '`' for f in info['files'].values())}, `Modelfile`", ""]
    if info["reward_curve"]:
        lines += ["## Reward (own groups, mean per span of rounds)", "", "| rounds | reward |", "|---|---|"]
        lines += [f"| {p['rounds']} | {p['reward']:.3f} |" for p in info["reward_curve"]] + [""]
    lines += _held_out_section(info)
    if info.get("quantized"):
        lines += ["## Quantized file", "", quant_line(info["quantized"]) + ".", ""]
    if info["eval"]:
        ev = info["eval"]
        lines += [f"## Held-out eval ({ev['prompts']} prompts, greedy, accuracy with 95% Wilson interval)", "",
                  "Before and after training at the same precision (F16), so the difference is the training's; "
                  "the shipped quantized file on its own row.", "",
                  "| model | accuracy | 95% interval | format ok |", "|---|---|---|---|"]
        for key in ("before", "after", "shipped"):
            if key not in ev:
                continue
            r = ev[key]
            lo, hi = r["accuracy_ci95"]
            lines.append(f"| {key}: {r['model']} | {r['accuracy']:.1%} | {lo:.1%} – {hi:.1%} | {r['format_rate']:.1%} |")
        lines.append("")
        if "training" in ev:       # paired on the same prompts: tighter than the two rows' intervals
            lines += [f"Paired on the same prompts: {line}." for line in eval_lines(ev)] + [""]
    lines += ["## Use it", "", "```bash", "ollama create ftis-model -f Modelfile", "ollama run ftis-model", "```", ""]
    lines += _outside_ollama(info)
    return "\n".join(lines)


def _outside_ollama(info: dict) -> list[str]:
    """How to use the model without Ollama: the prompt it was trained with, a llama-cpp-python
    snippet that sends it, and why the Modelfile's temperature is what it is."""
    if "context" not in info:
        return []
    context, t = info["context"], info["temperature"]
    system = next((m["content"] for m in context if m["role"] == "system"), None)
    examples = sum(m["role"] == "user" for m in context)
    lines = ["## Use it without Ollama", "",
             "The model was trained on prompts that start with "
             + ("this system prompt" if system else "no system prompt")
             + (f" and {examples} worked example{'s' if examples != 1 else ''} (user / assistant turns)"
                if examples else "")
             + ". Send the same, then your question: without them it answers less often in the format it "
               "learnt (the held-out numbers above were measured with them).", ""]
    if system:
        lines += ["```text", system, "```", ""]
    lines += ["With llama-cpp-python (`pip install llama-cpp-python`; it applies the chat template stored in "
              "the GGUF):", "", "```python", "from llama_cpp import Llama", "",
              f"llm = Llama(model_path={info['shipped']!r}, n_ctx=4096, verbose=False)",
              f"trained_with = {json.dumps(context, indent=4, ensure_ascii=False)}",
              'messages = trained_with + [{"role": "user", "content": "A shop sells pens at 3 for $2. '
              'How much do 12 pens cost?"}]',
              f"out = llm.create_chat_completion(messages=messages, temperature={t:g}, "
              f"max_tokens={info.get('max_tokens', 256)})",
              'print(out["choices"][0]["message"]["content"])', "```", "",
              f"Why temperature {t:g} (the Modelfile's `PARAMETER temperature`): it is `task.temperature`, the "
              f"temperature the model sampled at while it trained; GRPO taught it from answers drawn at that "
              f"temperature, so its format and accuracy are what training saw there. For the single most likely "
              f"answer (what the held-out eval measures) use temperature 0.", ""]
    return lines


def _held_out_section(info: dict) -> list[str]:
    """The card's base / best / latest held-out accuracy as the node measured it during training,
    and which of them these files hold."""
    w, hist = info.get("weights") or {}, info.get("held_out") or {}
    which = (f"These files hold the **{w['which']}** weights (round {w['round']})" if w else "")
    if w.get("beat_base") is False or hist.get("beat_base") is False:
        which = ("**No held-out eval of the trained weights beat the base model.** " + which
                 + ", which are not measured better than the base model")
    if not hist:
        return [f"{which}." if which else "", ""] if which else []
    lines = ["## Held-out accuracy during training (greedy, the node's own eval)", "",
             which + (": the best held-out eval's, kept by the node; `ftis-edge export --latest` exports the "
                      "newest instead." if w.get("which") == "best" else "."), "",
             "| weights | round | accuracy | 95% interval | prompts |", "|---|---|---|---|---|"]
    for key in ("base", "best", "latest"):
        r = hist.get(key)
        if not r or r.get("accuracy") is None:
            continue
        lo, hi = r.get("interval") or (None, None)
        band = f"{100 * lo:.1f}% – {100 * hi:.1f}%" if lo is not None and hi is not None else "–"
        lines.append(f"| {key} | {r['round']} | {100 * r['accuracy']:.1f}% | {band} | {r.get('n')} |")
    return lines + [""]


# --- CLI ------------------------------------------------------------------------------------------

def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", help="a node's run directory (runs/<id>)")
    p.add_argument("--to", default=None, help="output directory (default RUN_DIR/export)")
    p.add_argument("--quant", default=AUTO, choices=(AUTO, *QUANTS),
                   help="quantization of the shipped GGUF (default auto: q8_0 below 1B parameters, q4_k_m above; "
                        "f16: no quantized file)")
    p.add_argument("--eval-limit", type=int, default=50,
                   help="held-out prompts for the before/after eval in the model card (default 50; 0 = skip)")
    p.add_argument("--threads", type=int, default=None, help="CPU threads for the eval")
    p.add_argument("--latest", action="store_true",
                   help="export the newest checkpoint's weights (default: the best held-out eval's, when the run "
                        "kept them)")


def _traceback_kept(exc: Exception, args) -> str:
    """The failure in one line; its traceback in a file beside the export (not on the terminal)."""
    import tempfile
    import traceback
    from .errors import one_line
    from .common.text_safety import terminal_safe
    text = "".join(traceback.format_exception(exc))
    try:
        folder = Path(args.to).expanduser() if args.to else Path(args.run_dir).expanduser() / "export"
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / "export-error.log"
        path.write_text(text, encoding="utf-8")
    except OSError:
        fd, name = tempfile.mkstemp(prefix="ftis-export-", suffix=".log")
        with open(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        path = Path(name)
    return terminal_safe(f"{one_line(exc)} (traceback in {path.resolve()})")


def run(args) -> int:
    from .errors import FtisError, one_line
    try:
        info = export_run(args.run_dir, args.to, quant=args.quant, eval_limit=args.eval_limit, threads=args.threads,
                          latest=args.latest)
    except FtisError as e:        # ExportError, CheckpointError, ConfigError ...
        from .common.text_safety import shown
        print(f"ftis-edge export: error: {shown(one_line(e))}", file=sys.stderr)
        return 2
    except Exception as e:        # noqa: BLE001 - a bug or a run directory nobody foresaw: one line, never a raw traceback
        print(f"ftis-edge export: error: {_traceback_kept(e, args)}", file=sys.stderr)
        return 1
    out = Path(args.to).expanduser() if args.to else Path(args.run_dir).expanduser() / "export"
    print(f"exported to {out}: {', '.join(info['files'].values())}, Modelfile, README.md "
          f"(llama.cpp's output in {LOG_NAME})")
    if info["eval"]:
        for line in eval_lines(info["eval"]):
            print(line)
    print(f"Ollama: cd {out} && ollama create ftis-model -f Modelfile && ollama run ftis-model")
    return 0
