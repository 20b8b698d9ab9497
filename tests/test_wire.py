"""Wire format: exact round trips and size on real SmolLM2 rollouts, every rejection reason,
and fuzzing that decode raises nothing but WireError."""
from __future__ import annotations

import dataclasses
import struct
import uuid
import zlib

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ftis_edge.rollout import wire
from ftis_edge.rollout.wire import Rollout, WireCompletion, WireError
from messages import real_rollouts

def small(**kw) -> Rollout:
    comps = [WireCompletion([1, 2, 3], [-0.5, -0.0, -7.25], "a b c", 1.0, "stop"),
             WireCompletion([4], [-1.0], "d", 0.0, "length")]
    args = dict(node_id="n", swarm="s", task="arith", prompt_id="p1", completions=comps, vocab_size=100)
    args.update(kw)
    return Rollout(**args)


def assert_same(a: Rollout, b: Rollout) -> None:
    for f in dataclasses.fields(Rollout):
        if f.name != "completions":
            assert getattr(a, f.name) == getattr(b, f.name), f.name
    assert len(a.completions) == len(b.completions)
    for x, y in zip(a.completions, b.completions):
        assert np.array_equal(x.token_ids, y.token_ids)
        assert np.abs(x.logprobs.astype(np.float64) - y.logprobs).max(initial=0) <= 5e-4
        assert (x.text, x.reward, x.finish_reason) == (y.text, y.reward, y.finish_reason)
        assert (x.token_bytes is None) == (y.token_bytes is None)
        if x.token_bytes is not None:
            assert y.token_bytes.tolist() == x.token_bytes.tolist()
        assert y.logprobs.dtype == np.float32 and np.all(y.logprobs <= 0)


@pytest.mark.parametrize("codec", ["lzma", "zlib", "none"])
@pytest.mark.parametrize("with_token_bytes", [True, False])
def test_round_trip_on_real_rollouts(codec, with_token_bytes):
    for r in real_rollouts(with_prompt_ids=True, with_token_bytes=with_token_bytes):
        back = wire.decode(wire.encode(r, codec=codec))
        assert_same(r, back)
        assert back.prompt_ids == r.prompt_ids and back.num_tokens == r.num_tokens


def test_token_bytes_place_the_tokens_on_the_text():
    rs = real_rollouts()
    c = wire.decode(wire.encode(rs[0])).completions[0]
    ends = np.cumsum(c.token_bytes)
    assert ends[-1] == len(c.text.encode())
    # every token's bytes, cut out of the text at its offsets, are its own piece of the text
    raw = c.text.encode()
    assert b"".join(raw[a:b] for a, b in zip(np.r_[0, ends[:-1]], ends)) == raw
    mixed = small(completions=[WireCompletion([1, 2, 3], [-0.5, -0.1, -1.0], "a b", 1.0, "stop", [1, 2, 0]),
                               WireCompletion([4], [-1.0], "d", 0.0, "length")])
    back = wire.decode(wire.encode(mixed))
    assert back.completions[0].token_bytes.tolist() == [1, 2, 0] and back.completions[1].token_bytes is None


def test_token_bytes_cost_at_most_half_a_byte_per_token():
    with_b = [len(wire.encode(r)) for r in real_rollouts(with_token_bytes=True)]
    without = [len(wire.encode(r)) for r in real_rollouts(with_token_bytes=False)]
    n_tok = sum(r.num_tokens for r in real_rollouts())
    cost = (sum(with_b) - sum(without)) / n_tok
    assert 0.0 < cost <= 0.5, f"{cost:.3f} B/token"


def test_size_on_real_rollouts_is_at_most_4_5_bytes_per_token_plus_token_bytes():
    rs = real_rollouts(with_token_bytes=False)
    n_tok = sum(r.num_tokens for r in rs)
    assert n_tok > 3000
    nbytes = sum(len(wire.encode(r)) for r in rs)
    assert nbytes / n_tok <= 4.5, f"{nbytes / n_tok:.3f} B/token"
    with_bytes = sum(len(wire.encode(r)) for r in real_rollouts())
    assert with_bytes / n_tok <= 4.5 + 0.3, f"{with_bytes / n_tok:.3f} B/token with token bytes"
    err = max(float(np.abs(c.logprobs.astype(np.float64) - d.logprobs).max())
              for r in rs for c, d in zip(r.completions, wire.decode(wire.encode(r)).completions))
    assert 1e-4 < err <= 0.5 / wire.LOGPROB_SCALE <= 5e-4     # the quantiser is really used


