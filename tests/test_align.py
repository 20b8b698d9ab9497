"""align.py: shared byte boundaries of two tokenizations (hand cases) and real tokenizers' bytes."""
import pytest

from ftis_edge.rollout.align import AlignError, TokenBytes, shared_spans, span_alignment, span_sums


def test_hand_example_word_and_digit_boundaries():
    # text "ab cd12" (7 bytes). learner: "ab" " cd" "1" "2"; peer: "a" "b " "cd" "12"
    # learner ends {2, 5, 6, 7}, peer ends {1, 3, 5, 7}: shared {5, 7} -> spans "ab cd" | "12"
    ls, ps, n = shared_spans([2, 3, 1, 1], [1, 2, 2, 2])
    assert (ls, ps, n) == ([0, 0, 1, 1], [0, 0, 0, 1], 2)
    # summed log-probs per span, as the objective reads them
    assert span_sums(ps, [-1.0, -0.5, -0.25, -2.0], n) == [-1.75, -2.0]


def test_identical_tokenizations_give_one_span_per_token():
    ls, ps, n = shared_spans([3, 1, 4], [3, 1, 4])
    assert ls == ps == [0, 1, 2] and n == 3


def test_no_inner_shared_boundary_is_one_span():
    ls, ps, n = shared_spans([1, 2], [2, 1])
    assert (ls, ps, n) == ([0, 0], [0, 0], 1)


def test_zero_byte_tokens_join_the_span_ending_at_their_offset():
    # learner: BOS-like 0 at offset 0, "ab" (2), EOS (0); peer: "a", "b", EOS (0)
    ls, ps, n = shared_spans([0, 2, 0], [1, 1, 0])
    assert (ls, ps, n) == ([0, 0, 0], [0, 0, 0], 1)
    # with a shared inner boundary at 1 the EOS tokens land in the last span
    ls, ps, n = shared_spans([1, 1, 0], [1, 1, 0])
    assert (ls, ps, n) == ([0, 1, 1], [0, 1, 1], 2)


def test_empty_text_is_one_span():
    assert shared_spans([0], []) == ([0], [], 1)
    assert shared_spans([], []) == ([], [], 1)


def test_every_span_holds_tokens_of_both_sides():
    import random
    rng = random.Random(0)
    for _ in range(200):
        total = rng.randint(1, 40)
        def cut():
            pts = sorted(rng.sample(range(1, total), rng.randint(0, total - 1))) if total > 1 else []
            return [b - a for a, b in zip([0] + pts, pts + [total])]
        a, b = cut(), cut()
        la, lb, n = shared_spans(a, b)
        assert sorted(set(la)) == sorted(set(lb)) == list(range(n))
        assert la == sorted(la) and lb == sorted(lb)


@pytest.mark.parametrize("a,b,match", [
    ([2, 3], [4], "different texts"),
    ([-1, 3], [2], "byte length"),
    ([1.0], [1], "byte length"),
    ([True], [1], "byte length"),
])
def test_bad_lengths_raise(a, b, match):
    with pytest.raises(AlignError, match=match):
        shared_spans(a, b)


def test_span_sums_bad_input():
    with pytest.raises(AlignError, match="outside"):
        span_sums([0, 2], [-1.0, -1.0], 2)
    with pytest.raises(AlignError, match="span indices"):
        span_sums([0], [-1.0, -1.0], 1)


TEXTS = ["Hello world 123 ü 🙂\n\n<answer>42</answer>", " leading  spaces\tand tabs", "", "x" * 50,
         "日本語のテキスト and 数字 3.14"]


@pytest.mark.parametrize("spec", ["smollm2-135m", "gemma3-270m"])     # tokenizers only: no model mark
def test_real_tokenizer_bytes_spell_the_text(spec):
    from ftis_edge.models.resolve import resolve_model
    bundle = resolve_model(spec)
    tok = bundle.tokenizer()
    tb = TokenBytes(tok)
    eos = bundle.eos_token_ids[0]
    for text in TEXTS:
        ids = tok(text, add_special_tokens=False).input_ids + [eos]
        lens = tb.lengths(ids, text)
        assert lens is not None and sum(lens) == len(text.encode()) and lens[-1] == 0
    # a byte-level token cut inside a UTF-8 character does not spell its replacement-char text
    ids = tok("🙂", add_special_tokens=False).input_ids
    if len(ids) > 1:
        assert tb.lengths(ids[:-1], tok.decode(ids[:-1])) is None
    assert tb.lengths([len(tb.table) + 5], "") is None


def test_smollm2_and_gemma_share_word_boundaries():
    from ftis_edge.models.resolve import resolve_model
    text = "Natalia sold 48 clips in April, so 48 / 2 = 24 in May.\n<answer>72</answer>"
    lens = []
    for spec in ("smollm2-135m", "gemma3-270m"):
        tok = resolve_model(spec).tokenizer()
        lens.append(TokenBytes(tok).lengths(tok(text, add_special_tokens=False).input_ids, text))
    ls, ps, n = shared_spans(*lens)
    # many short spans, not one: the spans are (nearly) words and digits
    assert n > len(text.split()) and n >= 0.6 * min(len(lens[0]), len(lens[1]))


class _Bytes(TokenBytes):
    """A TokenBytes over a hand-made table (no tokenizer): id -> bytes."""

    def __init__(self, table):
        self.table, self.special = [t.encode() for t in table], frozenset({0})


def test_span_alignment_gives_span_ids_and_peer_span_sums():
    learner = _Bytes(["<eos>", "ab", " cd", "1", "2"])            # id 0 is special: spells nothing
    ids = [1, 2, 3, 4, 0]                                         # "ab" " cd" "1" "2" EOS
    out = span_alignment(ids, learner, "ab cd12", [1, 2, 2, 2, 0], [-1.0, -0.5, -0.25, -2.0, -0.1])
    # shared boundaries {5, 7}: learner spans [0, 0, 1, 1, 1]; peer span sums -1.75 and -2.1
    assert out[0] == [0, 0, 1, 1, 1] and out[1] == pytest.approx([-1.75, -2.1])
    assert span_alignment(ids, learner, "ab cd12", None, [-1.0] * 5) is None        # no byte lengths
    assert span_alignment(ids[:2], learner, "ab cd12", [1, 2, 2, 2, 0], [-1.0] * 5) is None  # cut short
    assert span_alignment(ids, learner, "ab cd12", [1, 2, 2, 2], [-1.0] * 5) is None       # lengths != tokens
