"""The rollout wire format: what travels between nodes (docs/relay.md, "Wire format").

One message = ONE node's completions for ONE prompt (a whole GRPO group in vertical mode,
or this node's part of a shared group in horizontal mode), so the header cost is shared by
the whole group.

Layout (protocol 3; 2 had task and tokenizer in the body header, 1 no token byte lengths)::

    prefix (uncompressed, read by the relay without decompressing anything; relay/protocol.py)
      b"FTR"            magic
      u8  protocol      PROTOCOL_VERSION
      u8  codec         0 none | 1 zlib | 2 lzma (raw LZMA2, stdlib)
      task, tokenizer_fp, rollout_id: each u8 kind, u8 len, bytes (kind 1 = lowercase hex
                        packed two chars per byte, kind 0 = UTF-8 / ASCII for the id); the
                        task tag and tokenizer fingerprint are only here, so the relay's
                        filters see exactly what a receiver decodes; the id is the dedup key
      u32 body_len      size of the body once decompressed (bomb guard: checked before)
    payload = codec(body)
    body
      u32 header_len, binary header (names, fingerprints, sampler, per-completion lengths,
          text byte lengths, claimed rewards, has-token-bytes flags, finish reasons; see
          _pack_header)
      prompt ids   (optional) W-byte little-endian unsigned ints, W = bytes for vocab_size
      log-probs    q = round(-logp * 1024) as uint16, byte-planar (low bytes, high bytes);
                   q >= 65535 is written as 65535 and its true value follows as uint32
      tokens       all completions concatenated, one record per token: the id, W-byte
                   little-endian, then for completions flagged in the header one u8: how
                   many bytes of the text the token spells (a completion's tokens add up to
                   its text's UTF-8 length; an EOS token spells 0 bytes). A receiver with
                   another tokenizer places the peer's tokens on the text with them
                   (align.py) and weights spans instead of whole sequences.
      text         UTF-8 of all completions concatenated

Why: byte planes put the near-constant high bytes together, which the compressor squeezes
to almost nothing; fixed-point log-probs with step 1/1024 have error <= 4.9e-4 nats and
most sampled tokens are near 0 nats, so their high byte is 0. Measured on real SmolLM2
rollouts (benchmarks/bench_wire.py): ~4.5 B/token with lzma including text and header,
against 8 B/token for int32 id + fp32 log-prob without any text. The token byte lengths
add ~0.25 B/token: next to its id, a token's length repeats with the id, so the compressor
gets most of them from earlier matches (a separate section of lengths cost ~0.37).

`decode` validates everything and raises only `WireError` (a ValueError with `.reason`).
"""
from __future__ import annotations

import lzma
import math
import struct
import time
import uuid
import zlib
from dataclasses import dataclass, field

import numpy as np

from ..errors import FtisError
from relay import protocol as _P   # the prefix layout the relay reads (shared protocol module)

PROTOCOL_VERSION = _P.ROLLOUT_VERSION
MAGIC = _P.ROLLOUT_MAGIC
LOGPROB_SCALE = 1024          # fixed-point step 1/1024 nat -> max error 0.5/1024 = 4.9e-4
LOGPROB_TOLERANCE = 1e-6      # positive log-probs up to this are rounding noise, stored as 0
MIN_LOGPROB = -1.0e4          # anything lower is not a sampled token's log-prob
MAX_TOKEN_BYTES = 255         # a token byte length travels as one u8
_ESCAPE = 0xFFFF
_MAX_Q = int(-MIN_LOGPROB * LOGPROB_SCALE)

CODECS = dict(_P.ROLLOUT_CODECS)
DEFAULT_CODEC = "lzma"
# Small dictionary window and lc=1: payloads are a few KB, mostly binary; the defaults
# (64 MB window, lc=3) cost time per call and ~1% in size (measured on real rollouts).
_LZMA_FILTERS = [{"id": lzma.FILTER_LZMA2, "preset": 9, "dict_size": 1 << 20, "lc": 1, "lp": 0, "pb": 0}]

