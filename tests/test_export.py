"""`ftis-edge export` and `ftis-edge eval --model RUN_DIR` on real short runs of each backend.

A node runs 1 round (2 prompts x 4 completions) with SmolLM2; then the export's PEFT adapter gives
the learner's log-probs, its merged GGUF agrees with PyTorch, and the exported quantized GGUF loaded
in plain llama-cpp-python gets the same held-out eval as the node's own weights.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from procs import ROOT, cli, run_node, write_config


def test_export_and_eval_refuse_what_is_not_a_trained_run_in_one_line(tmp_path):
    r = cli("export", str(tmp_path / "nope"))
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0 and "not a run directory" in r.stderr
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.toml").write_text("[node]\nid = \"x\"\n")
    r = cli("export", str(run), "--eval-limit", "0")
    assert r.returncode == 2 and "no checkpoint yet" in r.stderr and r.stderr.strip().count("\n") == 0
    r = cli("eval", "--model", str(run), "--task", "arith", "--limit", "1")
    assert r.returncode == 2 and "no adapter/latest.gguf yet" in r.stderr and r.stderr.strip().count("\n") == 0


def test_reward_spans_are_labelled_like_rounds():
    from ftis_edge.export import _reward_curve
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        Path(d, "metrics.jsonl").write_text("".join(
            json.dumps({"type": "round", "round": r, "reward/own": r / 10}) + "\n" for r in (1, 2, 3)))
        assert [p["rounds"] for p in _reward_curve(Path(d))] == ["1", "2", "3"]
        assert [p["rounds"] for p in _reward_curve(Path(d), points=2)] == ["1–2", "3"]


def test_modelfile_chat_formats():
    from ftis_edge.export import _TEMPLATES, chat_format
    assert chat_format("{{ '<|im_start|>' + message['role'] }}") == "chatml"
    assert chat_format("<start_of_turn>user") == "gemma"
    assert chat_format("<|start_header_id|>") == "llama3" and chat_format("<|user|>") == "phi3"
    assert chat_format(None) == "plain"
    # the plain format is ModelBundle.render_prompt's, so an Ollama prompt is the prompt we trained on
    assert _TEMPLATES["plain"][0].replace("{{ if .System }}System: {{ .System }}\n\n{{ end }}", "System: S\n\n") \
        .replace("{{ .Prompt }}", "Q").replace("{{ .Response }}", "") == "System: S\n\nUser: Q\n\nAssistant:"
    # ... and it ends where the node's generator stops and the reward rule strips the marker
    # (three modules spell it: export and the pure reward rule keep models' heavy imports out)
    from ftis_edge.models.resolve import PLAIN_TURN_STOP
    from ftis_edge.tasks.rewards import END_TOKENS
    assert _TEMPLATES["plain"][1] == [PLAIN_TURN_STOP] and PLAIN_TURN_STOP in END_TOKENS

EVAL_N = 12


def _run(tmp_path: Path, node_id: str, **sections) -> Path:
    """A node's one round (2 prompts x 4 completions, procs.TINY), checkpointed; its run directory."""
    run_node(write_config(tmp_path, node_id, node={"rounds": 1, "checkpoint_every": 1}, **sections), timeout=1200)
    return tmp_path / node_id


def _trained_learner(run: Path):
    """(the run's learner as its newest checkpoint left it, a fixed batch, the model bundle)."""
    from ftis_edge.export import _latest_state, _learner_from_checkpoint
    from ftis_edge.models.resolve import resolve_model
    from ftis_edge.store.rundir import load_config as load_run_config

    cfg = load_run_config(run)
    bundle = resolve_model(cfg.model.spec)
    learner, _ = _learner_from_checkpoint(_latest_state(run), cfg, bundle, run)
    return learner, _batch(bundle), bundle


def _batch(bundle):
    """A fixed batch: two prompts with fixed completions."""
    from ftis_edge.learn.learner import TrainSample
    out = []
    for q, a in (("What is 3 + 4?", "<answer>7</answer>"), ("What is 12 - 5?", "The answer is <answer>7</answer>")):
        ids = bundle.encode(bundle.render_prompt([{"role": "user", "content": q}]))
        comp = bundle.tokenizer()(a, add_special_tokens=False).input_ids
        out.append(TrainSample(ids, comp, [0.0] * len(comp), None, 0.0))
    return out


