"""Learner -> generator weight sync: after each optimiser step, ship the policy to llama.cpp.

Two artefacts, both written by ``gguf_io`` (llama.cpp's own ``gguf`` package):

* a GGUF LoRA adapter (``write_gguf_lora``, ~2 MB, ~10 ms), hot-swapped into the generator;
* a merged GGUF export (``export_merged_gguf``, the model's current weights under the base GGUF's
  metadata; ~7 s, 271 MB F16 for 135M parameters), reloaded by the generator.

``WeightSync`` writes one of them after each optimiser step and tells the generator to use it.
"""
from __future__ import annotations

import logging
from pathlib import Path

# The GGUF writers live in gguf_io; re-exported here because they are what a sync writes.
from ..models.gguf_io import GGUF_MODULE, GGUFError, export_merged_gguf, merged_state_dict, permute_rows, write_gguf_lora
from ..store.rundir import LATEST   # <run>/adapter/latest.gguf: the newest adapter (LoRA) or merged model (full)


# Everything a sync can refuse (a bad mode, a module without a GGUF equivalent, a shape mismatch).
SyncError = GGUFError

__all__ = ["WeightSync", "SyncError", "write_gguf_lora", "export_merged_gguf", "merged_state_dict",
           "permute_rows", "GGUF_MODULE"]


class WeightSync:
    """After each optimiser step, ship the learner's policy to the generator.

    The generator decides how it takes new weights (``generator.sync_weights(self, version)``):
    llama.cpp asks ``export`` for a file; in mode "lora-adapter" it is a GGUF LoRA the generator
    hot-swaps, in mode "merged" a merged GGUF it reloads (full fine-tuning, or exact); mode "auto":
    lora-adapter for a LoRA learner, merged for full fine-tuning. An HF generator samples from
    ``learner.model`` itself: it only records the version and asks ``keep_latest`` for the
    person's copy of a LoRA adapter (``adapter/latest.gguf``).

    Merged exports default to F32: one full fine-tuning step at a realistic lr (1e-5..2e-5) moves most
    weights by well under half an F16 ulp, so an F16 export rounds the update away (measured: 0.026 nats/token
    off PyTorch vs 0.001 for F32; docs/bridge.md). F32 costs 2x the disk, about the same batched speed.
    """

    def __init__(self, learner, generator, *, out_dir, arch: str, n_head: int, n_head_kv: int,
                 base_gguf=None, mode: str = "auto", dtype: str = "f32", keep: int = 2):
        if mode == "auto":
            mode = "lora-adapter" if learner.trainable == "lora" else "merged"
        if mode not in ("lora-adapter", "merged"):
            raise SyncError(f"mode must be 'auto', 'lora-adapter' or 'merged', got {mode!r}")
        if mode == "lora-adapter" and learner.trainable != "lora":
            raise SyncError("mode 'lora-adapter' needs a LoRA learner (full fine-tuning syncs with 'merged')")
        if mode == "merged" and base_gguf is None and generator.loads_weight_files:
            raise SyncError("mode 'merged' needs base_gguf (the GGUF whose metadata the export copies)")
        self.learner, self.generator, self.mode = learner, generator, mode
        self.out_dir = Path(out_dir)
        self.arch, self.n_head, self.n_head_kv = arch, n_head, n_head_kv
        self.base_gguf, self.dtype, self.keep = base_gguf, dtype, max(1, keep)
        self._written: list[Path] = []
        self._synced_version: int | None = None

    @classmethod
    def from_bundle(cls, learner, generator, bundle, out_dir, **kwargs) -> "WeightSync":
        """Build from a ``models.ModelBundle`` (arch, head counts, base GGUF for merged exports;
        an HF model on the llama.cpp backend exports under its converted F16 GGUF; a generator
        that samples from the learner's live model needs no base)."""
        live = not generator.loads_weight_files
        base = bundle.gguf_path if (bundle.gguf_path is not None or live) else bundle.base_gguf()
        return cls(learner, generator, out_dir=out_dir, arch=bundle.arch, n_head=bundle.n_head,
                   n_head_kv=bundle.n_head_kv, base_gguf=base, **kwargs)

    def _publish_latest(self, path: Path) -> None:
        """``<out_dir>/latest.gguf``: a hard link to the newest artefact (a stable name for eval and
        export; survives the clean-up of the versioned file, costs no space). Copy where links fail."""
        import os
        import shutil
        latest = self.out_dir / LATEST
        tmp = self.out_dir / f".{LATEST}.{os.getpid()}.tmp"
        tmp.unlink(missing_ok=True)
        try:
            os.link(path, tmp)
        except OSError:
            shutil.copyfile(path, tmp)
        os.replace(tmp, latest)

    def sync(self, version: int | None = None) -> dict:
        """Hand the current policy to the generator (its ``sync_weights``); returns metrics (seconds, bytes)."""
        version = self.learner.version if version is None else version
        info = self.generator.sync_weights(self, version)
        self._synced_version = version
        while len(self._written) > self.keep:   # older artefacts are no longer loaded anywhere
            self._written.pop(0).unlink(missing_ok=True)
        return info

    def export(self, version: int) -> tuple[Path, bool]:
        """Write the policy as this sync's artefact (GGUF LoRA or merged GGUF); (path, written).

        No optimiser step since the last sync (a round whose groups had no signal): the generator
        already has these weights, so nothing is written (rewriting the same file name would let
        the clean-up in ``sync`` delete the file in use).
        """
        if self._written and self._synced_version == version and self._written[-1].exists():
            return self._written[-1], False
        if self.mode == "lora-adapter":
            path = write_gguf_lora(self.learner.model, self.out_dir / f"adapter-v{version:06d}.gguf",
                                   arch=self.arch, n_head=self.n_head, n_head_kv=self.n_head_kv)
        else:
            path = export_merged_gguf(self.learner.model, self.base_gguf,
                                      self.out_dir / f"merged-v{version:06d}.gguf", dtype=self.dtype)
        self._publish_latest(path)
        if path not in self._written:
            self._written.append(path)
        return path, True

    def keep_latest(self, version: int) -> None:
        """For a generator that needs no file (HF): keep ``latest.gguf`` for a person anyway
        (LoRA only, ~10 ms, ~2 MB; a merged model is what ``ftis-edge export`` is for)."""
        if self.mode != "lora-adapter" or self._synced_version == version:
            return
        try:
            path = write_gguf_lora(self.learner.model, self.out_dir / "adapter-hf.gguf",
                                   arch=self.arch, n_head=self.n_head, n_head_kv=self.n_head_kv)
        except GGUFError as e:      # e.g. LoRA on lm_head: fine for this backend, no GGUF though
            logging.getLogger(__name__).warning("no adapter/%s: %s", LATEST, e)
            return
        self._publish_latest(path)
        path.unlink()
