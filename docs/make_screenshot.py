"""Render docs/dashboard.svg: the dashboard on the recorded run (tests/data/recorded_run).

    .venv/bin/python docs/make_screenshot.py [--size 120x40] [--tab tab-overview]
"""
from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from ftis_edge.tui import DashboardApp  # noqa: E402
from ftis_edge.tui.app import TABS  # noqa: E402


async def shoot(run_dir: Path, out: Path, size: tuple[int, int], tab: str) -> None:
    app = DashboardApp(run_dir)
    async with app.run_test(size=size) as pilot:
        app.action_show_tab(tab)
        await pilot.pause(0.5)
        app.save_screenshot(filename=out.name, path=str(out.parent))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run-dir", type=Path, default=ROOT / "tests" / "data" / "recorded_run")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "dashboard.svg")
    parser.add_argument("--size", default="120x40", help="COLUMNSxROWS (default 120x40)")
    parser.add_argument("--tab", default="tab-overview", choices=[t for t, _ in TABS])
    args = parser.parse_args()
    cols, rows = (int(v) for v in args.size.lower().split("x"))
    asyncio.run(shoot(args.run_dir, args.out, (cols, rows), args.tab))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
