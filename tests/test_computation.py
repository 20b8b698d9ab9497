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


@pytest.mark.parametrize("text, ops", [("6 ⊠ 7", 1), ("6 ∘ 7", 1), ("6 \\circ 7", 1), ("6 \\boxtimes 7", 1),
                                       ("6 \\mathbin{\\star} 7", 1), ("9 \\hspace{1pt} - 4", 1), ("9\\mkern3mu-4", 1),
                                       ("9 \\kern1pt - 4", 1), ("9 \\phantom{0} - 4", 1), ("12 \\quad 4", 1),
                                       ("12 \\vskip 4", 1), ("12:4", 1), ("12 \" 4", 1), ("12\u20624", 1),
                                       ("1\\,000", 0), ("1 000 000", 0), ("3 1/2", 0), ("30^\\circ", 0),
                                       ("(1, 2) ∪ (3, 4)", 1), ("x ≤ 5", 0), ("-∞", 0), ("2\\pi", 0), ("√25", 1)])
def test_operators_and_spacing_are_classes_not_lists(text, ops):
    """Issue 62.4: a LaTeX spacing command before the operator, or another operator symbol, got
    arith's own question through 10 of 10. Every Unicode operator symbol and every LaTeX command
    that is not a value, relation or structure is an operator; every spacing is space; two
    numbers with only space between them are an operation unless they are a digit group."""
    assert computations(text) == ops


def test_the_generated_corpus_both_ways_by_the_rule_alone():
    """Every spelling generated from the classes (benchmarks/grader_spellings.py) that math-verify
    reads as the operation's result is refused, and no generated honest result is."""
    import json
    from pathlib import Path

    from ftis_edge.tasks.computation import computation_refusal
    generated = Path(__file__).parent / "data" / "grader_corpus_generated.jsonl"
    entries = [json.loads(line) for line in generated.read_text(encoding="utf-8").splitlines() if line.strip()]
    assert sum(e["kind"] == "computation" for e in entries) >= 500 and sum(e["kind"] == "honest" for e in entries) >= 100
    assert [e["answer"] for e in entries if e["kind"] == "computation"
            and computation_refusal(e["answer"], e["reference"]) is None] == []
    assert [e["answer"] for e in entries if e["kind"] == "honest"
            and computation_refusal(e["answer"], e["reference"]) is not None] == []
