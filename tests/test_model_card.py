"""The model card says how to use the model outside Ollama: the system prompt and worked examples it
was trained with, a plain llama-cpp-python snippet that uses them (run here, as a user would paste
it), and why the Modelfile's temperature is what it is (a real run, a real export)."""
from __future__ import annotations

import re
import subprocess
import sys

import pytest

from ftis_edge.store.rundir import load_config
from ftis_edge.tasks import task_from_config
from procs import ROOT

pytestmark = [pytest.mark.model, pytest.mark.timeout(1800), pytest.mark.slow]  # ≥ 15 s on 2 cores: CI's slow tier keeps the README command under 20 min


def test_the_card_snippet_runs_with_the_training_prompt(tmp_path, lora_run):
    run, out = lora_run, tmp_path / "export"            # the session's trained run (conftest), read only
    r = subprocess.run([sys.executable, "-m", "ftis_edge.cli", "export", str(run), "--to", str(out), "--quant",
                        "q8_0", "--eval-limit", "0", "--threads", "1"], cwd=ROOT, capture_output=True, text=True,
                       timeout=1200)
    assert r.returncode == 0, r.stderr[-3000:]
    card = (out / "README.md").read_text()
    assert "## Use it without Ollama" in card
    context = task_from_config(load_config(run).task).messages("")[:-1]
    system = next(m["content"] for m in context if m["role"] == "system")
    assert f"```text\n{system}\n```" in card
    modelfile = (out / "Modelfile").read_text()
    t = re.search(r"PARAMETER temperature (\S+)", modelfile).group(1)
    assert f"Why temperature {t} (the Modelfile's `PARAMETER temperature`): it is `task.temperature`" in card
    snippet = re.search(r"```python\n(.*?)```", card, re.S).group(1)
    assert "from llama_cpp import Llama" in snippet and "model-q8_0.gguf" in snippet
    ran = subprocess.run([sys.executable, "-c", snippet.replace("max_tokens=40", "max_tokens=8")], cwd=out,
                         capture_output=True, text=True, timeout=600)
    assert ran.returncode == 0 and ran.stdout.strip(), ran.stderr[-3000:]
