"""Tests of the benchmark and experiment scripts themselves (benchmarks/, experiments/).

They live apart from the product's tests (tests/), which import only the product and their own
helpers (tests/test_tests_import_product.py holds them to it). Tests here may import the scripts
(the repository root's packages) and the product tests' helpers (tests/procs.py)."""
import os
import sys

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
for _path in (os.path.join(_ROOT, "tests"), _ROOT):      # `pytest` alone puts neither on the path
    if _path not in sys.path:
        sys.path.insert(0, _path)
