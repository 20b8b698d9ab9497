"""Both directions of the math grader on the committed corpus (issue 51 item 7), through the real
grader worker: no computation scores, no honest result that math-verify accepts is refused.
Before: 43 of 198 computations scored (`3 ⋅ 4`, `\\cfrac{24}{2}`, `\\log_2 256`, `\\binom{8}{1}`,
`2**3`, `80\\% \\cdot 10`…) and 11 of 84 honest results were refused (scientific notation, units
in `\\mathbf`/`\\mbox`/`\\textrm`/`\\mathit`); arith's "A × B" restated as `A ⋅ B`, `A ∗ B` or
"A ÷ B" as `A ∕ B` scored 10 of 10 each (benchmarks/grader_corpus.py)."""
import pytest

from benchmarks import grader_corpus
from ftis_edge.tasks.computation import computations


def test_the_corpus_both_ways():
    entries = grader_corpus.load()
    assert sum(e["kind"] == "computation" for e in entries) >= 150 and sum(e["kind"] == "honest" for e in entries) >= 80
    r = grader_corpus.measure(entries)
    assert r["computation"]["graded_correct"] == 0, r["computation"]["misses"]
    assert r["honest"]["misses"] == [], r["honest"]["misses"]
    assert r["honest"]["math_verify_accepts"] >= 80          # the honest side is really graded


def test_arith_restated_in_any_spelling_of_its_sign_scores_nothing():
    for spelling, (scored, n) in grader_corpus.arith_restatements(n=5).items():
        assert n == 5 and scored == 0, spelling


@pytest.mark.parametrize("text, ops", [("9 - 4", 1), ("3 ⋅ 4", 1), ("\\frac{3}{4}", 0), ("\\frac{4}{8}", 1),
                                       ("1.5 \\times 10^{3}", 0), ("12 \\times 10^{4}", 2), ("5\\mathbf{m}^2", 0),
                                       ("\\frac{\\frac{1}{2}}{3}", 1), ("3 ÷ 4", 1), ("3/4", 0), ("-5", 0),
                                       ("50\\%", 0), ("80\\% \\cdot 10", 1), ("9-4-1", 2), ("x^2+1", 1)])
def test_what_counts_as_an_operation(text, ops):
    assert computations(text) == ops


def test_counting_stays_linear_on_long_peer_text():
    import time
    for text in ("1" * 5000 + "-", "(" * 3000 + "1", "\\frac{" * 2000, "1 - " * 2000, "\\mathrm{" * 2000 + "x"):
        t0 = time.perf_counter()
        computations(text)
        assert time.perf_counter() - t0 < 0.5, text[:20]
