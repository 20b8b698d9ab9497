"""Copy what docs/ keeps of finished runs: metrics, configs, evals — never model weights.

    .venv/bin/python -m experiments.repro.publish runs/fill docs/runs/fill [--seeds 0] [--dry-run]

run.py writes whole run directories (checkpoints, adapters, node.log) under --out, outside docs/.
For every run directory under SRC (one with a metrics.jsonl whose run has stopped: one still
training or interrupted is skipped and named), this copies the files a reader of
docs/results.md needs into the same place under DEST (eval JSON without its indentation, the same
value), and writes beside them `weights.json`: the
sha256 and size of the weights its evals scored (the last GGUF adapter) and the run.py command
that rebuilds them. The weights themselves stay under SRC.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
from pathlib import Path

from experiments.repro import records, runon
from experiments.repro.batches import BATCHES, SwarmBatch
from experiments.repro.run import last_adapter  # (the weights run.py evaluates)

ROOT = Path(__file__).resolve().parents[2]

KEEP = ("config.toml", "metrics.jsonl", "eval-*.json", "*.md", runon.MARK)
WEIGHT_SUFFIXES = (".gguf", ".safetensors", ".pt", ".pth", ".bin", ".ckpt")
WEIGHTS_FILE = "weights.json"
RUN_PY = ".venv/bin/python -m experiments.repro.run"


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def rebuild_command(batch_name: str, seed: int, name: str, out: str) -> str:
    """The run.py invocation that trains run NAME again. A swarm node trains only beside the other
    nodes of its arm (they are each other's peers), so the command names the whole arm."""
    batch = BATCHES[batch_name]
    receivers = [name]
    if isinstance(batch, SwarmBatch) and not name.startswith("alone-"):
        arm = name.rsplit("-", 1)[0]
        receivers = [r for r in batch.receivers if r.rsplit("-", 1)[0] == arm]
    return f"{RUN_PY} {batch_name} --seeds {seed} --out {out} --receivers {' '.join(receivers)}"


LAST_SYNC = ("the GGUF LoRA adapter of the run's last weight sync: the weights its eval-id.json and "
             "eval-ood.json scored (run.py evaluates the newest adapter-v*.gguf)")


def scored_weights(run_dir: Path) -> tuple[Path, str] | None:
    """The weight file run.py's evals of RUN_DIR scored, and what it is (None: none there)."""
    r = runon.scored_round(run_dir)
    if r is not None:       # ran on past R: its round-R checkpoint's export (run.scored_job)
        export = runon.snapshot_dir(run_dir) / "export"
        for name, what in (("adapter.gguf", "GGUF LoRA adapter"), ("model-f16.gguf", "merged F16 model")):
            if (export / name).is_file():
                return export / name, (f"the {what} of the run's round-{r} checkpoint, which its eval-id.json and "
                                       f"eval-ood.json scored (it ran on past round {r}: {runon.MARK})")
        return None
    adapter = last_adapter(run_dir)
    if adapter is not None:
        return adapter, LAST_SYNC
    merged = run_dir / "export" / "model-f16.gguf"       # full fine-tuning on HF: exported, then scored
    if merged.is_file():
        return merged, ("the merged F16 model exported from the run's last checkpoint (ftis-edge export "
                        "--latest), which its eval-id.json and eval-ood.json scored")
    return None


def weights_record(run_dir: Path, weights: list[Path], command: str, machine_note: str = "",
                   what: str = LAST_SYNC) -> dict:
    """What weights.json says: each weight file by its path in the run, size and sha256, and how to
    get it back."""
    swarm = "the floats of a swarm node also depend on when its peers' groups arrived; "
    return {
        "removed": [{"file": str(w.relative_to(run_dir)), "bytes": w.stat().st_size, "sha256": sha256(w)}
                    for w in weights],
        "what": what,
        "rebuild": command,
        "reproducible": "the same command, code and machine repeat an isolated node's run; "
                        + swarm + "another machine gives other floats from the first update on "
                        "(docs/runs/fill/fill-hetero/s0/REUSED.md). The sha256 names the file these "
                        "evals scored." + (" " + machine_note if machine_note else ""),
    }


def compact_json(text: str) -> str:
    """The same JSON without the indentation `ftis-edge eval --json` writes (a third of an eval file's
    bytes): one top-level key a line, one eval item a line; `json.loads` reads back the same value."""
    data = json.loads(text)

    def line(v) -> str:
        return json.dumps(v, ensure_ascii=False, separators=(",", ":"))
    rows = []
    for k, v in data.items():
        if isinstance(v, list) and v and all(isinstance(x, dict) for x in v):
            rows.append(f"{line(k)}:[\n" + ",\n".join(line(x) for x in v) + "\n]")
        else:
            rows.append(f"{line(k)}:{line(v)}")
    return "{\n" + ",\n".join(rows) + "\n}\n"


def packed(f: Path, gz: bool) -> bool:
    """Whether docs/ keeps F gzip-compressed (publish --gzip: the metrics and the evals)."""
    return gz and (f.suffix == ".json" or f.name == "metrics.jsonl")


def kept_name(f: Path, gz: bool) -> str:
    return f.name + records.GZ if packed(f, gz) else f.name


def copy_kept(f: Path, target_dir: Path, gz: bool = False) -> Path:
    """F as docs/ keeps it in TARGET_DIR (an eval compacted; with GZ the metrics and evals as .gz).
    The record's other form is removed: a stale plain copy would shadow a fresh .gz for readers."""
    plain = target_dir / f.name
    for stale in (plain, plain.with_name(plain.name + records.GZ)):
        if stale.name != kept_name(f, gz):
            stale.unlink(missing_ok=True)
    data = compact_json(f.read_text(encoding="utf-8")).encode() if f.suffix == ".json" else None
    if packed(f, gz):
        return records.write_gz(plain, data if data is not None else f.read_bytes())
    if data is not None:
        plain.write_bytes(data)
    else:
        shutil.copy2(f, plain)
    return plain


def run_dirs(src: Path) -> list[Path]:
    return sorted(p.parent for p in src.rglob("metrics.jsonl"))


def still_open(run_dir: Path) -> bool:
    """A run whose last start has no stop record after it: still training, or killed and waiting for
    run.py to resume it. Its records would be half a run in docs/ (a stopped peer has its stop)."""
    if runon.scored_round(run_dir) is not None:     # ran on past R, stopped and marked done by run.py
        return False
    marks = [r["type"] for r in records.metrics(run_dir) if r.get("type") in ("start", "stop")]
    return not marks or marks[-1] != "stop"


def layout(src: Path, run_dir: Path) -> tuple[str, int, str] | None:
    """(batch, seed, name) of SRC/BATCH/sSEED/NAME, or None for another layout (base evals, experts)."""
    parts = run_dir.relative_to(src).parts
    if len(parts) == 3 and parts[0] in BATCHES and parts[1][:1] == "s" and parts[1][1:].isdigit():
        return parts[0], int(parts[1][1:]), parts[2]
    return None


def publish(src: Path, dest: Path, out_arg: str, dry_run: bool = False, gz: bool = False) -> list[str]:
    """Copy the kept files of every run under SRC to DEST (GZ: metrics and evals gzip-compressed,
    records.py reads them); returns what it did, one line each."""
    done = []
    # run.py's evals of the untrained model (SRC/base, no metrics.jsonl): the analysis's baseline
    # (and of a model some nodes start from, SRC/base/RUN-ID: H8's expert)
    kept = [(b, sorted(b.glob("eval-*.json"))) for b in [src / "base", *sorted((src / "base").glob("*/"))]] + \
           [(rd, sorted({f for pattern in KEEP for f in rd.glob(pattern) if f.is_file()})) for rd in run_dirs(src)]
    for rd, files in kept:
        if not files:
            continue
        if not rd.is_relative_to(src / "base") and still_open(rd):
            done.append(f"{rd}: skipped, not stopped yet (in progress, or interrupted: run.py resumes it)")
            continue
        target = dest / rd.relative_to(src)
        if not dry_run:
            target.mkdir(parents=True, exist_ok=True)
            for f in files:
                copy_kept(f, target, gz)
        done.append(f"{target}: {', '.join(kept_name(f, gz) for f in files)}")
        where, scored = layout(src, rd), scored_weights(rd)
        if where and scored is not None:
            record = weights_record(rd, [scored[0]], rebuild_command(*where, out_arg), what=scored[1])
            if not dry_run:
                (target / WEIGHTS_FILE).write_text(json.dumps(record, indent=1) + "\n")
            done.append(f"{target / WEIGHTS_FILE}: {scored[0].name} {record['removed'][0]['sha256'][:12]}…")
    return done


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("src", type=Path, help="run.py's --out (e.g. runs/fill)")
    ap.add_argument("dest", type=Path, help="where docs keeps them (e.g. docs/runs/fill)")
    ap.add_argument("--dry-run", action="store_true", help="say what would be copied, copy nothing")
    ap.add_argument("--gzip", action="store_true",
                    help="keep metrics.jsonl and eval-*.json gzip-compressed (a batch too large for docs/ as text)")
    args = ap.parse_args(argv)
    if not args.src.is_dir():
        ap.error(f"{args.src}: no such directory")
    try:
        out_arg = str(args.src.resolve().relative_to(ROOT))
    except ValueError:
        out_arg = str(args.src.resolve())
    for line in publish(args.src, args.dest, out_arg, args.dry_run, args.gzip):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
