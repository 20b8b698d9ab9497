"""Wire size and speed on real rollouts (tests/data/real_rollouts.json, SmolLM2 at T = 1).

    .venv/bin/python -m benchmarks.bench_wire [--fixture PATH] [--json PATH]

Prints bytes per completion token (text and header included) for each codec, against the
naive reference of int32 id + fp32 log-prob (8 B/token, no text, no header), plus the
maximum log-prob quantisation error and encode/decode times.
"""
from __future__ import annotations

import hashlib
import json
import time
import uuid
from pathlib import Path

import numpy as np

from benchmarks.harness import parser, write_json
from ftis_edge.rollout import wire

FIXTURE = Path(__file__).resolve().parent.parent / "tests" / "data" / "real_rollouts.json"


def fixture_rollouts(path: Path = FIXTURE, with_prompt_ids: bool = False,
                     with_token_bytes: bool = True) -> list[wire.Rollout]:
    """One Rollout per group of the fixture, with realistic header strings."""
    fx = json.loads(Path(path).read_text())
    out = []
    for i, g in enumerate(fx["groups"]):
        comps = [wire.WireCompletion(c["token_ids"], c["logprobs"], c["text"],
                                     reward=float(i % 2), finish_reason=c["finish_reason"],
                                     token_bytes=c.get("token_bytes") if with_token_bytes else None)
                 for c in g["completions"]]
        out.append(wire.Rollout(
            node_id="node-7f3a2c", swarm="gsm8k-smollm2", task=g["task"], prompt_id=g["prompt_id"],
            completions=comps, group_id=uuid.uuid4().hex, round=123, adapter_version=122,
            prompt_ids=g["prompt_ids"] if with_prompt_ids else None,
            model_fp=hashlib.sha256(b"model").hexdigest()[:16],       # as ftis_edge.models.resolve
            tokenizer_fp=hashlib.sha256(b"tok").hexdigest()[:16], model_name=fx["model_name"],
            vocab_size=fx["vocab_size"], temperature=fx["temperature"], top_k=fx["top_k"],
            top_p=fx["top_p"]))
    return out


def main() -> None:
    ap = parser(__doc__)
    ap.add_argument("--fixture", default=str(FIXTURE))
    args = ap.parse_args()
    rollouts = fixture_rollouts(Path(args.fixture))
    n_tok = sum(r.num_tokens for r in rollouts)
    text_bytes = sum(len(c.text.encode()) for r in rollouts for c in r.completions)
    print(f"fixture: {len(rollouts)} groups, {sum(r.num_completions for r in rollouts)} completions, "
          f"{n_tok} tokens, text {text_bytes / n_tok:.2f} B/token raw")
    print()
    rows = []
    print(f"{'format':<34}{'B/token':>9}{'vs 8 B':>8}{'max |dlogp|':>13}{'enc ms':>8}{'dec ms':>8}")
    print(f"{'naive int32 id + fp32 logp':<34}{8.0:>9.3f}{1.0:>8.2f}{0.0:>13.2e}{'':>8}{'':>8}")
    print(f"{'naive + raw text':<34}{8.0 + text_bytes / n_tok:>9.3f}"
          f"{(8.0 + text_bytes / n_tok) / 8:>8.2f}{0.0:>13.2e}{'':>8}{'':>8}")
    for label, codec, with_prompt, with_bytes in [
            ("ftis wire, codec none", "none", False, True),
            ("ftis wire, zlib", "zlib", False, True),
            ("ftis wire, lzma (default)", "lzma", False, True),
            ("ftis wire, lzma, no token bytes", "lzma", False, False),
            ("ftis wire, lzma + prompt ids", "lzma", True, True)]:
        rs = fixture_rollouts(Path(args.fixture), with_prompt_ids=with_prompt, with_token_bytes=with_bytes)
        total, err = 0, 0.0
        t_enc = t_dec = 0.0
        for r in rs:
            t0 = time.perf_counter()
            msg = wire.encode(r, codec=codec)
            t1 = time.perf_counter()
            back = wire.decode(msg)
            t2 = time.perf_counter()
            t_enc += t1 - t0
            t_dec += t2 - t1
            total += len(msg)
            for a, b in zip(r.completions, back.completions):
                assert np.array_equal(a.token_ids, b.token_ids) and a.text == b.text
                err = max(err, float(np.abs(a.logprobs.astype(np.float64) - b.logprobs).max()))
        bpt = total / n_tok
        rows.append({"format": label, "bytes_per_token": bpt, "max_abs_dlogp": err,
                     "encode_ms": t_enc / len(rs) * 1e3, "decode_ms": t_dec / len(rs) * 1e3})
        print(f"{label:<34}{bpt:>9.3f}{bpt / 8:>8.2f}{err:>13.2e}"
              f"{t_enc / len(rs) * 1e3:>8.2f}{t_dec / len(rs) * 1e3:>8.2f}")
    write_json(args.json, {"groups": len(rollouts), "tokens": n_tok, "text_bytes_per_token": text_bytes / n_tok,
                           "rows": rows})
    print()
    print("B/token = encoded message bytes (header, text, ids, log-probs) / completion tokens;"
          " times are per rollout (one group).")


if __name__ == "__main__":
    main()
