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

It also resolves ``ftis-edge eval --model RUN_DIR`` (``run_weights``): the node's
``adapter/latest.gguf``, an adapter on the base model (LoRA) or a merged model (full).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from .turns import PLAIN_TURN_STOP

QUANTS = ("f16", "q8_0", "q4_k_m")


class ExportError(Exception):
    """The run cannot be exported; the message is one readable line."""


# --- reading a run ------------------------------------------------------------------------------

def is_run_dir(path) -> bool:
    p = Path(path).expanduser()
    return p.is_dir() and (p / "config.toml").is_file()


def load_run_config(run_dir: Path):
    from .config import ConfigError, load
    try:
        return load(run_dir / "config.toml")
    except ConfigError as e:
        raise ExportError(f"{run_dir}: {e}") from None


def run_weights(run_dir) -> tuple[str, str | None]:
    """(model spec, adapter path or None) of a run's newest weights, for ``eval --model RUN_DIR``."""
    from .gguf_io import read_gguf_field
    from .sync import LATEST

    run_dir = Path(run_dir).expanduser()
    cfg = load_run_config(run_dir)
    latest = run_dir / "adapter" / LATEST
    if not latest.is_file():
        raise ExportError(f"{run_dir} has no adapter/{LATEST} yet (written after the first training step); "
                          f"`ftis-edge export {run_dir}` makes a model from its last checkpoint")
    if read_gguf_field(latest, "general.type") == "adapter":
        return cfg.model.spec, str(latest)
    return str(latest), None        # full fine-tuning: a merged model