def test_extremes_round_trip():
    big_vocab = small(vocab_size=262144, completions=[
        WireCompletion([0, 262143, 70000], [-1e-7, -70.0, -9999.5], "x\u00e9\U0001f600", -3.5, "stop")])
    back = wire.decode(wire.encode(big_vocab))
    assert back.completions[0].token_ids.tolist() == [0, 262143, 70000]
    assert np.allclose(back.completions[0].logprobs, [0.0, -70.0, -9999.5], atol=5e-4)
    tiny_vocab = small(vocab_size=5, completions=[WireCompletion([], [], "", 0.0, "length")])
    assert wire.decode(wire.encode(tiny_vocab)).completions[0].num_tokens == 0
    hex_and_text_ids = [small(rollout_id="ABC-1"), small(rollout_id="abc"), small(rollout_id="00ff")]
    assert [wire.decode(wire.encode(r)).rollout_id for r in hex_and_text_ids] == ["ABC-1", "abc", "00ff"]


# ------------------------------------------------------------------ rejections

def reason(fn) -> str:
    with pytest.raises(WireError) as e:
        fn()
    assert isinstance(e.value, ValueError) and e.value.reason in wire.REASONS
    assert str(e.value).startswith(e.value.reason)
    return e.value.reason


def repack(msg: bytes, edit_body=None, edit_header=None, body_len=None, version=None) -> bytes:
    """Re-pack a message with codec none after editing its body / header / prefix."""
    p = wire.peek(msg)
    body = wire._decompress(p.codec, msg[p.payload_offset:], p.body_len)
    if edit_header:
        hlen = struct.unpack_from("<I", body)[0]
        h = edit_header(wire._unpack_header(body[4:4 + hlen]))
        hb = wire._pack_header(h)
        body = struct.pack("<I", len(hb)) + hb + body[4 + hlen:]
    if edit_body:
        body = edit_body(body)
    prefix = bytearray(msg[:p.payload_offset - 4])
    prefix[4] = wire.CODECS["none"]
    if version is not None:
        prefix[3] = version
    return bytes(prefix) + struct.pack("<I", len(body) if body_len is None else body_len) + body


def test_encode_rejects_bad_rollouts():
    assert reason(lambda: wire.encode(small(completions=[WireCompletion([1], [float("nan")], "", 0)]))) == "bad_logprob"
    assert reason(lambda: wire.encode(small(completions=[WireCompletion([1], [0.01], "", 0)]))) == "bad_logprob"
    assert reason(lambda: wire.encode(small(completions=[WireCompletion([1], [-np.inf], "", 0)]))) == "bad_logprob"
    assert reason(lambda: wire.encode(small(completions=[WireCompletion([100], [-1], "", 0)]))) == "id_out_of_range"
    assert reason(lambda: wire.encode(small(completions=[WireCompletion([1, 2], [-1], "", 0)]))) == "length_mismatch"
    assert reason(lambda: wire.encode(small(completions=[WireCompletion([1], [-1], "", float("nan"))]))) == "bad_value"
    assert reason(lambda: wire.encode(small(completions=[]))) == "bad_value"
    assert reason(lambda: wire.encode(small(node_id="x" * 300))) == "bad_header"
    assert reason(lambda: wire.encode(small(group_size=1))) == "bad_value"       # 2 completions > G
    assert reason(lambda: wire.encode(small(vocab_size=0))) == "bad_value"
    assert reason(lambda: wire.encode(small(rollout_id=""))) == "bad_header"
    assert reason(lambda: wire.encode(small(), codec="brotli")) == "bad_value"
    assert reason(lambda: wire.encode(small(), limits=wire.WireLimits(max_message_bytes=50))) == "too_large"


def test_token_bytes_are_validated_on_both_sides():
    def one(tb, text="a b"):
        return small(completions=[WireCompletion([1, 2, 3], [-0.5, -0.1, -1.0], text, 1.0, "stop", tb)])
    assert reason(lambda: wire.encode(one([1, 1, 0]))) == "length_mismatch"       # 2 bytes for a 3-byte text
    assert reason(lambda: wire.encode(one([1, 2]))) == "length_mismatch"          # one length short
    assert reason(lambda: wire.encode(one([1.0, 2.0, 0.0]))) == "length_mismatch"  # not integers
    assert reason(lambda: wire.encode(one([-1, 4, 0]))) == "bad_value"
    assert reason(lambda: wire.encode(one([300, 0, 0], "x" * 300))) == "bad_value"   # > 255: one u8
    good = wire.encode(one([1, 2, 0]), codec="none")
    # the receiver checks the sum too: a forged length that still fits the body is rejected
    body_at = wire.peek(good).payload_offset
    records = bytes([1, 1, 2, 2, 3, 0])              # (id, byte length) per token, vocab 100: 1-byte ids
    tb_at = good.index(records, body_at)
    forged = good[:tb_at] + bytes([1, 1, 2, 1, 3, 0]) + good[tb_at + 6:]
    assert reason(lambda: wire.decode(forged)) == "length_mismatch"
    # a flag that claims token bytes the body does not hold
    flag = repack(wire.encode(small()), edit_header=lambda h: {**h, "has_bytes": [1, 0]})
    assert reason(lambda: wire.decode(flag)) == "length_mismatch"
    bad_flag = repack(wire.encode(small()), edit_header=lambda h: {**h, "has_bytes": [2, 0]})
    assert reason(lambda: wire.decode(bad_flag)) == "bad_value"


