"""`ftis-edge eval`: argument errors (fast), statistics (fast), and a real run on GSM8K (model)."""
from __future__ import annotations

import argparse
import json
import subprocess
import sys

import pytest

from ftis_edge import evaluate
from ftis_edge.metrics import stats
from ftis_edge.common.paths import PROJECT_ROOT, shared_data_dir


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    evaluate.add_arguments(parser)
    return parser.parse_args(list(argv))


# --- statistics ------------------------------------------------------------------------------

def test_wilson_interval_matches_known_values():
    lo, hi = stats.wilson_interval(5, 10)
    assert lo == pytest.approx(0.2366, abs=1e-4) and hi == pytest.approx(0.7634, abs=1e-4)
    lo, hi = stats.wilson_interval(0, 20)
    assert lo == 0.0 and hi == pytest.approx(0.1611, abs=1e-4)
    assert stats.wilson_interval(0, 0) == (0.0, 1.0)


def _item(pid, reward, level=None, fmt=True, tokens=10):
    return {"id": pid, "reward": reward, "format_ok": fmt, "correct": reward == 1.0, "timed_out": False,
            "tokens": tokens, "finish_reason": "stop", "level": level}


def test_summary_counts_groups_and_levels():
    items = [_item("a", 1.0, 1), _item("a", 0.0, 1), _item("b", 0.0, 2, fmt=False), _item("b", 0.0, 2)]
    s = evaluate.summarize(items, seconds=2.0)
    assert s["accuracy"] == 0.25 and s["format_rate"] == 0.75 and s["n_prompts"] == 2
    assert s["mixed_group_rate"] == 0.5 and s["pass_at_k"] == 0.5
    assert s["tok_s"] == 20.0 and s["mean_completion_tokens"] == 10
    assert s["by_level"]["1"]["accuracy"] == 0.5 and s["by_level"]["2"]["format_rate"] == 0.5


# --- bad arguments: one line on stderr, exit code 2 -------------------------------------------

@pytest.mark.parametrize("argv, message", [
    (["--task", "gsm9k"], "unknown task 'gsm9k'"),
    (["--task", "gsm8k", "--path", "/no/such/test.jsonl"], "no such file"),
    (["--task", "arith", "--adapter", "/no/such/adapter.gguf"], "no such file"),
    (["--task", "arith", "--backend", "hf", "--adapter", "/tmp"], "not a peft adapter directory"),
    (["--task", "arith", "--model", "/no/such/model.gguf"], "file not found"),
    (["--task", "arith", "--model", "not-a-model"], "unknown spec"),
    (["--task", "arith", "--level", "9"], "unknown level 9"),
    (["--task", "gsm8k", "--level", "2"], "--level only applies to --task arith"),
    (["--task", "arith", "--samples", "4"], "needs --temperature > 0"),
    (["--task", "arith", "--backend", "vllm"], "unknown backend"),
    (["--task", "arith", "--precision", "q8"], "unknown precision"),
    (["--task", "arith", "--limit", "0"], "--limit must be >= 1"),
    (["--task", "arith", "--few-shot", "5"], "few_shot must be an integer"),
    (["--task", "arith", "--batch", "0"], "--batch must be >= 1"),
])
def test_bad_arguments_are_one_line_and_exit_2(argv, message, capsys):
    assert evaluate.run(parse(*argv, "--quiet")) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err, err
    assert err.startswith("ftis-edge eval: error:") and message in err, err


def test_module_is_runnable_and_errors_cleanly():
    out = subprocess.run([sys.executable, "-m", "ftis_edge.evaluate", "--task", "nope"],
                         capture_output=True, text=True, cwd=PROJECT_ROOT, timeout=120)
    assert out.returncode == 2
    assert out.stderr.strip().startswith("ftis-edge eval: error: unknown task 'nope'; choose one of arith, gsm8k, "
                                         "math500, reasoning_gym, jsonl, reasoning_gym:<dataset>")
    assert "\n" not in out.stderr.strip()


# --- the real thing ----------------------------------------------------------------------------