def _plain_llama_cpp_eval(gguf: Path, bundle, task, prompts, max_tokens: int) -> list[float]:
    """Greedy answers from llama-cpp-python's high-level API only (nothing of ftis-edge's generator)."""
    import llama_cpp
    llm = llama_cpp.Llama(model_path=str(gguf), n_ctx=2048, n_threads=1, verbose=False)
    rewards = []
    for p in prompts:
        ids = bundle.encode(bundle.render_prompt(task.messages(p.question)))
        out = llm.create_completion(ids, max_tokens=max_tokens, temperature=0.0, top_k=1)
        rewards.append(task.reward(out["choices"][0]["text"], p.reference)[0])
    del llm
    return rewards


@pytest.mark.model
@pytest.mark.timeout(3600)
@pytest.mark.slow       # ~1 min each on 2 cores: the README's test command stays under 20 min
def test_export_of_a_llamacpp_lora_run(tmp_path, lora_run):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from ftis_edge import evaluate
    from ftis_edge.export import export_run
    from ftis_edge.store.rundir import load_config as load_run_config
    from ftis_edge.tasks import get_task

    run = lora_run
    latest = run / "adapter" / "latest.gguf"
    assert latest.is_file(), "the node keeps a stable adapter/latest.gguf"

    # eval --model RUN_DIR: the run's newest weights (base + latest.gguf)
    p = argparse.ArgumentParser()
    evaluate.add_arguments(p)
    node_eval = evaluate.evaluate(p.parse_args(["--model", str(run), "--task", "arith", "--limit", str(EVAL_N),
                                                "--max-new-tokens", "40", "--quiet", "--threads", "1"]))
    assert node_eval["adapter"] == str(latest)

    # the newest weights (what latest.gguf and the checkpoint hold); the best eval's: tests/test_heldout.py
    info = export_run(run, tmp_path / "out", quant="q8_0", eval_limit=EVAL_N, threads=1, log=lambda *_: None,
                      latest=True)
    out = tmp_path / "out"
    for name in ("peft/adapter_config.json", "peft/adapter_model.safetensors", "adapter.gguf", "model-f16.gguf",
                 "model-q8_0.gguf", "Modelfile", "README.md", "export.json"):
        assert (out / name).is_file(), name
    modelfile = (out / "Modelfile").read_text()
    assert modelfile.startswith("FROM ./model-q8_0.gguf") and 'PARAMETER stop "<|im_end|>"' in modelfile
    assert "<|im_start|>assistant" in modelfile
    card = (out / "README.md").read_text()
    assert info["base_fingerprint"] in card and "95%" in card and info["rounds"] == 1
    assert info["eval"]["after"]["n"] == EVAL_N

    # the PEFT directory gives the learner's log-probs
    learner, batch, bundle = _trained_learner(run)
    with torch.no_grad():
        ref, mask = learner.logprobs(batch)
        base = AutoModelForCausalLM.from_pretrained(bundle.hf_dir(), dtype=torch.float32)
        peft = PeftModel.from_pretrained(base, str(out / "peft"))
        learner.model = peft                      # the same log-prob code on the loaded model
        got, _ = learner.logprobs(batch)
    assert float((ref - got)[mask].abs().max()) <= 1e-5

    # the exported quantized GGUF in plain llama-cpp-python: the node's held-out eval, within noise
    task = get_task("arith", few_shot=load_run_config(run).task.few_shot)
    prompts = task.eval_prompts(EVAL_N)
    plain = _plain_llama_cpp_eval(out / "model-q8_0.gguf", bundle, task, prompts, 40)
    node = [it["reward"] for it in node_eval["items"]]
    assert len(plain) == len(node) == EVAL_N
    acc_plain, acc_node = np.mean([r >= 1 for r in plain]), np.mean([r >= 1 for r in node])
    same = np.mean([(a >= 1) == (b >= 1) for a, b in zip(plain, node)])
    print(f"\nheld-out arith n={EVAL_N}: node {acc_node:.3f}, exported q8_0 in plain llama-cpp-python "
          f"{acc_plain:.3f}, same verdict on {same:.0%}; card before {info['eval']['before']['accuracy']:.3f} "
          f"after {info['eval']['after']['accuracy']:.3f}")
    assert same >= 0.8 and abs(acc_plain - acc_node) <= 0.15