def test_decode_reasons():
    good = wire.encode(small())
    assert reason(lambda: wire.decode(good[:5])) == "truncated"
    assert reason(lambda: wire.decode(good[:-3])) == "decompress"
    assert reason(lambda: wire.decode(b"XYZ" + good[3:])) == "bad_header"
    assert reason(lambda: wire.decode(repack(good, version=wire.PROTOCOL_VERSION + 1))) == "bad_version"
    assert reason(lambda: wire.decode(repack(good, version=1))) == "bad_version"   # no token bytes
    assert reason(lambda: wire.decode(good, wire.WireLimits(max_message_bytes=10))) == "too_large"
    assert reason(lambda: wire.decode("text")) == "bad_header"
    # the body is longer than the declared length (a decompression bomb in miniature)
    bomb = zlib.compress(b"\0" * (10 << 20))
    p = wire.peek(wire.encode(small(), codec="zlib"))
    prefix = wire.encode(small(), codec="zlib")[:p.payload_offset - 4]
    assert reason(lambda: wire.decode(prefix + struct.pack("<I", 1000) + bomb)) == "too_large"
    assert reason(lambda: wire.decode(prefix + struct.pack("<I", 100 << 20) + bomb)) == "too_large"
    assert reason(lambda: wire.decode(prefix + struct.pack("<I", 1000) + b"\x78\x9c garbage")) == "decompress"
    # header and array tampering
    assert reason(lambda: wire.decode(repack(good, edit_body=lambda b: b + b"x"))) == "length_mismatch"
    assert reason(lambda: wire.decode(repack(good, edit_body=lambda b: b[:2]))) == "truncated"
    assert reason(lambda: wire.decode(repack(good, edit_header=lambda h: {**h, "lengths": [4, 1]}))) == "length_mismatch"
    assert reason(lambda: wire.decode(repack(good, edit_header=lambda h: {**h, "vocab_size": 3}))) == "id_out_of_range"
    assert reason(lambda: wire.decode(repack(good, edit_header=lambda h: {**h, "rewards": [float("nan"), 0.0]}))) == "bad_value"
    assert reason(lambda: wire.decode(repack(good, edit_header=lambda h: {**h, "temperature": float("inf")}))) == "bad_value"
    assert reason(lambda: wire.decode(repack(good, edit_header=lambda h: {**h, "n_escape": 1}))) == "length_mismatch"
    assert reason(lambda: wire.decode(repack(good, edit_header=lambda h: {**h, "text_bytes": [5, 2]}))) in ("length_mismatch",)
    limits = wire.WireLimits(max_completions=1)
    assert reason(lambda: wire.decode(good, limits)) == "too_large"
    assert reason(lambda: wire.decode(good, wire.WireLimits(max_tokens_per_completion=2))) == "bad_value"
    assert reason(lambda: wire.decode(good, wire.WireLimits(max_str_len=0))) == "bad_header"


def test_decode_reason_bad_logprob_and_bad_text():
    lp_escape = small(completions=[WireCompletion([1], [-100.0], "é", 0.0)])   # q = 102400 > 65535
    msg = wire.encode(lp_escape, codec="none")
    # the escaped value is the u32 right before the ids (2 bytes) and text (2 bytes)
    assert reason(lambda: wire.decode(msg[:-8] + struct.pack("<I", 0xFFFFFFFF) + msg[-4:])) == "bad_logprob"
    assert reason(lambda: wire.decode(msg[:-2] + b"\xc3\x28")) == "bad_text"


def test_peek_reads_only_the_prefix():
    r = small(rollout_id=uuid.uuid4().hex)
    p = wire.peek(wire.encode(r))
    assert (p.protocol, p.codec, p.rollout_id) == (wire.PROTOCOL_VERSION, "lzma", r.rollout_id)


# ------------------------------------------------------------------ fuzzing

def _only_wire_errors(data: bytes) -> None:
    # _decode is decode without its last-resort catch-all: every rejection must be a
    # deliberate one, not an accident turned into a WireError.
    try:
        wire._decode(data, wire.DEFAULT_LIMITS)
    except WireError as e:
        assert e.reason in wire.REASONS


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=2000))
def test_fuzz_random_bytes(data):
    _only_wire_errors(data)
    _only_wire_errors(b"FTR\x01\x00" + data)
    _only_wire_errors(b"FTR\x01\x02" + data)


_MSGS = {c: wire.encode(small(), codec=c) for c in ("none", "zlib", "lzma")}


@settings(max_examples=600, deadline=None)
@given(st.sampled_from(sorted(_MSGS)), st.data())
def test_fuzz_mutated_valid_messages(codec, data):
    msg = bytearray(_MSGS[codec])
    for _ in range(data.draw(st.integers(1, 6))):
        i = data.draw(st.integers(0, len(msg) - 1))
        msg[i] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(msg)))
    _only_wire_errors(bytes(msg[:cut]) if data.draw(st.booleans()) else bytes(msg))
