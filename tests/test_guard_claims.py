"""The guard's ladder and claimed fingerprints (issue 51 item 9). A fingerprint is a claim: a
peer claiming our tokenizer and base model stays admitted at levels 1-2 (not verifiable: anyone
can compute the public base model's log-probs); it is excluded at the last level. What the guard
fixes: claims are believed once per id — a peer dropped for its model that then claims ours
stays dropped (before: admitted again at once), also across a resume."""
from ftis_edge.run.guard import ALONE, SwarmGuard
from ftis_edge.run.heldout import EvalResult

ME_TOK, ME_MODEL = "tok-smol", "smol"
N = 32


def result(round_: int, lost: int) -> EvalResult:
    correct = tuple(i >= lost for i in range(N))
    return EvalResult(round=round_, correct=correct, format_ok=(True,) * N, truncated=(False,) * N)


def test_a_changed_claim_does_not_readmit_a_dropped_peer():
    guard = SwarmGuard(ME_TOK, ME_MODEL)
    base = result(0, 0)
    book = {"gemma": {"tokenizer": "tok-gemma", "model_fp": "gemma"}, "friend": {"tokenizer": ME_TOK, "model_fp": ME_MODEL}}
    step = guard.observe(result(1, 12), base, base, book)
    assert step.harmed and guard.level == 2          # no batch fill: the first rung changes nothing
    assert not guard.admits("tok-gemma", "gemma", "gemma")
    assert not guard.admits(ME_TOK, ME_MODEL, "gemma")          # now claims to be us: still out
    assert guard.admits(ME_TOK, ME_MODEL, "friend")
    assert guard.admits(ME_TOK, ME_MODEL)                       # a claim without an id: as before
    resumed = SwarmGuard(ME_TOK, ME_MODEL)
    resumed.load_state(guard.state())
    assert resumed.level == 2 and not resumed.admits(ME_TOK, ME_MODEL, "gemma")


def test_a_liar_claiming_us_is_admitted_until_the_last_level():
    """Documented, not fixed: the liar costs at most one more step of the ladder."""
    guard = SwarmGuard(ME_TOK, ME_MODEL)
    base = result(0, 0)
    book = {"liar": {"tokenizer": ME_TOK, "model_fp": ME_MODEL}, "qwen": {"tokenizer": "tok-qwen", "model_fp": "qwen"}}
    guard.observe(result(1, 12), base, base, book)
    assert guard.level == 2 and guard.admits(ME_TOK, ME_MODEL, "liar") and not guard.admits("tok-qwen", "qwen", "qwen")
    guard.observe(result(2, 12), base, base, book)
    assert guard.level == ALONE and not guard.admits(ME_TOK, ME_MODEL, "liar")


def test_remembered_claims_are_bounded():
    guard = SwarmGuard(ME_TOK, ME_MODEL)
    for i in range(10_050):
        guard.admits("t", "m", f"id-{i}")
    assert len(guard.claims) == 10_000
    for k in range(20):
        guard.admits(f"t{k}", "m", "flipper")
    assert len(guard.claims["flipper"]) == 8
