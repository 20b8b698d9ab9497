"""Model weights stay out of the repository: docs/ keeps metrics, configs and evals, and beside each
run whose weights were removed a weights.json with their sha256 and the command that rebuilds them."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
from experiments.repro import publish, records

DOCS_LIMIT = 15 * 2**20


def _tracked() -> list[str]:
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    return [p for p in out.stdout.decode().split("\0") if p]


def test_no_weight_file_is_tracked():
    weights = [p for p in _tracked() if p.lower().endswith(publish.WEIGHT_SUFFIXES)]
    assert not weights, f"model weights in git (write them under runs/, keep a weights.json): {weights}"


def test_docs_stay_small():
    size = sum((ROOT / p).lstat().st_size for p in _tracked() if p.startswith("docs/") and (ROOT / p).exists())
    assert size <= DOCS_LIMIT, f"docs/ holds {size / 2**20:.1f} MiB of tracked files (limit 15)"


def test_every_eval_of_removed_weights_names_them_in_weights_json():
    """An eval that scored an adapter once committed under docs/ has, beside it, that file's sha256
    and size and the command that rebuilds it."""
    missing, checked = [], 0
    runs = ROOT / "docs" / "runs"
    kept = sorted({p.with_name(p.name.removesuffix(records.GZ)) for p in runs.rglob("eval-*.json*")})
    for ev in kept:                                      # plain, or kept gzip-compressed (records.py)
        adapter = json.loads(records.read_bytes(ev)).get("adapter") or ""
        if not adapter.startswith("docs/"):
            continue                          # weights that never were in the repository
        checked += 1
        record = ev.resolve().parent / publish.WEIGHTS_FILE
        names = [w["file"] for w in json.loads(record.read_text())["removed"]] if record.exists() else []
        if Path(adapter).relative_to(ev.resolve().parent.relative_to(ROOT)).as_posix() not in names:
            missing.append(str(ev.relative_to(ROOT)))
    assert checked and not missing, f"evals of removed weights without a weights.json naming them: {missing}"


def test_weights_records_say_what_was_removed_and_how_to_rebuild_it():
    records = sorted((ROOT / "docs" / "runs").rglob(publish.WEIGHTS_FILE))
    assert records
    for path in records:
        record = json.loads(path.read_text())
        assert record["rebuild"].startswith(publish.RUN_PY + " "), path
        for w in record["removed"]:
            assert len(w["sha256"]) == 64 and int(w["sha256"], 16) >= 0 and w["bytes"] > 0, path
            assert w["file"].endswith(publish.WEIGHT_SUFFIXES), path


def test_publish_copies_results_not_weights(tmp_path):
    run = tmp_path / "runs" / "fill4" / "s0" / "own1-2"
    (run / "adapter").mkdir(parents=True)
    (run / "checkpoints" / "round-000001").mkdir(parents=True)
    (run / "metrics.jsonl").write_text('{"type":"start"}\n{"type":"stop","reason":"steps"}\n')
    (run / "config.toml").write_text('[node]\nid = "node-2"\n')
    busy = tmp_path / "runs" / "fill4" / "s0" / "own1-3"          # still training (or killed): no stop yet
    busy.mkdir(parents=True)
    (busy / "metrics.jsonl").write_text('{"type":"start"}\n{"type":"stop","reason":"user"}\n{"type":"start"}\n')
    (run / "node.log").write_text("log\n")
    evaluation = {"task": "arith", "accuracy": 0.5, "items": [{"id": "a", "text": "<answer>5</answer>"}] * 3}
    (run / "eval-id.json").write_text(json.dumps(evaluation, indent=2))
    for v in (1, 2):
        (run / "adapter" / f"adapter-v{v:06d}.gguf").write_bytes(bytes([v]) * 1000)
    (run / "checkpoints" / "round-000001" / "state.safetensors").write_bytes(b"x" * 100)

    lines = publish.publish(tmp_path / "runs", tmp_path / "docs", "runs/fill")

    out = tmp_path / "docs" / "fill4" / "s0" / "own1-2"
    assert sorted(p.name for p in out.iterdir()) == ["config.toml", "eval-id.json", "metrics.jsonl", "weights.json"]
    assert json.loads((out / "eval-id.json").read_text()) == evaluation        # same value, fewer bytes
    assert (out / "eval-id.json").stat().st_size < (run / "eval-id.json").stat().st_size
    record = json.loads((out / "weights.json").read_text())
    newest = run / "adapter" / "adapter-v000002.gguf"
    assert record["removed"] == [{"file": "adapter/adapter-v000002.gguf", "bytes": 1000,
                                  "sha256": publish.sha256(newest)}]
    # a swarm node trains only beside the other nodes of its arm
    assert record["rebuild"] == (".venv/bin/python -m experiments.repro.run fill4 --seeds 0 --out runs/fill "
                                 "--receivers own1-0 own1-1 own1-2 own1-3")
    assert any("weights.json" in line for line in lines)
    assert not (tmp_path / "docs" / "fill4" / "s0" / "own1-3").exists()       # half a run stays out of docs/
    assert any(line.startswith(str(busy)) and "skipped" in line for line in lines)


def test_a_gzip_published_run_reads_back_the_same_for_the_analysis(tmp_path):
    """publish.py --gzip (a batch too large for docs/ as text): the analysis, the plots and the
    diagnosis read the compressed records as they read plain ones, and the bytes are repeatable."""
    from experiments.repro import analyze
    from experiments.repro import records
    run = tmp_path / "runs" / "h6" / "s0" / "alone-3"
    (run / "adapter").mkdir(parents=True)
    rows = [{"type": "start", "node_id": "node-3"}] + \
           [{"type": "round", "round": r, "reward/mean": r / 10, "gen/tokens": 100 + r} for r in (1, 2)] + \
           [{"type": "stop", "round": 2, "reason": "steps"}]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run / "config.toml").write_text('[node]\nid = "node-3"\n')
    evaluation = {"task": "arith", "n": 3, "accuracy": 0.5, "items": [{"id": "a", "reward": 1.0}] * 3}
    for which in ("id", "ood"):
        (run / f"eval-{which}.json").write_text(json.dumps(evaluation, indent=2))
    (run / "adapter" / "adapter-v000001.gguf").write_bytes(b"w" * 100)
    (tmp_path / "runs" / "base").mkdir()
    (tmp_path / "runs" / "base" / "eval-id.json").write_text(json.dumps(evaluation))   # the untrained model's

    plain, packed = tmp_path / "plain", tmp_path / "packed"
    publish.publish(tmp_path / "runs", plain, "runs/h6")
    publish.publish(tmp_path / "runs", packed, "runs/h6")         # a plain copy first: the .gz replaces it
    said = publish.publish(tmp_path / "runs", tmp_path / "dry", "runs/h6", dry_run=True, gz=True)
    line = next(x for x in said if "alone-3:" in x)
    assert "eval-id.json.gz" in line and "metrics.jsonl.gz" in line and not (tmp_path / "dry").exists()
    publish.publish(tmp_path / "runs", packed, "runs/h6", gz=True)
    out = packed / "h6" / "s0" / "alone-3"
    assert sorted(p.name for p in out.iterdir()) == ["config.toml", "eval-id.json.gz", "eval-ood.json.gz",
                                                     "metrics.jsonl.gz", "weights.json"]
    assert analyze.load_run(out) == analyze.load_run(plain / "h6" / "s0" / "alone-3") is not None
    assert records.eval_of(out, "id") == evaluation and records.metrics(out) == rows
    first = (out / "metrics.jsonl.gz").read_bytes()
    publish.publish(tmp_path / "runs", packed, "runs/h6", gz=True)
    assert (out / "metrics.jsonl.gz").read_bytes() == first          # no time stamp inside
    assert analyze.load_all(packed)["h6"]["alone-3"][0]["evals"]["ood"]["accuracy"] == 0.5
    assert records.eval_of(packed / "base", "id") == evaluation                  # the baseline travels too
    assert analyze.base_accuracy(packed, analyze.load_all(packed))["id_value"] == 1.0


def test_publish_keeps_a_run_on_nodes_mark_and_names_its_round_r_weights(tmp_path):
    """H7's nodes 0-2 ran on past R (experiments/repro/runon.py): stopped by the runner ("signal",
    not "steps"), marked done, scored on their round-R checkpoint's export. docs/ gets the mark (so
    the analysis counts rounds 1..R) and weights.json names the file the evals scored, not the last
    adapter; a fully fine-tuned node's exported model is named too."""
    from experiments.repro import analyze, runon
    seed = tmp_path / "runs" / "h7" / "s0"
    run = seed / "worth-0"
    (run / "adapter").mkdir(parents=True)
    rows = [{"type": "start"}] + [{"type": "round", "round": r, "gen/tokens": 10} for r in (1, 2, 3)] + \
           [{"type": "stop", "round": 3, "reason": "signal"}]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run / "config.toml").write_text('[node]\nid = "node-0"\n')
    (run / "eval-id.json").write_text(json.dumps({"accuracy": 0.5, "n": 1, "items": [{"id": "a", "correct": True}]}))
    (run / "adapter" / "adapter-v000003.gguf").write_bytes(b"3" * 100)         # round 3's: not scored
    (runon.snapshot_dir(run) / "export").mkdir(parents=True)
    (runon.snapshot_dir(run) / "export" / "adapter.gguf").write_bytes(b"2" * 50)
    runon.mark(run, 2, "worth-3")
    full = seed / "alone-2"
    (full / "export").mkdir(parents=True)
    (full / "metrics.jsonl").write_text('{"type":"start"}\n{"type":"round","round":1}\n{"type":"stop","reason":"steps"}\n')
    (full / "export" / "model-f16.gguf").write_bytes(b"f" * 70)

    publish.publish(tmp_path / "runs", tmp_path / "docs", "runs/h7", gz=True)

    out = tmp_path / "docs" / "h7" / "s0" / "worth-0"
    assert sorted(p.name for p in out.iterdir()) == ["config.toml", "eval-id.json.gz", "metrics.jsonl.gz",
                                                     "scored-round.json.gz", "weights.json"]
    record = json.loads((out / "weights.json").read_text())
    assert record["removed"][0]["file"] == "scored/export/adapter.gguf" and record["removed"][0]["bytes"] == 50
    assert "round-2 checkpoint" in record["what"]
    assert [r["round"] for r in analyze.load_run(out)["rounds"]] == [1, 2]
    merged = json.loads((tmp_path / "docs" / "h7" / "s0" / "alone-2" / "weights.json").read_text())
    assert merged["removed"][0]["file"] == "export/model-f16.gguf" and "--receivers alone-2" in merged["rebuild"]
