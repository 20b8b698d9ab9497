"""The product's tests import only the product (issue 61 item 8): no file under tests/ imports
or runs benchmarks/ or experiments/ code, no benchmark or experiment imports tests/, and what both
sides build lives in testkit/, which imports neither. Tests of the scripts themselves live in
tests_tools/ (run by the same pytest command).

Read from the source with ``ast`` (nothing is imported): every import statement, module level or
inside a function, every module named in a string (``-m benchmarks.attacks.flood``,
``importlib.import_module("experiments.x")``) and every ``sys.path`` entry that names tests/.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from procs import ROOT

TOOLS = ("benchmarks", "experiments")
TESTS = Path(ROOT) / "tests"
# what tests/ offers as importable modules: its helpers (tests/ is on sys.path, not a package)
TEST_MODULES = {"tests", *(p.stem for p in TESTS.glob("*.py"))}


def _strings(tree: ast.AST):
    """String constants that are code, not docstrings."""
    docs = {id(n.body[0].value) for n in ast.walk(tree)
            if isinstance(n, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
            and n.body and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    for n in ast.walk(tree):
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs:
            yield n


def _is_sys_path_call(n: ast.AST) -> bool:
    return (isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in ("append", "insert")
            and ast.unparse(n.func.value) == "sys.path")


def uses(source: str, banned: set[str], *, path_entries: bool = False) -> list[str]:
    """What ``source`` imports or names from the top-level modules in ``banned``, one line each;
    with ``path_entries``, also a sys.path entry that names tests/."""
    tree = ast.parse(source)
    found = []
    for n in ast.walk(tree):
        names = []
        if isinstance(n, ast.Import):
            names = [a.name for a in n.names]
        elif isinstance(n, ast.ImportFrom) and n.level == 0 and n.module:
            names = [n.module]
        found += [f"line {n.lineno}: imports {name}" for name in names if name.split(".")[0] in banned]
        if path_entries and _is_sys_path_call(n) and "tests" in ast.unparse(n):
            found.append(f"line {n.lineno}: puts tests/ on sys.path")
    for s in _strings(tree):
        for word in s.value.split():
            if "." in word and word.split(".")[0] in banned and word.replace(".", "").replace("_", "").isalnum():
                found.append(f"line {s.lineno}: names the module {word}")
    return found


def _offences(folder: str, banned: set[str], **kw) -> dict[str, list[str]]:
    out = {}
    for path in sorted((Path(ROOT) / folder).rglob("*.py")):
        if path.resolve() == Path(__file__).resolve():      # this file's examples below name tools on purpose
            continue
        if found := uses(path.read_text(encoding="utf-8"), banned, **kw):
            out[str(path.relative_to(ROOT))] = found
    return out


def test_product_tests_import_and_run_no_benchmark_or_experiment():
    bad = _offences("tests", set(TOOLS))
    assert not bad, f"product tests that use benchmarks/experiments (move the test to tests_tools/, " \
                    f"what both need to testkit/): {bad}"


@pytest.mark.parametrize("folder", TOOLS)
def test_benchmarks_and_experiments_import_no_tests(folder):
    bad = _offences(folder, TEST_MODULES, path_entries=True)
    assert not bad, f"{folder}/ uses tests/ (what both need belongs in testkit/ or the package): {bad}"


def test_testkit_imports_neither_side():
    assert (Path(ROOT) / "testkit" / "__init__.py").is_file()
    bad = _offences("testkit", set(TOOLS) | TEST_MODULES, path_entries=True)
    assert not bad, f"testkit/ is shared by tests/ and benchmarks/, so it imports neither: {bad}"


@pytest.mark.parametrize("source, says", [
    ("from benchmarks.attacks import cwd_code", "imports benchmarks.attacks"),
    ("import experiments.repro.run as run", "imports experiments.repro.run"),
    ("def f():\n    from experiments import regrade_evals", "line 2: imports experiments"),
    ("cmd = [sys.executable, '-m', 'benchmarks.attacks.flood', '--seconds', '4']", "names the module benchmarks.attacks.flood"),
    ("importlib.import_module('experiments.gym_run')", "names the module experiments.gym_run"),
])
def test_the_check_sees_each_way_of_using_a_tool(source, says):
    found = uses(source, set(TOOLS))
    assert len(found) == 1 and says in found[0], found


def test_the_check_sees_a_benchmark_reaching_into_tests():
    assert uses('sys.path.append(str(ROOT / "tests"))', TEST_MODULES, path_entries=True) == \
        ["line 1: puts tests/ on sys.path"]
    assert uses("from messages import real_rollouts", TEST_MODULES) == ["line 1: imports messages"]
    assert uses("from procs import ROOT", TEST_MODULES) == ["line 1: imports procs"]


def test_the_check_leaves_prose_and_the_product_alone():
    source = ('"""Timed by benchmarks/bench_wire.py; see experiments.repro for the runs."""\n'
              "from ftis_edge.tasks import get_task\nfrom testkit.peers import rollout\n"
              "note = 'the benchmarks are run by hand'\nsys.path.insert(0, str(ROOT))\n")
    assert uses(source, set(TOOLS) | TEST_MODULES, path_entries=True) == []
