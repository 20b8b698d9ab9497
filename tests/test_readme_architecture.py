"""docs/architecture.md (the module table the README links) names every module of the package and
the relay, so the table a newcomer reads is the tree they get (a new module without a row fails here)."""
from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _architecture() -> str:
    return (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")


def test_every_module_has_a_row_in_the_architecture_doc():
    table = _architecture()
    missing = []
    for pkg in ("ftis_edge", "relay"):
        for path in sorted((ROOT / pkg).glob("*.py")):
            if path.name in ("__init__.py", "__main__.py"):
                continue
            if f"`{path.name}`" not in table and f"`{pkg}/{path.name}`" not in table:
                missing.append(f"{pkg}/{path.name}")
        for sub in sorted(p for p in (ROOT / pkg).iterdir() if (p / "__init__.py").exists()):
            if f"`{pkg}/{sub.name}/`" not in table:
                missing.append(f"{pkg}/{sub.name}/")
    assert not missing, f"modules docs/architecture.md does not name: {missing}"
