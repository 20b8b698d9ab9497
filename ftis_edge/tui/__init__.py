"""The Textual dashboard: ``ftis-edge start`` (in a terminal) and ``ftis-edge watch RUN_DIR``.

It reads the run directory a node writes (docs/metrics.md) and never runs inside the
training loop; its only write is control.json (pause / stop), which the node reads between
rounds.
"""
from ftis_edge.tui.app import DashboardApp, run_dashboard

__all__ = ["DashboardApp", "run_dashboard"]
