"""Write the generated docs: docs/metrics.md, docs/trl.md, docs/models.md and docs/config.md.

    python docs/make_docs.py          # rewrite them
    python docs/make_docs.py --check  # exit 1 if any is out of date (tests/test_metrics.py checks too)
"""
from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from ftis_edge.config import reference_table  # noqa: E402
from ftis_edge.fit import render_models_doc  # noqa: E402
from ftis_edge.metric_keys import render_metrics_doc, render_trl_doc  # noqa: E402

CONFIG_INTRO = """# Configuration

Generated from `ftis_edge/config.py` by `python docs/make_docs.py`: edit the source, not this file.

`ftis-edge init node.toml` writes every setting with its default and a comment. Any setting
that is wrong stops the node with one line naming the key (`train.method: must be one of …`).

"""


def render_config_doc() -> str:
    """docs/config.md: every setting of the node file, its default and meaning."""
    return CONFIG_INTRO + reference_table() + "\n"


def generated() -> dict[Path, str]:
    return {ROOT / "docs" / "metrics.md": render_metrics_doc(),
            ROOT / "docs" / "trl.md": render_trl_doc(),
            ROOT / "docs" / "models.md": render_models_doc(),
            ROOT / "docs" / "config.md": render_config_doc()}


def main(argv: list[str]) -> int:
    stale = [p for p, text in generated().items() if not p.exists() or p.read_text(encoding="utf-8") != text]
    if "--check" in argv:
        for p in stale:
            print(f"{p.relative_to(ROOT)} is out of date: run python docs/make_docs.py")
        return 1 if stale else 0
    for p, text in generated().items():
        p.write_text(text, encoding="utf-8")
    print("wrote " + ", ".join(str(p.relative_to(ROOT)) for p in generated()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