_U32 = struct.Struct("<I")

# Every reason a received message that does not decode is refused for (WireError.reason, the
# relay prefix's PrefixError too; swarm.py: "sender_mismatch" when the rollout names another node
# than the relay attests; "decode": an error without a reason). tests/test_seams.py checks the list.
REASONS = ("bad_version", "truncated", "too_large", "bad_logprob", "id_out_of_range",
           "length_mismatch", "bad_header", "decompress", "bad_text", "bad_value", "sender_mismatch",
           "decode")


class WireError(FtisError, ValueError):
    """A rollout message that cannot be encoded or accepted; `.reason` is a short code."""

    def __init__(self, reason: str, message: str):
        super().__init__(f"{reason}: {message}")
        self.reason = reason
        self.message = message


@dataclass(frozen=True)
class WireLimits:
    """Upper bounds a receiver enforces (all sizes in bytes unless noted)."""

    max_message_bytes: int = _P.MAX_ROLLOUT_BYTES   # whole encoded message (the relay's cap too)
    max_body_bytes: int = _P.MAX_BODY_BYTES         # decompressed body (decompression-bomb cap)
    max_header_bytes: int = 64 << 10
    max_completions: int = 256              # completions in one rollout
    max_group_size: int = 1024
    max_tokens_per_completion: int = 16384
    max_prompt_tokens: int = 16384
    max_text_bytes: int = 256 << 10         # per completion
    max_str_len: int = 256                  # any string field of the header
    max_vocab_size: int = 1 << 24


DEFAULT_LIMITS = WireLimits()


@dataclass
class WireCompletion:
    """One sampled completion: token ids, their behaviour log-probs, text, claimed reward.

    token_bytes (optional): bytes of `text` each token spells, summing to len(text as UTF-8);
    None when the sender could not place its tokens on the text (receivers with another
    tokenizer then fall back to one sequence-level weight).
    """

    token_ids: np.ndarray           # int, in [0, vocab_size)
    logprobs: np.ndarray            # float32, <= 0, one per token
    text: str
    reward: float                   # claimed by the sender; receivers re-score
    finish_reason: str = "length"   # "stop" | "length"
    token_bytes: np.ndarray | None = None   # int, in [0, MAX_TOKEN_BYTES], one per token

    def __post_init__(self):
        self.token_ids = np.asarray(self.token_ids, dtype=np.int64)
        self.logprobs = np.asarray(self.logprobs, dtype=np.float32)
        if self.token_bytes is not None:
            self.token_bytes = np.asarray(self.token_bytes)   # dtype checked by encode: no silent casts

    @property
    def num_tokens(self) -> int:
        return int(self.token_ids.shape[0])


def new_rollout_id() -> str:
    """A fresh unique rollout id (32 hex chars)."""
    return uuid.uuid4().hex


@dataclass
class Rollout:
    """One node's completions for one prompt, plus what a receiver needs to check them."""

    node_id: str
    swarm: str
    task: str
    prompt_id: str
    completions: list[WireCompletion]
    group_size: int = 0             # total G of the group; 0 -> len(completions)
    group_index: int = 0            # index of this part's first completion in the group
    group_id: str = ""              # identical for all parts of one group; "" -> rollout_id
    round: int = 0
    prompt_ids: list[int] | None = None
    model_fp: str = ""
    tokenizer_fp: str = ""
    model_name: str = ""
    vocab_size: int = 0
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    adapter_version: int = 0
    protocol: int = PROTOCOL_VERSION
    sent_at: float = field(default_factory=time.time)
    rollout_id: str = field(default_factory=new_rollout_id)

    def __post_init__(self):
        if not self.group_size:
            self.group_size = len(self.completions)
        if not self.group_id:
            self.group_id = self.rollout_id

    @property
    def num_completions(self) -> int:
        return len(self.completions)

    @property
    def num_tokens(self) -> int:
        """Completion tokens in this rollout (prompt tokens not counted)."""
        return sum(c.num_tokens for c in self.completions)

    @property
    def rewards(self) -> list[float]:
        return [c.reward for c in self.completions]


