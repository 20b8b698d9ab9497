"""Benchmarks and attacks, run from the repository root as modules: `python -m benchmarks.bench_wire`,
`python -m benchmarks.attacks.flood`; `benchmarks/run_all` runs every one that fits in 30 minutes."""
