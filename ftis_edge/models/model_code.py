"""A model folder runs no code: what in an HF model directory would make a loader run Python.

transformers runs a folder's own ``*.py`` when a config names it (``auto_map``) and the caller
passes ``trust_remote_code=True``; llama.cpp's converter does that for the tokenizer of several
architectures, which it picks from ``config.json``'s ``architectures``, not from ``model_type``.
So a folder that says ``model_type: qwen2`` but declares another architecture, or maps its
tokenizer to a file in the folder, ran that file. Model folders arrive inside run directories
people share and from the hub: nothing in one may choose to run code. The user may opt in for
one model by naming it in ``FTIS_TRUST_MODEL_CODE`` (never a setting: a shared run directory's
config.toml must not be able to say it trusts itself).

Two layers: ``refuse_model_code`` reads the folder before any loader sees it (one line naming
what was found and the opt-in), and ``GUARDED_CONVERTER`` runs llama.cpp's converter with
transformers' dynamic-module loader disabled, should a folder find a way past the first.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

TRUST_MODEL_CODE_ENV = "FTIS_TRUST_MODEL_CODE"

# The model classes llama.cpp's converter must be routed to for each supported model_type: any
# other ``architectures`` entry would pick another converter class (some load code).
MODEL_CLASSES = {
    "llama": {"LlamaForCausalLM"},
    "mistral": {"MistralForCausalLM", "LlamaForCausalLM"},
    "qwen2": {"Qwen2ForCausalLM"},
    "qwen3": {"Qwen3ForCausalLM"},
    "gemma3_text": {"Gemma3ForCausalLM"},
    "gemma3": {"Gemma3ForConditionalGeneration", "Gemma3ForCausalLM"},
    "phi3": {"Phi3ForCausalLM"},
}
_MAX_FILES = 10_000        # a folder is read, never walked without end


def trusted(spec: str, path: Path | None = None) -> bool:
    """Whether the user named this model in FTIS_TRUST_MODEL_CODE: a folder by its absolute path
    (compared resolved, with the folder the model was loaded from), a hub id by its name.

    A relative entry (``./model``) names nothing: it would trust whatever folder of that name the
    current directory holds, and every run whose config says ``./model`` would match it as a
    string. A name is matched as a string only when the spec is not a folder here (a hub id)."""
    names = [n.strip() for n in os.environ.get(TRUST_MODEL_CODE_ENV, "").split(os.pathsep) if n.strip()]
    spec_is_folder = _exists(spec)
    for name in names:
        entry = Path(name).expanduser()
        if entry.is_absolute():
            try:
                if path is not None and entry.resolve() == Path(path).resolve():
                    return True
            except OSError:
                continue
        elif not spec_is_folder and not name.startswith(".") and name == spec:
            return True
    return False


def _exists(spec: str) -> bool:
    try:
        return Path(spec).expanduser().exists()
    except (OSError, ValueError):
        return False


def _json(path: Path) -> dict:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return {}
    return data if isinstance(data, dict) else {}


def _sub_configs(cfg: dict) -> list[dict]:
    return [cfg] + [v for k, v in cfg.items() if isinstance(v, dict) and k.endswith("_config")]


def _known_transformers_class(name: str) -> bool:
    import transformers
    try:
        return hasattr(transformers, name) or hasattr(transformers, name + "Fast")
    except Exception:  # noqa: BLE001 - transformers' lazy module raises for broken optional backends
        return False


def code_in_model_dir(path: Path) -> list[str]:
    """What in ``path`` would make some loader run code (empty: nothing found)."""
    path = Path(path)
    found: list[str] = []
    files = []
    for i, f in enumerate(path.rglob("*")):
        if i >= _MAX_FILES:
            found.append(f"more than {_MAX_FILES} files")
            break
        files.append(f)
    py = sorted(str(f.relative_to(path)) for f in files if f.suffix in (".py", ".pyc", ".pyw", ".so"))
    if py:
        found.append("Python code " + ", ".join(py[:3]) + (" ..." if len(py) > 3 else ""))
    for f in sorted(p for p in path.glob("*.json")):
        data = _json(f)
        if any("auto_map" in c for c in _sub_configs(data)):
            found.append(f"{f.name} maps classes to code (auto_map)")
    cfg = _json(path / "config.json")
    for sub in _sub_configs(cfg):
        archs = sub.get("architectures")
        if not archs:
            continue
        model_type = sub.get("model_type") or cfg.get("model_type")
        allowed = MODEL_CLASSES.get(model_type)
        for arch in archs if isinstance(archs, list) else [archs]:
            ok = arch in allowed if allowed is not None else (isinstance(arch, str) and _known_transformers_class(arch))
            if not ok:
                found.append(f"config.json declares architecture {str(arch)[:60]!r}, "
                             f"not one of model_type {str(model_type)[:40]!r}")
    tok_class = _json(path / "tokenizer_config.json").get("tokenizer_class")
    if tok_class is not None and not (isinstance(tok_class, str) and _known_transformers_class(tok_class)):
        found.append(f"tokenizer_config.json names tokenizer class {str(tok_class)[:60]!r}, "
                     f"which transformers does not define (it would be code)")
    return found


def refuse_model_code(path: Path, spec: str, error) -> None:
    """Raise ``error`` (one line) if the folder would run code and the user has not opted in for it."""
    if trusted(spec, path):
        return
    found = code_in_model_dir(path)
    if found:
        # the opt-in first: a long path must not push it past the CLI's one-line limit
        raise error(f"refused to run code from a model folder; if you trust it, run again with "
                    f"{TRUST_MODEL_CODE_ENV}={Path(path).resolve()} (model {spec!r}: {'; '.join(found[:3])})")


# Runs llama.cpp's converter (argv[1]) with transformers' dynamic-module loader replaced by a
# refusal: trust_remote_code=True inside the converter then loads nothing from the folder.
# Runs the converter script named by argv[1] with its own folder first on sys.path, as
# ``python SCRIPT`` would (started through child.python_command: never the current directory).
RUN_CONVERTER = """
import runpy, sys
from pathlib import Path
script = sys.argv[1]
sys.argv = sys.argv[1:]
sys.path.insert(0, str(Path(script).parent))
runpy.run_path(script, run_name="__main__")
"""
GUARDED_CONVERTER = """
import transformers.dynamic_module_utils as dyn
def _refuse(*args, **kwargs):
    raise RuntimeError("ftis-edge refused to run code from the model folder (FTIS_TRUST_MODEL_CODE)")
dyn.get_class_in_module = _refuse
dyn.get_cached_module_file = _refuse
""" + RUN_CONVERTER
