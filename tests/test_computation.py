"""What counts as an operation on numbers (ftis_edge/tasks/computation.py), which the grader
refuses as an answer: counted right, in time linear in peer text (moved from the corpus test,
tests_tools/test_grader_corpus.py, which measures the grader on the committed corpus)."""
import pytest

from ftis_edge.tasks.computation import computations


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
