"""Two tokenizations of one text, placed on its UTF-8 bytes: the spans they share.

A peer with another tokenizer ships its completion's tokens, per-token log-probs and the byte
length of each token (wire.py). The learner re-tokenizes the same text with its own
tokenizer. Every token covers a run of the text's bytes, so both tokenizations are
partitions of the same byte string; wherever both have a token boundary at the same byte
offset, the bytes before and after are scored separately by both models. Between two
consecutive shared boundaries lies a *span*: the learner's summed log-prob over its tokens
in the span and the peer's summed log-prob over its tokens in the span are log-probs of the
same bytes, so their difference is an honest per-span log importance ratio (objective.py,
level "span"; the math is in docs/ftis.md).

Zero-byte tokens (an end-of-sequence token, control tokens that render as nothing) join the
span that ends at their offset (the first span at offset 0), so a final EOS on both sides
lands in the last span.

Pure functions, except `token_byte_table`, which reads a Hugging Face tokenizer once.
"""
from __future__ import annotations

import bisect
import json
import re
from itertools import accumulate
from typing import Sequence


class AlignError(ValueError):
    """Two tokenizations that cannot be placed on one text (different byte totals, bad lengths)."""


# --------------------------------------------------------------------------- spans

def shared_spans(learner_lens: Sequence[int], peer_lens: Sequence[int]) -> tuple[list[int], list[int], int]:
    """Span index of every learner token and every peer token, and the number of spans.

    learner_lens / peer_lens: byte length of each token (>= 0), in order; both must add up to
    the same total (the text's UTF-8 length). Spans are the byte ranges between consecutive
    byte offsets where both tokenizations have a boundary; a token belongs to the span that
    contains its last byte (a zero-byte token: the span ending at its offset). Every span of
    a non-empty text holds at least one token of each side. An empty text is one span.
    """
    for name, lens in (("learner", learner_lens), ("peer", peer_lens)):
        for i, n in enumerate(lens):
            if isinstance(n, bool) or not isinstance(n, int) or n < 0:
                raise AlignError(f"{name} token {i}: byte length must be an int >= 0, got {n!r}")
    ends_l = list(accumulate(learner_lens))
    ends_p = list(accumulate(peer_lens))
    total_l = ends_l[-1] if ends_l else 0
    total_p = ends_p[-1] if ends_p else 0
    if total_l != total_p:
        raise AlignError(f"the tokenizations cover different texts: {total_l} vs {total_p} bytes")
    shared = sorted((set(ends_l) & set(ends_p)) - {0}) or [0]   # ends with the total
    return ([bisect.bisect_left(shared, e) for e in ends_l],
            [bisect.bisect_left(shared, e) for e in ends_p], len(shared))


def span_sums(span_of_token: Sequence[int], values: Sequence[float], n_spans: int) -> list[float]:
    """Sum of per-token values (log-probs) within each span: [n_spans] floats."""
    if len(span_of_token) != len(values):
        raise AlignError(f"{len(span_of_token)} span indices for {len(values)} values")
    out = [0.0] * n_spans
    for k, v in zip(span_of_token, values):
        if not 0 <= k < n_spans:
            raise AlignError(f"span index {k} outside [0, {n_spans})")
        out[k] += float(v)
    return out


# --------------------------------------------------------------------------- token bytes

_BYTE_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def _byte_level_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet: printable stand-in character -> the byte it encodes."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) \
        + list(range(ord("®"), ord("ÿ") + 1))
    chars, extra = {}, 0
    for b in range(256):
        if b in keep:
            chars[chr(b)] = b
        else:
            chars[chr(256 + extra)] = b
            extra += 1
    return chars


class TokenBytes:
    """The bytes each token id adds to a decoded text, for one Hugging Face tokenizer.

    Byte-level BPE (GPT-2, SmolLM2, Llama 3, Qwen) and SentencePiece-style pieces with byte
    fallback (Gemma, Llama 2: '▁' is a space, '<0xNN>' one raw byte) are understood; other
    decoders raise AlignError. Special tokens render as nothing (llama.cpp's detokenize); a
    text produced with them rendered is matched too (see `lengths`).
    """

    def __init__(self, tokenizer):
        spec = json.loads(tokenizer.backend_tokenizer.to_str())
        decoder = json.dumps(spec.get("decoder"))
        n = len(tokenizer)
        pieces = tokenizer.convert_ids_to_tokens(list(range(n)))
        added = {i: t.content for i, t in tokenizer.added_tokens_decoder.items()}
        self.special = frozenset(tokenizer.all_special_ids)
        if '"ByteLevel"' in decoder:
            table = _byte_level_decoder()
            conv = lambda p: bytes(table[c] for c in p) if all(c in table for c in p) else p.encode()
        elif '"ByteFallback"' in decoder or "\\u2581" in decoder or "▁" in decoder:
            def conv(p):
                m = _BYTE_PIECE.fullmatch(p)
                return bytes([int(m.group(1), 16)]) if m else p.replace("▁", " ").encode()
        else:
            raise AlignError(f"unsupported tokenizer decoder {decoder[:80]}")
        self.table: list[bytes] = []
        for i, p in enumerate(pieces):
            if i in added:
                self.table.append(added[i].encode())
            else:
                self.table.append(b"" if p is None else conv(p))

    def lengths(self, token_ids: Sequence[int], text: str) -> list[int] | None:
        """Byte length of each token such that they add up to `text` exactly, or None.

        None when the tokens do not spell the text byte for byte (a completion cut inside a
        UTF-8 character decodes to U+FFFD; an unknown id; a tokenizer that rewrites text on
        decode): the receiver then falls back to the sequence level.
        """
        target = text.encode("utf-8")
        n = len(self.table)
        if any(not 0 <= int(t) < n for t in token_ids):
            return None
        for render_special in (False, True):
            parts = [b"" if int(t) in self.special and not render_special else self.table[int(t)]
                     for t in token_ids]
            if b"".join(parts) == target:
                return [len(p) for p in parts]
            if not any(int(t) in self.special for t in token_ids):
                break
        return None


# --------------------------------------------------------------------------- a peer sample

def span_alignment(learner_ids: Sequence[int], learner_bytes: TokenBytes, text: str,
                   peer_token_bytes, peer_logprobs: Sequence[float]) -> tuple[list[int], list[float]] | None:
    """What a span-level TrainSample needs: (span index of each learner token, the peer's
    summed log-prob of each span); None when either side cannot be placed on `text` (the
    peer sent no token byte lengths, or the learner's tokens do not spell the text, e.g. a
    re-tokenization cut short): the caller falls back to the sequence level."""
    if peer_token_bytes is None:
        return None
    own = learner_bytes.lengths(learner_ids, text)
    peer = [int(n) for n in peer_token_bytes]
    if own is None or len(peer) != len(peer_logprobs) or sum(peer) != len(text.encode("utf-8")):
        return None
    own_span, peer_span, n = shared_spans(own, peer)
    return own_span, span_sums(peer_span, peer_logprobs, n)
