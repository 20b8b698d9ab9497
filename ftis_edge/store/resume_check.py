"""What a ``--resume`` may change, checked before anything loads.

The run directory is the record: its last ``start`` record in metrics.jsonl holds the settings
that last ran (written only once the checkpoint had loaded), and ``config.toml`` beside it
holds the same settings for people to read and edit. A resume continues that record:

* settings the checkpoint's tensors depend on (CHECKPOINT_KEYS: the model and its tokenizer,
  the trainable mode, LoRA rank, alpha and targets) must not change: a different value is
  refused here, in one line per setting (old → new), before any model or checkpoint loads;
* every other setting may change (rounds, threads, eval cadence, the learning rate, the task,
  ...): the changes apply and are listed, the task's with a warning;
* ``config.toml`` is the input of a resume without a node file (``start --run-dir RUN
  --resume``), so an edit there applies. A resume *with* a node file takes the node file's
  settings, so an edit of config.toml that the node file would silently overwrite is refused.
"""
from __future__ import annotations

from pathlib import Path

from ..errors import FtisError

# What a checkpoint's tensors are shaped and scaled by: loading it under other values fails
# (a size mismatch) or, worse for alpha, loads and means something else.
CHECKPOINT_KEYS = ("model.spec", "train.trainable", "train.lora_r", "train.lora_alpha", "train.lora_targets")
# Settings whose change makes the rounds before and after hard to compare: applied with a warning.
WARN_PREFIXES = ("task.",)
# Where the run is and what this machine picks for "auto": never a change of the run's settings.
IGNORED = ("node.run_dir",)
AUTO_KEYS = ("model.backend", "model.device")


class ResumeRefused(FtisError):
    """A resume would change what the checkpoint needs; the message names each setting."""


def _flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for section, values in (d or {}).items():
        if isinstance(values, dict):
            for k, v in values.items():
                out[f"{prefix}{section}.{k}"] = v
    return out


def _same(key: str, old, new) -> bool:
    if key == "model.spec" and isinstance(old, str) and isinstance(new, str) and old != new:
        try:        # ./model from the node file's folder and /abs/model are one model
            return Path(old).expanduser().resolve() == Path(new).expanduser().resolve() and \
                Path(old).expanduser().exists()
        except OSError:
            return False
    if isinstance(old, (list, tuple)) and isinstance(new, (list, tuple)):
        return list(old) == list(new)
    if isinstance(old, (int, float)) and isinstance(new, (int, float)) and not isinstance(old, bool):
        return float(old) == float(new)
    return old == new


def recorded_settings(run_dir: Path) -> dict | None:
    """The settings of the run's last start ({"node.rounds": 30, ...}), or None without one."""
    from ..metrics.records import read_metrics
    for rec in reversed(read_metrics(run_dir)):
        if rec.get("type") == "start" and isinstance(rec.get("config"), dict):
            return _flat(rec["config"])
    return None


def differences(old: dict, new: dict) -> list[tuple[str, object, object]]:
    """(key, old, new) for every setting that differs, in the config's order."""
    out = []
    for key, value in new.items():
        if key in IGNORED or key not in old:
            continue
        if key in AUTO_KEYS and value == "auto":
            continue
        if not _same(key, old[key], value):
            out.append((key, old[key], value))
    return out


def _show(v) -> str:
    return repr(v) if isinstance(v, str) else str(v)


def change_line(key: str, old, new) -> str:
    return f"{key}: {_show(old)} → {_show(new)}"


def check(run_dir: Path, cfg, *, node_file: str | None) -> list[str]:
    """Refuse (ResumeRefused) a resume that changes a CHECKPOINT_KEYS setting or would overwrite
    an edit of config.toml; else the lines saying what changes, for the user and the log."""
    from .rundir import CONFIG_FILE, command_name
    run_dir = Path(run_dir)
    old = recorded_settings(run_dir)
    if old is None:
        return []
    new = _flat(cfg.to_dict())
    if node_file is not None:
        edited = _edits_of_the_record(run_dir, old)
        overwritten = [d for d in edited if not _same(d[0], d[2], new.get(d[0]))]
        if overwritten:
            lines = "; ".join(change_line(*d) for d in overwritten)
            raise ResumeRefused(
                f"{run_dir / CONFIG_FILE} was edited after the run last started ({lines}), and --resume "
                f"with {Path(node_file).resolve()} would replace the edit: resume without the node file to use "
                f"it ({command_name()} start --run-dir {run_dir} --resume), or make the same edit in the node file")
    changes = differences(old, new)
    refused = [d for d in changes if d[0] in CHECKPOINT_KEYS]
    if refused:
        source = Path(node_file).resolve() if node_file else run_dir / CONFIG_FILE
        raise ResumeRefused(
            "--resume: the checkpoint was made with other settings than " + str(source) + " now has:\n"
            + "\n".join(f"  {change_line(*d)}" for d in refused)
            + f"\nput {'it' if len(refused) == 1 else 'them'} back to resume this run, or start a new run with "
              f"the new settings (--run-dir NEW_DIR; --overwrite DELETES this one)")
    lines = []
    for key, was, now in changes:
        warn = " (rewards and held-out accuracy before and after this round are not comparable)" \
            if key.startswith(WARN_PREFIXES) else ""
        lines.append(f"resume changes {change_line(key, was, now)}{warn}")
    return lines


def checkpoint_changes(run_dir: Path, cfg) -> list[str]:
    """"key: old → new" for each CHECKPOINT_KEYS setting in ``cfg`` (RUN/config.toml as read now)
    that differs from what the run's checkpoints were made with (export asks before loading)."""
    old = recorded_settings(Path(run_dir))
    if old is None:
        return []
    return [change_line(*d) for d in differences(old, _flat(cfg.to_dict())) if d[0] in CHECKPOINT_KEYS]


def _edits_of_the_record(run_dir: Path, old: dict) -> list[tuple[str, object, object]]:
    """Settings in config.toml that differ from the last start record: edits by hand."""
    from ..config import ConfigError, load
    from .rundir import CONFIG_FILE
    path = run_dir / CONFIG_FILE
    if not path.is_file():
        return []
    try:
        written = _flat(load(path).to_dict())
    except ConfigError:
        return []
    return differences(old, written)
