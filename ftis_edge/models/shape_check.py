"""A model folder's claimed shape against the weights it holds, before anything allocates it.

``config.json`` is a claim: one claiming 200,000 layers over one layer of weights made the
loader allocate until the machine killed it (issue 62.7). The parameters the claim implies
(layers x (4 h^2 + 3 h i) + vocabulary x h, the shape of a decoder) are compared with those
the ``*.safetensors`` headers list (read without loading a tensor); a claim more than 16 times
what the weights hold, and past 16 M parameters (64 MB: nothing to refuse below), is refused
in one line. Vision towers and other sub-models are not claims on the text weights."""
from __future__ import annotations

import json
import math
import re
import struct
from pathlib import Path

MAX_HEADER = 100 << 20             # a safetensors header is KBs (MBs for thousands of tensors)
SLACK_PARAMS = 1 << 24
RATIO = 16
_LAYER = re.compile(r"(?:^|\.)(?:layers|h|blocks|layer)\.(\d+)\.")


def held_shapes(path: Path) -> dict[str, list[int]]:
    """Tensor name -> shape, from each weights file's header; ValueError for a malformed one."""
    shapes: dict[str, list[int]] = {}
    for f in sorted(Path(path).glob("*.safetensors")):
        with open(f, "rb") as fh:
            raw = fh.read(8)
            if len(raw) < 8:
                raise ValueError(f"{f.name} is shorter than a safetensors header")
            (n,) = struct.unpack("<Q", raw)
            if n > min(MAX_HEADER, f.stat().st_size - 8):
                raise ValueError(f"{f.name} claims a header of {n} bytes")
            try:
                header = json.loads(fh.read(n))
            except ValueError:
                raise ValueError(f"{f.name}: its header is not JSON") from None
        for name, meta in header.items() if isinstance(header, dict) else ():
            shape = meta.get("shape") if isinstance(meta, dict) and name != "__metadata__" else None
            if isinstance(shape, list) and all(isinstance(d, int) and d >= 0 for d in shape):
                shapes[name] = shape
    return shapes


def _int(cfg: dict, key: str) -> int:
    v = cfg.get(key)
    return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else 0


def claimed_params(cfg: dict) -> tuple[int, int]:
    """(layers, parameters) a text config claims (its text_config where it has one)."""
    text = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else cfg
    layers, h = _int(text, "num_hidden_layers"), _int(text, "hidden_size")
    inter, vocab = _int(text, "intermediate_size") or 4 * h, _int(text, "vocab_size") or _int(cfg, "vocab_size")
    return layers, layers * (4 * h * h + 3 * h * inter) + vocab * h


def unbacked_claim(path: Path) -> str | None:
    """Why the folder's config claims a model its weights cannot back (None when they can)."""
    path = Path(path)
    try:
        cfg = json.loads((path / "config.json").read_text(encoding="utf-8"))
        shapes = held_shapes(path)
    except (OSError, ValueError) as e:
        return f"unreadable: {e}"
    if not isinstance(cfg, dict):
        return "config.json is not a JSON object"
    layers, claimed = claimed_params(cfg)
    text = {n: s for n, s in shapes.items() if "vision" not in n}
    held = sum(math.prod(s) for s in text.values())
    if claimed <= RATIO * held + SLACK_PARAMS:
        return None
    held_layers = len({int(m.group(1)) for n in text if (m := _LAYER.search(n))})
    return (f"config.json claims {layers:,} layers (about {claimed:,} parameters) over weights holding "
            f"{held:,} parameters in {held_layers:,} layers")