def _reward_curve(run_dir: Path, points: int = 10) -> list[dict]:
    """Mean reward of own groups over ~``points`` equal spans of rounds (from metrics.jsonl)."""
    rows = []
    path = run_dir / "metrics.jsonl"
    if path.is_file():
        for line in path.read_text().splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if "round" in rec and rec.get("reward/own") is not None:
                rows.append((rec["round"], rec["reward/own"]))
    if not rows:
        return []
    size = max(1, -(-len(rows) // points))
    return [{"rounds": f"{chunk[0][0]}-{chunk[-1][0]}", "reward": sum(r for _, r in chunk) / len(chunk)}
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

def _learner_from_checkpoint(run_dir: Path, cfg, bundle):
    from . import checkpoint
    from .learner import Learner

    state = checkpoint.load_latest(run_dir)
    if state is None:
        raise ExportError(f"{run_dir} has no checkpoint yet (the node writes one every "
                          f"node.checkpoint_every rounds and at the end)")
    learner = Learner(bundle, trainable=cfg.train.trainable, lora_r=cfg.train.lora_r,
                      lora_alpha=cfg.train.lora_alpha, lora_dropout=cfg.train.lora_dropout,
                      lora_targets=tuple(bundle.lora_targets(cfg.train.lora_targets)), seed=cfg.node.seed,
                      device="cpu")
    learner.load_state_dict(state["learner"])
    return learner, state["round"]


def _eval(cfg, model: str, precision: str, limit: int, threads: int | None) -> dict:
    from . import evaluate
    p = argparse.ArgumentParser()
    evaluate.add_arguments(p)
    argv = ["--model", model, "--task", cfg.task.name, "--limit", str(limit), "--precision", precision,
            "--max-new-tokens", str(cfg.task.max_completion_length), "--few-shot", str(cfg.task.few_shot), "--quiet"]
    if cfg.task.name == "arith" and cfg.task.level:
        argv += ["--level", ",".join(str(x) for x in cfg.task.level)]
    if cfg.task.path:
        argv += ["--path", cfg.task.path]
    if cfg.task.require_think:
        argv.append("--require-think")
    if threads:
        argv += ["--threads", str(threads)]
    try:
        r = evaluate.evaluate(p.parse_args(argv))
    except evaluate.EvalError as e:
        raise ExportError(f"eval of {model}: {e}") from None
    return {k: r[k] for k in ("n", "accuracy", "accuracy_ci95", "format_rate", "mean_completion_tokens")}


def export_run(run_dir, to=None, *, quant: str = "q4_k_m", eval_limit: int = 50, threads: int | None = None,
               log=print) -> dict:
    """Write every artefact listed in the module docstring; returns what export.json holds."""
    from .gguf_io import GGUFError, export_merged_gguf, quantize_gguf, write_gguf_lora
    from .models import ModelError, resolve_model

    if quant not in QUANTS:
        raise ExportError(f"--quant must be one of {', '.join(QUANTS)}, got {quant!r}")
    run_dir = Path(run_dir).expanduser()
    if not is_run_dir(run_dir):
        raise ExportError(f"{run_dir} is not a run directory (no config.toml)")
    cfg = load_run_config(run_dir)
    out = Path(to).expanduser() if to else run_dir / "export"
    out.mkdir(parents=True, exist_ok=True)
    try:
        bundle = resolve_model(cfg.model.spec)
        bundle.require_supported()
        learner, rounds = _learner_from_checkpoint(run_dir, cfg, bundle)
        t0 = time.time()
        files = {}
        if learner.trainable == "lora":
            learner.model.save_pretrained(out / "peft")
            files["peft"] = "peft/"
            files["adapter"] = write_gguf_lora(learner.model, out / "adapter.gguf", arch=bundle.arch,
                                               n_head=bundle.n_head, n_head_kv=bundle.n_head_kv).name
        else:
            learner.model.save_pretrained(out / "hf")
            bundle.tokenizer().save_pretrained(out / "hf")
            files["hf"] = "hf/"
        base = bundle.base_gguf()
        files["f16"] = export_merged_gguf(learner.model, base, out / "model-f16.gguf", dtype="f16").name
        log(f"wrote {', '.join(files.values())} ({time.time() - t0:.1f} s)")
        if quant != "f16":
            # quantize from F32: one full fine-tuning step is often below F16's resolution (docs/bridge.md)
            f32 = export_merged_gguf(learner.model, base, out / ".model-f32.gguf", dtype="f32")
            try:
                files[quant] = quantize_gguf(f32, out / f"model-{quant}.gguf", quant).name
            finally:
                f32.unlink(missing_ok=True)
            log(f"wrote {files[quant]}")
    except (ModelError, GGUFError) as e:
        raise ExportError(str(e)) from None
    shipped = files[quant]
    from .tasks import TaskError, get_task
    try:
        task = get_task(cfg.task.name, few_shot=cfg.task.few_shot,
                        **({"path": cfg.task.path} if cfg.task.path else {}))
        context = task.messages("")[:-1]
    except TaskError:       # the dataset is not on this machine: no worked examples in the Modelfile
        context = []
    (out / "Modelfile").write_text(modelfile(shipped, bundle, context, cfg.task.temperature))
    del learner

    info = {"base_model": cfg.model.spec, "base_name": bundle.name, "arch": bundle.arch,
            "base_fingerprint": bundle.fingerprint, "rounds": rounds, "method": cfg.train.method,
            "trainable": cfg.train.trainable, "backend": cfg.model.backend, "task": cfg.task.name,
            "files": files, "reward_curve": _reward_curve(run_dir), "eval": None}
    if eval_limit > 0:
        log(f"evaluating the base model and {shipped} on {eval_limit} held-out {cfg.task.name} prompts")
        info["eval"] = {"prompts": eval_limit, "sampler": "greedy",
                        "before": {"model": f"{cfg.model.spec} (F16)",
                                   **_eval(cfg, cfg.model.spec, "f16", eval_limit, threads)},
                        "after": {"model": shipped,
                                  **_eval(cfg, str(out / shipped), "quantized", eval_limit, threads)}}
    (out / "export.json").write_text(json.dumps(info, indent=1))
    (out / "README.md").write_text(model_card(info))
    return info


def model_card(info: dict) -> str:
    method = {"lora": "LoRA", "full": "full fine-tuning"}[info["trainable"]]
    lines = [f"# {info['base_name']} + ftis-edge ({info['method']}, {info['task']})", "",
             f"* Base model: `{info['base_model']}` ({info['arch']}), weights fingerprint `{info['base_fingerprint']}`",
             f"* Training: {info['rounds']} rounds of GRPO with {info['method'].upper()} ({method}), "
             f"{info['backend']} backend, task `{info['task']}`",
             f"* Files: {', '.join('`' + f + '`' for f in info['files'].values())}, `Modelfile`", ""]
    if info["reward_curve"]:
        lines += ["## Reward (own groups, mean per span of rounds)", "", "| rounds | reward |", "|---|---|"]
        lines += [f"| {p['rounds']} | {p['reward']:.3f} |" for p in info["reward_curve"]] + [""]
    if info["eval"]:
        ev = info["eval"]
        lines += [f"## Held-out eval ({ev['prompts']} prompts, greedy, accuracy with 95% Wilson interval)", "",
                  "| model | accuracy | 95% interval | format ok |", "|---|---|---|---|"]
        for key in ("before", "after"):
            r = ev[key]
            lo, hi = r["accuracy_ci95"]
            lines.append(f"| {key}: {r['model']} | {r['accuracy']:.1%} | {lo:.1%} – {hi:.1%} | {r['format_rate']:.1%} |")
        lines.append("")
    lines += ["## Use it", "", "```bash", "ollama create ftis-model -f Modelfile", "ollama run ftis-model", "```", ""]
    return "\n".join(lines)


# --- CLI ------------------------------------------------------------------------------------------

def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", help="a node's run directory (runs/<id>)")
    p.add_argument("--to", default=None, help="output directory (default RUN_DIR/export)")
    p.add_argument("--quant", default="q4_k_m", choices=QUANTS, help="quantization of the shipped GGUF")
    p.add_argument("--eval-limit", type=int, default=50,
                   help="held-out prompts for the before/after eval in the model card (0 = skip)")
    p.add_argument("--threads", type=int, default=None, help="CPU threads for the eval")


def run(args) -> int:
    try:
        info = export_run(args.run_dir, args.to, quant=args.quant, eval_limit=args.eval_limit, threads=args.threads)
    except ExportError as e:
        print(f"ftis-edge export: error: {e}", file=sys.stderr)
        return 2
    out = Path(args.to).expanduser() if args.to else Path(args.run_dir).expanduser() / "export"
    print(f"exported to {out}: {', '.join(info['files'].values())}, Modelfile, README.md")
    if info["eval"]:
        b, a = info["eval"]["before"], info["eval"]["after"]
        print(f"held-out accuracy: before {b['accuracy']:.1%}, after {a['accuracy']:.1%} (n={a['n']})")
    print(f"Ollama: cd {out} && ollama create ftis-model -f Modelfile && ollama run ftis-model")
    return 0