@pytest.mark.model
@pytest.mark.timeout(3600)
@pytest.mark.slow
def test_export_of_an_hf_full_fine_tuning_run(tmp_path):
    from transformers import AutoModelForCausalLM

    from ftis_edge.export import export_run
    from ftis_edge.generate.llamacpp import LlamaCppGenerator

    run = _run(tmp_path, "full", model={"backend": "hf", "threads": 1}, train={"trainable": "full", "learning_rate": 2e-5})
    info = export_run(run, None, quant="q8_0", eval_limit=0, log=lambda *_: None, latest=True)
    out = run / "export"
    assert sorted(info["files"]) == ["f16", "hf", "q8_0"] and (out / "hf" / "config.json").is_file()
    learner, batch, bundle = _trained_learner(run)
    with torch.no_grad():
        ref, mask = learner.logprobs(batch)
        learner.model = AutoModelForCausalLM.from_pretrained(out / "hf", dtype=torch.float32)
        got, _ = learner.logprobs(batch)
    assert float((ref - got)[mask].abs().max()) <= 1e-5
    # the merged GGUFs load in llama.cpp and score like the learner. F16 rounds part of a full fine-tuning
    # step away (docs/bridge.md: ~0.03); Q8_0 of SmolLM2 measured 0.12 on these 17 forced tokens even
    # without training (the shipped Q4_1: 0.07), so its bar is looser.
    for name, bar in (("model-f16.gguf", 0.05), ("model-q8_0.gguf", 0.25)):
        gen = LlamaCppGenerator(out / name, eos_token_ids=bundle.eos_token_ids, n_ctx=512, max_group=1, n_threads=1)
        cpp = np.concatenate([gen.score(s.prompt_ids, [s.completion_ids])[0] for s in batch])
        gen.close()
        err = float(np.abs(cpp - ref[mask].numpy()).mean())
        print(f"\nHF full fine-tuning export: {name} vs learner {err:.4f} nats/token")
        assert err < bar, (name, err)


@pytest.mark.model
@pytest.mark.timeout(3600)
@pytest.mark.slow       # ~1 min each on 2 cores: the README's test command stays under 20 min
def test_export_from_the_command_line_says_one_line_per_step(lora_run):
    """`ftis-edge export` as a user sees it: one line per step, llama.cpp's loader/quantizer output
    and warnings in export.log, what the quantized file holds, a card that compares like with like."""
    run = lora_run
    r = subprocess.run([sys.executable, "-m", "ftis_edge.cli", "export", str(run), "--quant", "q4_k_m",
                        "--eval-limit", "3", "--threads", "1"], cwd=ROOT, capture_output=True, text=True, timeout=1800)
    print(r.stdout)
    assert r.returncode == 0, r.stderr[-3000:]
    lines = r.stdout.strip().splitlines()
    assert len(lines) <= 20 and r.stderr.strip() == "", (len(lines), r.stderr[-2000:])
    for noise in ("llama_model_loader", "llama_model_quantize", "FutureWarning", "fallback quantization\n"):
        assert noise not in r.stdout + r.stderr, noise
    log = (run / "export" / "export.log").read_text(errors="replace")
    assert "llama_model_loader" in log or "llama_model_quantize" in log or "quantiz" in log
    q = [ln for ln in lines if "bits/weight" in ln]
    assert len(q) == 1 and q[0].startswith("model-q4_k_m.gguf: ") and "Q4_K" in q[0] and "fallback" in q[0], lines
    info = json.loads((run / "export" / "export.json").read_text())
    assert 4.0 < info["quantized"]["bits_per_weight"] < 9.0
    assert sum(info["quantized"]["tensor_types"].values()) > 100
    ev = info["eval"]
    # the weights named by their round (a base model never labelled "trained")
    assert ev["before"]["model"].endswith("(base model, F16)") and ev["after"]["model"] == "model-f16.gguf (round 1, F16)"
    assert ev["shipped"]["model"] == "model-q4_k_m.gguf (round 1, Q4_K_M)"
    card = (run / "export" / "README.md").read_text()
    assert "| 1 | " in card and "1-1" not in card           # one round: labelled 1, not 1-1
    assert "same precision (F16)" in card and "bits/weight" in card
