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


def test_the_generated_corpus_both_ways_through_the_grader():
    """Issue 62.4: spellings generated from Unicode's and LaTeX's operator and spacing classes
    (tests/data/grader_corpus_generated.jsonl): before, 306 of 852 that math-verify reads as the
    result scored, and arith's "A × B" got through in 64 of 188 of them; now none."""
    entries = grader_corpus.load(grader_corpus.GENERATED)
    r = grader_corpus.measure(entries)
    assert r["computation"]["graded_correct"] == 0, r["computation"]["misses"][:10]
    assert r["honest"]["misses"] == [] and r["honest"]["math_verify_accepts"] >= 100, r["honest"]["misses"][:10]
    for sign, (through, tried) in grader_corpus.class_restatements(n=3, entries=entries).items():
        assert tried >= 50 and through == 0, sign