# ---------------------------------------------------------------- helpers

def _id_width(vocab_size: int) -> int:
    return 1 if vocab_size <= 1 << 8 else 2 if vocab_size <= 1 << 16 else 3


def _planar(values: np.ndarray, width: int) -> bytes:
    """Unsigned ints as `width` byte planes (all low bytes, then the next bytes, ...)."""
    b = np.ascontiguousarray(values, dtype="<u4").view(np.uint8).reshape(-1, 4)[:, :width]
    return np.ascontiguousarray(b.T).tobytes()


def _unplanar(buf: bytes, n: int, width: int) -> np.ndarray:
    planes = np.frombuffer(buf, dtype=np.uint8).reshape(width, n)
    out = np.zeros(n, dtype=np.uint32)
    for k in range(width):
        out |= planes[k].astype(np.uint32) << np.uint32(8 * k)
    return out


def _packed_ids(values: np.ndarray, width: int) -> bytes:
    """Token ids as `width`-byte little-endian ints, interleaved (measured: compresses
    better than byte planes for ids, since repeated id runs stay contiguous)."""
    b = np.ascontiguousarray(values, dtype="<u4").view(np.uint8).reshape(-1, 4)[:, :width]
    return np.ascontiguousarray(b).tobytes()


def _packed_tokens(ids: np.ndarray, width: int, token_bytes: np.ndarray | None) -> bytes:
    """One completion's token records: the id (`width` bytes), then its byte length (u8) if any."""
    b = np.ascontiguousarray(ids, dtype="<u4").view(np.uint8).reshape(-1, 4)[:, :width]
    if token_bytes is not None:
        b = np.concatenate([b, np.asarray(token_bytes, dtype=np.uint8)[:, None]], axis=1)
    return np.ascontiguousarray(b).tobytes()


def _unpacked_ids(buf: bytes, n: int, width: int) -> np.ndarray:
    b = np.frombuffer(buf, dtype=np.uint8).reshape(n, width)
    out = np.zeros(n, dtype=np.uint32)
    for k in range(width):
        out |= b[:, k].astype(np.uint32) << np.uint32(8 * k)
    return out


def _check_str(name: str, value, limit: int) -> str:
    if not isinstance(value, str):
        raise WireError("bad_header", f"{name} must be a string, got {type(value).__name__}")
    if len(value) > limit:
        raise WireError("bad_header", f"{name} is {len(value)} chars (limit {limit})")
    return value


