"""Experiments, run from the repository root as modules (`.venv/bin/python -m experiments.gym_run`,
`-m experiments.repro.run`), so they import `ftis_edge` and each other without touching `sys.path`."""
