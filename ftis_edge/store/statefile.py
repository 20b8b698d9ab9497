"""A nested state (dicts, lists, tuples, tensors, numbers, strings, numpy arrays) as one
safetensors file that nothing can execute when it is read.

Tensors go into the file as tensors; the rest of the structure is JSON in the file's metadata,
with each tensor replaced by a reference to its name. A pickle (``torch.save``) would also
restore arbitrary objects, which is why a shared run directory could run code: this format
restores only the types listed in ``_encode``. Values round-trip exactly (tensors bit for bit,
floats through ``repr``), which a bit-identical resume needs.
"""
from __future__ import annotations

import json
from pathlib import Path

META_KEY = "ftis_state"


class StateFileError(ValueError):
    """The file is not a state this module wrote (or it is damaged); one readable line."""


def _encode(obj, tensors: dict, seen: set):
    import numpy as np     # here, not at import: the CLI and dashboard import checkpoint.py
    import torch
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    if isinstance(obj, torch.Tensor):
        t = obj.detach().cpu()
        # safetensors refuses views and tensors that share memory: give those their own copy
        if not t.is_contiguous() or (t.numel() and t.untyped_storage().data_ptr() in seen):
            t = t.contiguous().clone()
        if t.numel():
            seen.add(t.untyped_storage().data_ptr())
        name = f"t{len(tensors)}"
        tensors[name] = t
        return {"$tensor": name}
    if isinstance(obj, np.ndarray):
        if obj.dtype.kind not in "biuf":
            raise TypeError(f"cannot store a numpy array of dtype {obj.dtype}")
        return {"$ndarray": obj.dtype.str, "shape": list(obj.shape), "data": obj.ravel().tolist()}
    if isinstance(obj, np.generic):
        return {"$npscalar": obj.dtype.str, "value": obj.item()}
    if isinstance(obj, tuple):
        return {"$tuple": [_encode(v, tensors, seen) for v in obj]}
    if isinstance(obj, list):
        return [_encode(v, tensors, seen) for v in obj]
    if isinstance(obj, dict):
        if all(isinstance(k, str) and not k.startswith("$") for k in obj):
            return {k: _encode(v, tensors, seen) for k, v in obj.items()}
        # int keys (an optimiser's per-parameter state) or keys that look like our markers
        return {"$items": [[_encode(k, tensors, seen), _encode(v, tensors, seen)] for k, v in obj.items()]}
    raise TypeError(f"cannot store a {type(obj).__name__} in a state file")


def _decode(obj, tensors: dict):
    import numpy as np
    if isinstance(obj, list):
        return [_decode(v, tensors) for v in obj]
    if not isinstance(obj, dict):
        return obj
    if "$tensor" in obj:
        try:
            return tensors[obj["$tensor"]]
        except (KeyError, TypeError):
            raise StateFileError(f"the state names a tensor {obj['$tensor']!r} the file does not hold") from None
    if "$ndarray" in obj:
        dtype = np.dtype(obj["$ndarray"])
        if dtype.kind not in "biuf":
            raise StateFileError(f"numpy dtype {dtype} is not allowed in a state file")
        return np.asarray(obj["data"], dtype=dtype).reshape(obj["shape"])
    if "$npscalar" in obj:
        dtype = np.dtype(obj["$npscalar"])
        if dtype.kind not in "biuf":
            raise StateFileError(f"numpy dtype {dtype} is not allowed in a state file")
        return dtype.type(obj["value"])
    if "$tuple" in obj:
        return tuple(_decode(v, tensors) for v in obj["$tuple"])
    if "$items" in obj:
        return {_decode(k, tensors): _decode(v, tensors) for k, v in obj["$items"]}
    return {k: _decode(v, tensors) for k, v in obj.items()}


def save(path: Path, state) -> None:
    """Write ``state`` to ``path`` (TypeError for a value this format does not hold)."""
    from safetensors.torch import save_file
    tensors: dict = {}
    structure = _encode(state, tensors, set())
    save_file(tensors, str(path), metadata={META_KEY: json.dumps(structure, allow_nan=True)})


MAX_HEADER = 100 * 2**20        # a state's JSON header: its structure and tensor table, never this large


def check_header(path: Path) -> None:
    """The safetensors header alone (a few reads, no hashing, no tensors): StateFileError unless
    it is a JSON table whose tensors fill the file exactly and whose metadata holds a state."""
    size = Path(path).stat().st_size
    with open(path, "rb") as fh:
        head = fh.read(8)
        if len(head) < 8:
            raise StateFileError("shorter than a safetensors header")
        n = int.from_bytes(head, "little")
        if n > min(MAX_HEADER, size - 8):
            raise StateFileError(f"its header claims {n} bytes")
        try:
            header = json.loads(fh.read(n))
        except ValueError:
            raise StateFileError("its header is not JSON") from None
    if not isinstance(header, dict) or META_KEY not in (header.get("__metadata__") or {}):
        raise StateFileError("a safetensors file without an ftis-edge state in its metadata")
    ends = []
    for k, t in header.items():
        if k == "__metadata__":
            continue
        off = t.get("data_offsets") if isinstance(t, dict) else None
        if not (isinstance(off, list) and len(off) == 2 and all(isinstance(x, int) for x in off)):
            raise StateFileError("a tensor without valid data offsets")
        ends.append(off[1])
    if max(ends, default=0) != size - 8 - n:
        raise StateFileError(f"its tensors take {max(ends, default=0)} bytes, the file holds {size - 8 - n}")


def load(path: Path):
    """What ``save`` wrote; StateFileError when the file is not such a state."""
    from safetensors import SafetensorError, safe_open
    try:
        with safe_open(str(path), framework="pt", device="cpu") as f:
            meta = f.metadata() or {}
            tensors = {name: f.get_tensor(name) for name in f.keys()}
    except (SafetensorError, OSError, ValueError) as e:
        raise StateFileError(f"not a safetensors file ({' '.join(str(e).split())[:160]})") from None
    if META_KEY not in meta:
        raise StateFileError("a safetensors file without an ftis-edge state in its metadata")
    try:
        structure = json.loads(meta[META_KEY])
    except ValueError as e:
        raise StateFileError(f"its state metadata is not JSON ({e})") from None
    try:
        return _decode(structure, tensors)
    except StateFileError:
        raise
    except (TypeError, ValueError, KeyError) as e:
        raise StateFileError(f"its state metadata is malformed ({type(e).__name__}: {e})") from None
