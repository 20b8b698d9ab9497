"""Inputs that the product's tests (tests/) and the benchmarks (benchmarks/) both build.

Neither may import the other (tests/test_tests_import_product.py), so what both need lives here:
hostile run directories (``hostile``), peers' rollouts with an intake that receives them
(``peers``), a run whose records carry thousands of peers (``peer_runs``) and relay connections
that ask and never read (``askers``), built from the product alone. Not shipped with the package.
"""
