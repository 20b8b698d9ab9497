"""``python -m ftis_edge.tasks.fetch`` (run by ``./install.sh --data``): download GSM8K and
MATH-500 once with the ``datasets`` package and keep them as JSON Lines in the data folder
(``ftis_edge.common.paths.user_data_dir()``), so gsm8k / math500 runs and ``ftis-edge eval`` work
offline afterwards. Files are written atomically; existing ones are kept unless --force.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..common import atomic, install_hint
from ..common.paths import user_data_dir

# (hub dataset, config, split) -> file under the data folder; fields as the tasks read them
SOURCES = [
    ("openai/gsm8k", "main", "train", "gsm8k/train.jsonl"),
    ("openai/gsm8k", "main", "test", "gsm8k/test.jsonl"),
    ("HuggingFaceH4/MATH-500", None, "test", "math500/test.jsonl"),
]


def write_jsonl(rows, path: Path) -> int:
    """Rows as JSON Lines at ``path`` (written whole, then renamed into place); returns how many."""
    lines = [json.dumps(dict(row), ensure_ascii=False) + "\n" for row in rows]
    atomic.write_text(path, "".join(lines))
    return len(lines)


def fetch(dest: Path, *, force: bool = False) -> list[str]:
    try:
        import datasets
    except ImportError:
        raise SystemExit("ftis-edge: error: " + install_hint.missing("datasets", "downloading GSM8K and MATH-500")) from None
    done = []
    for name, config, split, rel in SOURCES:
        path = dest / rel
        if path.is_file() and not force:
            done.append(f"{path} (kept)")
            continue
        ds = datasets.load_dataset(name, config, split=split) if config else datasets.load_dataset(name, split=split)
        done.append(f"{path} ({write_jsonl(ds, path)} records)")
    return done


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ftis_edge.tasks.fetch", description=__doc__.splitlines()[0])
    p.add_argument("--dest", default=None, help=f"data folder (default: {user_data_dir()})")
    p.add_argument("--force", action="store_true", help="download again even when the files exist")
    args = p.parse_args(argv)
    try:
        for line in fetch(Path(args.dest) if args.dest else user_data_dir(), force=args.force):
            print(line)
    except Exception as e:            # noqa: BLE001 - offline, hub errors: one line
        print(f"ftis-edge: error: could not download the datasets ({type(e).__name__}: {str(e)[:200]})",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
