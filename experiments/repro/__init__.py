"""The reproduction's batches, runs, publishing and analysis (docs/results.md): `python -m experiments.repro.run`."""