@pytest.mark.slow       # ≥ 15 s on 2 cores: CI's slow tier keeps the README command under 20 min
@pytest.mark.model
@pytest.mark.skipif(shared_data_dir() is None, reason="no shared data folder (GSM8K)")
def test_eval_runs_end_to_end_on_five_gsm8k_questions(tmp_path):
    out_json = tmp_path / "eval.json"
    proc = subprocess.run(
        [sys.executable, "-m", "ftis_edge.evaluate", "--task", "gsm8k", "--limit", "5",
         "--max-new-tokens", "48", "--threads", "2", "--json", str(out_json)],
        capture_output=True, text=True, cwd=PROJECT_ROOT, timeout=900)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "accuracy" in proc.stdout and "95% CI" in proc.stdout          # the rich table
    r = json.loads(out_json.read_text())
    assert r["task"] == "gsm8k" and r["model"] == "smollm2-135m" and r["backend"] == "llamacpp"
    assert r["sampler"]["temperature"] == 0.0 and r["samples_per_prompt"] == 1
    assert r["n"] == 5 and r["n_prompts"] == 5 and len(r["items"]) == 5
    assert [it["id"] for it in r["items"]] == [f"gsm8k/test/{i}" for i in range(5)]
    assert [it["reference"] for it in r["items"]] == ["18", "3", "70000", "540", "20"]
    assert 0.0 <= r["accuracy"] <= 1.0 and r["accuracy_ci95"][0] <= r["accuracy"] <= r["accuracy_ci95"][1]
    assert 0.0 <= r["format_rate"] <= 1.0
    assert r["tok_s"] > 0 and 0 < r["mean_completion_tokens"] <= 48
    for it in r["items"]:
        assert it["text"] and it["finish_reason"] in ("stop", "length") and 1 <= it["tokens"] <= 48
        assert it["reward"] == float(it["format_ok"] and it["correct"])
    # greedy is deterministic: the same run gives the same completions
    again = evaluate.evaluate(parse("--task", "gsm8k", "--limit", "2", "--max-new-tokens", "48",
                                    "--threads", "2", "--quiet"))
    assert [it["text"] for it in again["items"]] == [it["text"] for it in r["items"][:2]]


@pytest.mark.model
def test_pool_plan_counts_the_shared_prefix_once():
    """The batch that fits the trained context counts the prompts' common prefix once (the pool
    stores it once), so more slots fit than at (whole prompt + max new) per slot; --batch stays
    the upper bound, and one prompt at a time shares nothing."""
    from ftis_edge.generate.loop import shared_prefix_len
    from ftis_edge.models.resolve import resolve_model
    from ftis_edge.tasks import get_task
    bundle = resolve_model("smollm2-135m")
    task = get_task("arith")
    ids = [bundle.encode(bundle.render_prompt(task.messages(p.question))) for p in task.eval_prompts(48)]
    shared, longest, trained = shared_prefix_len(ids), max(map(len, ids)), bundle.n_ctx_train
    assert shared > 100 and trained == 8192
    batch, got_shared = evaluate._pool_plan(parse("--task", "arith", "--batch", "64"), bundle, ids)
    assert got_shared == shared and batch == (trained - shared) // (longest - shared + 256)
    assert batch > trained // (longest + 256)
    assert evaluate._pool_plan(parse("--task", "arith", "--batch", "4"), bundle, ids) == (4, shared)
    assert evaluate._pool_plan(parse("--task", "arith", "--batch", "1"), bundle, ids) == (1, 0)
    assert evaluate._pool_plan(parse("--task", "arith", "--batch", "64", "--samples", "64"), bundle, ids) == (1, 0)


@pytest.mark.slow       # ≥ 15 s on 2 cores: CI's slow tier keeps the README command under 20 min
@pytest.mark.model
def test_batched_eval_gives_the_answers_of_one_prompt_at_a_time():
    """--batch decodes several prompts together on llama.cpp (the few-shot prefix once): the same
    greedy completions, token for token, as one prompt at a time."""
    runs = {b: evaluate.evaluate(parse("--task", "arith", "--limit", "6", "--max-new-tokens", "48",
                                       "--threads", "2", "--quiet", "--batch", str(b))) for b in (1, 4)}
    assert [it["text"] for it in runs[4]["items"]] == [it["text"] for it in runs[1]["items"]]
    assert len(runs[4]["items"]) == 6 and len({it["text"] for it in runs[4]["items"]}) > 1
