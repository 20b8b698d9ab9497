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
            row = next((line for line in table.splitlines() if line.startswith(f"| `{pkg}/{sub.name}/` |")), None)
            if row is None:
                missing.append(f"{pkg}/{sub.name}/")
                continue
            # a folder's row names each of its modules (the row is the folder's map)
            missing += [f"{pkg}/{sub.name}/{m.name}" for m in sorted(sub.glob("*.py"))
                        if m.name != "__init__.py" and f"`{m.name}`" not in row]
    assert not missing, f"modules docs/architecture.md does not name: {missing}"


def test_the_top_of_the_package_is_the_commands_and_every_other_module_sits_in_a_folder():
    """Shape IV: a newcomer sees the flow in the folders; the top keeps the commands, the node file
    and the error base (at most 15 modules)."""
    top = sorted(p.name for p in (ROOT / "ftis_edge").glob("*.py"))
    assert len(top) <= 15, top
    folders = [p for p in (ROOT / "ftis_edge").iterdir() if (p / "__init__.py").exists()]
    assert len(folders) >= 8, folders


FLOW = ["tasks", "generate", "rollout", "peers", "learn", "run", "store", "models", "metrics", "tui", "common"]


def test_the_readmes_architecture_table_is_one_row_per_folder_in_flow_order():
    """Issue 61 item 0: the README's table shows the flow in the folders, one row each, in the order
    data moves (task → generate → rollout → peers → learn → run → disk, models, metrics → dashboard),
    then what all lean on, the commands and the relay; a new folder without a row fails here."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("\n## Architecture\n", 1)[1].split("\n## ", 1)[0]
    rows = [line.split(" | ")[0].removeprefix("| ").strip("`") for line in section.splitlines()
            if line.startswith("| ") and not line.startswith("| folder ")]
    folders = sorted(p.name for p in (ROOT / "ftis_edge").iterdir() if (p / "__init__.py").exists())
    assert sorted(FLOW) == folders, "a folder of ftis_edge/ is missing from FLOW (and the README's table)"
    assert rows == [f"{name}/" for name in FLOW] + ["top level", "relay/"], rows
    assert "(docs/architecture.md#folders)" in section          # the detail, one row per module, lives there
