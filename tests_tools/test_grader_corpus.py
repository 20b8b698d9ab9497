"""Both directions of the math grader on the committed corpus (issue 51 item 7), through the real
grader worker: no computation scores, no honest result that math-verify accepts is refused.
Before: 43 of 198 computations scored (`3 ⋅ 4`, `\\cfrac{24}{2}`, `\\log_2 256`, `\\binom{8}{1}`,
`2**3`, `80\\% \\cdot 10`…) and 11 of 84 honest results were refused (scientific notation, units
in `\\mathbf`/`\\mbox`/`\\textrm`/`\\mathit`); arith's "A × B" restated as `A ⋅ B`, `A ∗ B` or
"A ÷ B" as `A ∕ B` scored 10 of 10 each (benchmarks/grader_corpus.py). What counts as an operation:
tests/test_computation.py."""
from benchmarks import grader_corpus


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