def _check_int(name: str, value, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise WireError("bad_header", f"{name} must be an integer, got {type(value).__name__}")
    if not lo <= value <= hi:
        raise WireError("bad_value", f"{name}={value} outside [{lo}, {hi}]")
    return value


def _check_float(name: str, value, lo: float, hi: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise WireError("bad_header", f"{name} must be a number, got {type(value).__name__}")
    value = float(value)
    if not math.isfinite(value) or not lo <= value <= hi:
        raise WireError("bad_value", f"{name}={value} is not finite or outside [{lo}, {hi}]")
    return value



# ---------------------------------------------------------------- binary header
# The header is binary, not JSON: on a ~800-token group a JSON header (key names, hex
# fingerprints as text) cost ~0.45 B/token after compression, this one about half.
_STR_FIELDS = ("node_id", "swarm", "prompt_id", "group_id", "model_fp", "model_name")
# (task and tokenizer_fp travel in the prefix, where the relay filters on them)
_NUMS = struct.Struct("<IIQQIdIddIi")   # group_index, group_size, round, adapter_version,
_NUM_FIELDS = ("group_index", "group_size", "round", "adapter_version", "vocab_size",
               "temperature", "top_k", "top_p", "sent_at", "n_escape", "n_prompt")


def _pack_str(value: str) -> bytes:
    """u8 kind (0 UTF-8, 1 lowercase hex packed to bytes), u8 length, bytes (as the prefix's)."""
    try:
        return _P.pack_str(value)
    except _P.PrefixError as e:
        raise WireError(e.reason, e.message) from None


class _Reader:
    """Bounds-checked reads from a buffer; running past the end is a 'truncated' error."""

    def __init__(self, buf: bytes, what: str):
        self.buf, self.off, self.what = buf, 0, what

    def take(self, n: int) -> bytes:
        if n < 0 or self.off + n > len(self.buf):
            raise WireError("truncated", f"{self.what} ends early (need {n} bytes at {self.off})")
        b = self.buf[self.off:self.off + n]
        self.off += n
        return bytes(b)

    def string(self, name: str) -> str:
        kind, n = self.take(2)
        raw = self.take(n)
        if kind == 1:
            return raw.hex()
        if kind != 0:
            raise WireError("bad_header", f"{name}: unknown string kind {kind}")
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise WireError("bad_text", f"{name} is not UTF-8") from None


def _pack_header(h: dict) -> bytes:
    n = len(h["lengths"])
    parts = [struct.pack("<H", n)]
    parts += [_pack_str(h[k]) for k in _STR_FIELDS]
    try:
        parts.append(_NUMS.pack(*(h[k] for k in _NUM_FIELDS)))
        parts.append(struct.pack(f"<{n}I{n}I{n}d{n}B", *h["lengths"], *h["text_bytes"], *h["rewards"],
                                 *h["has_bytes"]))
    except struct.error as e:
        raise WireError("bad_value", f"header number out of range: {e}") from None
    parts += [_pack_str(f) for f in h["finish"]]
    return b"".join(parts)


def _unpack_header(buf: bytes) -> dict:
    r = _Reader(buf, "header")
    (n,) = struct.unpack("<H", r.take(2))
    h = {k: r.string(k) for k in _STR_FIELDS}
    h.update(zip(_NUM_FIELDS, _NUMS.unpack(r.take(_NUMS.size))))
    arrays = struct.unpack(f"<{n}I{n}I{n}d{n}B", r.take(17 * n))
    h["lengths"], h["text_bytes"], h["rewards"], h["has_bytes"] = (
        list(arrays[:n]), list(arrays[n:2 * n]), list(arrays[2 * n:3 * n]), list(arrays[3 * n:]))
    h["finish"] = [r.string(f"finish[{i}]") for i in range(n)]
    if r.off != len(buf):
        raise WireError("length_mismatch", f"header has {len(buf) - r.off} trailing bytes")
    return h

# ---------------------------------------------------------------- encode

def _checked_token_bytes(i: int, token_bytes, shape, text_len: int) -> np.ndarray:
    """A completion's token byte lengths as uint8; WireError unless they add up to its text."""
    tb = np.asarray(token_bytes)
    if tb.shape != shape or (tb.size and not np.issubdtype(tb.dtype, np.integer)):
        raise WireError("length_mismatch", f"completion {i}: token_bytes {tb.shape} {tb.dtype} "
                                           f"for {shape} token ids")
    if tb.size and (tb.min() < 0 or tb.max() > MAX_TOKEN_BYTES):
        raise WireError("bad_value", f"completion {i}: token byte length outside [0, {MAX_TOKEN_BYTES}]")
    if int(tb.sum()) != text_len:
        raise WireError("length_mismatch", f"completion {i}: token byte lengths add up to "
                                           f"{int(tb.sum())}, its text is {text_len} bytes")
    return tb.astype(np.uint8)


def quantize_logprobs(logprobs: np.ndarray) -> np.ndarray:
    """Log-probs -> fixed-point q = round(-logp * 1024) (uint32); WireError on bad values."""
    lp = np.asarray(logprobs, dtype=np.float64)
    if lp.size and not np.all(np.isfinite(lp)):
        raise WireError("bad_logprob", "log-probs must be finite")
    if lp.size and (lp.max() > LOGPROB_TOLERANCE or lp.min() < MIN_LOGPROB):
        raise WireError("bad_logprob", f"log-probs must lie in [{MIN_LOGPROB}, 0], "
                                       f"got [{lp.min():.4g}, {lp.max():.4g}]")
    return np.round(-np.minimum(lp, 0.0) * LOGPROB_SCALE).astype(np.uint32)


def encode(rollout: Rollout, *, codec: str = DEFAULT_CODEC,
           limits: WireLimits = DEFAULT_LIMITS) -> bytes:
    """Serialise a rollout to bytes; raises WireError if it would not pass `decode`."""
    if codec not in CODECS:
        raise WireError("bad_value", f"unknown codec {codec!r} (choose from {sorted(CODECS)})")
    r = rollout
    vocab = _check_int("vocab_size", r.vocab_size, 1, limits.max_vocab_size)
    width = _id_width(vocab)
    rid = _check_str("rollout_id", r.rollout_id, 64)
    if not rid or not rid.isascii() or not rid.isprintable():
        raise WireError("bad_header", "rollout_id must be 1..64 printable ASCII chars")

    ids_parts, q_parts, texts, byte_parts = [], [], [], []
    lengths, text_lens, has_bytes = [], [], []
    for i, c in enumerate(r.completions):
        ids = np.asarray(c.token_ids)
        if ids.ndim != 1 or np.asarray(c.logprobs).shape != ids.shape:
            raise WireError("length_mismatch", f"completion {i}: {ids.shape} ids vs "
                                               f"{np.asarray(c.logprobs).shape} log-probs")
        if ids.size and (ids.min() < 0 or ids.max() >= vocab):
            raise WireError("id_out_of_range", f"completion {i}: token id outside [0, {vocab})")
        ids_parts.append(ids)
        q_parts.append(quantize_logprobs(c.logprobs))
        t = c.text.encode("utf-8")
        texts.append(t)
        lengths.append(int(ids.size))
        text_lens.append(len(t))
        has_bytes.append(int(c.token_bytes is not None))
        byte_parts.append(None if c.token_bytes is None
                          else _checked_token_bytes(i, c.token_bytes, ids.shape, len(t)))
    prompt = None if r.prompt_ids is None else np.asarray(r.prompt_ids, dtype=np.int64)
    if prompt is not None and prompt.size and (prompt.min() < 0 or prompt.max() >= vocab):
        raise WireError("id_out_of_range", f"prompt token id outside [0, {vocab})")

    header = {
        "node_id": r.node_id, "swarm": r.swarm, "task": r.task, "prompt_id": r.prompt_id,
        "group_id": r.group_id, "group_index": r.group_index, "group_size": r.group_size,
        "round": r.round, "model_fp": r.model_fp, "tokenizer_fp": r.tokenizer_fp,
        "model_name": r.model_name, "vocab_size": vocab, "temperature": float(r.temperature),
        "top_k": r.top_k, "top_p": float(r.top_p), "adapter_version": r.adapter_version,
        "sent_at": float(r.sent_at),
        "n_prompt": -1 if prompt is None else int(prompt.size),
        "lengths": lengths, "text_bytes": text_lens,
        "rewards": [float(c.reward) for c in r.completions],
        "finish": [c.finish_reason for c in r.completions],
        "has_bytes": has_bytes,
    }
    all_q = np.concatenate(q_parts) if q_parts else np.zeros(0, np.uint32)
    escapes = all_q[all_q >= _ESCAPE]
    header["n_escape"] = int(escapes.size)
    _validate_fields(header, limits)  # same checks as the receiver: fail at the sender
    hbytes = _pack_header(header)
    parts = [_U32.pack(len(hbytes)), hbytes]
    if prompt is not None:
        parts.append(_packed_ids(prompt, width))
    parts += [_planar(np.minimum(all_q, _ESCAPE), 2), escapes.astype("<u4").tobytes(),
              *(_packed_tokens(ids, width, tb) for ids, tb in zip(ids_parts, byte_parts)), *texts]
    body = b"".join(parts)
    if codec == "zlib":
        payload = zlib.compress(body, 9)
    elif codec == "lzma":
        payload = lzma.compress(body, format=lzma.FORMAT_RAW, filters=_LZMA_FILTERS)
    else:
        payload = body
    try:
        msg = _P.pack_prefix(codec, rid, r.task, r.tokenizer_fp, len(body)) + payload
    except _P.PrefixError as e:
        raise WireError(e.reason, e.message) from None
    if len(msg) > limits.max_message_bytes:
        raise WireError("too_large", f"{len(msg)} bytes > limit {limits.max_message_bytes}")
    return msg


# ---------------------------------------------------------------- decode

Peek = _P.RolloutPrefix     # protocol, codec, rollout_id, body_len, payload_offset, task, tok


def peek(data: bytes, limits: WireLimits = DEFAULT_LIMITS) -> Peek:
    """Parse and check the uncompressed prefix (cheap; the relay does the same)."""
    try:
        return _P.peek_rollout(data, limits.max_message_bytes, limits.max_body_bytes)
    except _P.PrefixError as e:
        raise WireError(e.reason, e.message) from None


def _decompress(codec: str, payload: bytes, body_len: int) -> bytes:
    if codec == "none":
        body = bytes(payload)
    else:
        try:
            # Ask for one byte more than declared: getting it means the stream inflates
            # beyond what the prefix promised (a decompression bomb or a lie).
            if codec == "zlib":
                d = zlib.decompressobj()
                body = d.decompress(payload, body_len + 1)
                finished = d.eof and not d.unused_data
            else:
                d = lzma.LZMADecompressor(format=lzma.FORMAT_RAW, filters=_LZMA_FILTERS)
                body = d.decompress(payload, max_length=body_len + 1)
                finished = d.eof and not d.unused_data
        except (zlib.error, lzma.LZMAError, EOFError, ValueError) as e:
            raise WireError("decompress", f"{codec} payload is corrupt: {e}") from None
        if len(body) > body_len:
            raise WireError("too_large", f"{codec} payload inflates beyond the declared {body_len} bytes")
        if not finished:
            raise WireError("decompress", f"{codec} stream is cut short or has trailing data")
    if len(body) != body_len:
        raise WireError("truncated" if len(body) < body_len else "length_mismatch",
                        f"body is {len(body)} bytes, prefix says {body_len}")
    return body


def _validate_fields(h: dict, limits: WireLimits) -> None:
    """Type, range and length checks on a header dict (shared by encode and decode)."""
    s = limits.max_str_len
    for name in ("node_id", "swarm", "task", "prompt_id", "group_id", "model_fp",
                 "tokenizer_fp", "model_name"):
        _check_str(name, h.get(name), s)
    _check_int("vocab_size", h.get("vocab_size"), 1, limits.max_vocab_size)
    gs = _check_int("group_size", h.get("group_size"), 1, limits.max_group_size)
    gi = _check_int("group_index", h.get("group_index"), 0, gs - 1)
    _check_int("round", h.get("round"), 0, 2**53)
    _check_int("adapter_version", h.get("adapter_version"), 0, 2**53)
    _check_int("top_k", h.get("top_k"), 0, limits.max_vocab_size)
    _check_float("temperature", h.get("temperature"), 0.0, 100.0)
    _check_float("top_p", h.get("top_p"), 0.0, 1.0)
    _check_float("sent_at", h.get("sent_at"), 0.0, 1e11)
    _check_int("n_prompt", h.get("n_prompt"), -1, limits.max_prompt_tokens)
    _check_int("n_escape", h.get("n_escape"), 0, 1 << 40)
    lists = {k: h.get(k) for k in ("lengths", "text_bytes", "rewards", "finish", "has_bytes")}
    for k, v in lists.items():
        if not isinstance(v, list):
            raise WireError("bad_header", f"{k} must be a list")
    n = len(lists["lengths"])
    if n == 0:
        raise WireError("bad_value", "a rollout needs at least one completion")
    if n > limits.max_completions:
        raise WireError("too_large", f"{n} completions > limit {limits.max_completions}")
    if any(len(v) != n for v in lists.values()):
        raise WireError("length_mismatch", "per-completion lists differ in length: "
                        + ", ".join(f"{k}={len(v)}" for k, v in lists.items()))
    if gi + n > gs:
        raise WireError("bad_value", f"group_index {gi} + {n} completions > group_size {gs}")
    for i in range(n):
        _check_int(f"lengths[{i}]", lists["lengths"][i], 0, limits.max_tokens_per_completion)
        _check_int(f"text_bytes[{i}]", lists["text_bytes"][i], 0, limits.max_text_bytes)
        _check_float(f"rewards[{i}]", lists["rewards"][i], -1e6, 1e6)
        _check_str(f"finish[{i}]", lists["finish"][i], 32)
        _check_int(f"has_bytes[{i}]", lists["has_bytes"][i], 0, 1)


def _decode(data: bytes, limits: WireLimits) -> Rollout:
    """The body's sections in the order ``encode`` wrote them: header, prompt ids, log-probs,
    token records (ids + byte lengths), texts; each checked before the next is read."""
    p = peek(data, limits)
    body = _decompress(p.codec, memoryview(data)[p.payload_offset:], p.body_len)
    h, off = _body_header(body, limits)
    h["task"], h["tokenizer_fp"] = p.task, p.tok     # from the prefix (what the relay filtered on)
    _validate_fields(h, limits)
    width = _id_width(h["vocab_size"])
    _check_body_length(h, off, width, len(body))
    prompt_ids, off = _prompt_ids(body, off, h, width)
    logprobs, off = _logprobs(body, off, h)
    ids, token_bytes, off = _token_records(body, off, h, width)
    completions = _completions(body, off, h, ids, logprobs, token_bytes)
    return Rollout(
        rollout_id=p.rollout_id, node_id=h["node_id"], swarm=h["swarm"], task=h["task"],
        prompt_id=h["prompt_id"], prompt_ids=prompt_ids, group_id=h["group_id"],
        group_index=h["group_index"], group_size=h["group_size"], round=h["round"],
        completions=completions, model_fp=h["model_fp"], tokenizer_fp=h["tokenizer_fp"],
        model_name=h["model_name"], vocab_size=h["vocab_size"], temperature=float(h["temperature"]),
        top_k=h["top_k"], top_p=float(h["top_p"]), adapter_version=h["adapter_version"],
        protocol=p.protocol, sent_at=float(h["sent_at"]))


def _body_header(body: bytes, limits: WireLimits) -> tuple[dict, int]:
    """The length-prefixed header and the offset just past it."""
    if len(body) < 4:
        raise WireError("truncated", "body shorter than its header length field")
    (hlen,) = _U32.unpack_from(body, 0)
    if hlen > limits.max_header_bytes:
        raise WireError("too_large", f"header of {hlen} bytes > limit {limits.max_header_bytes}")
    if 4 + hlen > len(body):
        raise WireError("truncated", "body ends inside the header")
    return _unpack_header(body[4:4 + hlen]), 4 + hlen


def _check_body_length(h: dict, header_end: int, width: int, body_len: int) -> None:
    """The header's counts must describe the body to the byte, so no section below reads short."""
    lengths = h["lengths"]
    n_tok = sum(lengths)
    n_bytes = sum(ln for ln, has in zip(lengths, h["has_bytes"]) if has)
    expected = (header_end + width * (max(h["n_prompt"], 0) + n_tok) + 2 * n_tok + 4 * h["n_escape"] + n_bytes
                + sum(h["text_bytes"]))
    if expected != body_len:
        raise WireError("length_mismatch", f"header describes {expected} body bytes, got {body_len}")


def _prompt_ids(body: bytes, off: int, h: dict, width: int) -> tuple[list[int] | None, int]:
    """The prompt's token ids (None when the sender left them out: ``n_prompt`` < 0)."""
    if h["n_prompt"] < 0:
        return None, off
    n_prompt, vocab = h["n_prompt"], h["vocab_size"]
    pids = _unpacked_ids(body[off:off + width * n_prompt], n_prompt, width)
    if n_prompt and int(pids.max()) >= vocab:
        raise WireError("id_out_of_range", f"prompt token id {int(pids.max())} >= vocab_size {vocab}")
    return pids.astype(np.int64).tolist(), off + width * n_prompt


def _logprobs(body: bytes, off: int, h: dict) -> tuple[np.ndarray, int]:
    """Every token's log-prob: u16 fixed point; the escaped ones (-64 nats and below) as u32 after them."""
    n_tok, n_esc = sum(h["lengths"]), h["n_escape"]
    q = _unplanar(body[off:off + 2 * n_tok], n_tok, 2)
    off += 2 * n_tok
    esc_mask = q == _ESCAPE
    if int(esc_mask.sum()) != n_esc:
        raise WireError("length_mismatch", f"{int(esc_mask.sum())} escaped log-probs, header says {n_esc}")
    if n_esc:
        esc = np.frombuffer(body[off:off + 4 * n_esc], dtype="<u4")
        if int(esc.min()) < _ESCAPE or int(esc.max()) > _MAX_Q:
            raise WireError("bad_logprob", f"escaped log-prob outside [{MIN_LOGPROB}, "
                                           f"{-_ESCAPE / LOGPROB_SCALE:.2f}]")
        q[esc_mask] = esc
    return (-q.astype(np.float64) / LOGPROB_SCALE).astype(np.float32), off + 4 * n_esc


def _token_records(body: bytes, off: int, h: dict, width: int) -> tuple[np.ndarray, list, int]:
    """Per completion, a record per token: its id and (when sent) its byte length, which must add
    up to the completion's text."""
    id_parts, token_bytes = [], []
    for i, (ln, has) in enumerate(zip(h["lengths"], h["has_bytes"])):
        rec = width + has
        records = np.frombuffer(body[off:off + rec * ln], dtype=np.uint8).reshape(ln, rec)
        off += rec * ln
        id_parts.append(_unpacked_ids(np.ascontiguousarray(records[:, :width]).tobytes(), ln, width))
        if not has:
            token_bytes.append(None)
            continue
        tb = records[:, width].astype(np.int64)
        if int(tb.sum()) != h["text_bytes"][i]:
            raise WireError("length_mismatch", f"completion {i}: token byte lengths add up to "
                                               f"{int(tb.sum())}, its text is {h['text_bytes'][i]} bytes")
        token_bytes.append(tb)
    ids = np.concatenate(id_parts) if id_parts else np.zeros(0, np.uint32)
    if sum(h["lengths"]) and int(ids.max()) >= h["vocab_size"]:
        raise WireError("id_out_of_range", f"token id {int(ids.max())} >= vocab_size {h['vocab_size']}")
    return ids, token_bytes, off


def _completions(body: bytes, off: int, h: dict, ids: np.ndarray, logprobs: np.ndarray,
                 token_bytes: list) -> list[WireCompletion]:
    """The completions: each one's slice of the ids and log-probs, and its UTF-8 text."""
    completions = []
    tok_off = 0
    for i, ln in enumerate(h["lengths"]):
        tb = h["text_bytes"][i]
        try:
            text = body[off:off + tb].decode("utf-8")
        except UnicodeDecodeError as e:
            raise WireError("bad_text", f"completion {i} text is not UTF-8: {e}") from None
        off += tb
        completions.append(WireCompletion(
            token_ids=ids[tok_off:tok_off + ln].astype(np.int64),
            logprobs=logprobs[tok_off:tok_off + ln], text=text,
            reward=float(h["rewards"][i]), finish_reason=h["finish"][i], token_bytes=token_bytes[i]))
        tok_off += ln
    return completions


def decode(data: bytes, limits: WireLimits = DEFAULT_LIMITS) -> Rollout:
    """Parse and fully validate a message; raises only WireError (with `.reason`)."""
    try:
        return _decode(data, limits)
    except WireError:
        raise
    except (MemoryError, RecursionError) as e:
        raise WireError("too_large", f"message exhausted a resource: {type(e).__name__}") from None
    except Exception as e:  # a malformed input we did not anticipate: still a typed rejection
        raise WireError("bad_header", f"malformed message ({type(e).__name__}: {e})") from None
