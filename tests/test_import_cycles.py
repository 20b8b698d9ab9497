"""No import cycle in ftis_edge or relay, counting every import statement (module level and
inside functions: a function-level import only hides a cycle until the function runs).

The graph is read from the source with ``ast`` (nothing is imported), an edge per import of
a module of the two packages; ``if TYPE_CHECKING:`` blocks are skipped (never executed). An
import of ``pkg.sub`` is an edge to ``pkg.sub`` only, not to its parent package's __init__.
"""
from __future__ import annotations

import ast
import functools
import subprocess
import sys
from pathlib import Path

from procs import ROOT

PACKAGES = ("ftis_edge", "relay")


def _modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for path in sorted((Path(ROOT) / pkg).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


def _is_type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or \
        (isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING")


def _imports(tree: ast.AST):
    """Every Import/ImportFrom node, skipping ``if TYPE_CHECKING:`` bodies."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and _is_type_checking(node):
            stack.extend(node.orelse)
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        stack.extend(ast.iter_child_nodes(node))


@functools.cache            # read once per session: every test here only reads it
def import_graph() -> dict[str, set[str]]:
    modules = _modules()
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for name, path in modules.items():
        is_pkg = path.name == "__init__.py"
        for node in _imports(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                if node.level:
                    base = name.split(".") if is_pkg else name.split(".")[:-1]
                    base = base[: len(base) - (node.level - 1)]
                    mod = ".".join(base + ([node.module] if node.module else []))
                else:
                    mod = node.module
                # `from pkg import sub` imports the submodule sub; `from mod import name` only mod
                targets = [f"{mod}.{a.name}" if f"{mod}.{a.name}" in modules else mod for a in node.names]
            for t in targets:
                while t and t not in modules:       # `import relay.keys.x` -> the longest known prefix
                    t = t.rpartition(".")[0]
                if t and t != name:
                    graph[name].add(t)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index, low, on_stack, stack, out, counter = {}, {}, set(), [], [], [0]
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter[0]
                    counter[0] += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    comp = []
                    while True:
                        m = stack.pop()
                        on_stack.discard(m)
                        comp.append(m)
                        if m == node:
                            break
                    if len(comp) > 1:
                        out.append(sorted(comp))
    return out


def test_the_finder_sees_a_cycle_and_a_function_level_import():
    g = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(g) == [["a", "b", "c"]]
    graph = import_graph()
    assert "ftis_edge.evaluate" in graph["ftis_edge.cli"]          # imported inside _add_eval
    assert "ftis_edge.store.checkpoint" in graph["ftis_edge.store.rundir"]
    assert "relay.keys" in graph["relay.client"] or "relay.keys" in graph["relay.server"]


def test_no_import_cycle_in_ftis_edge_or_relay():
    found = cycles(import_graph())
    assert found == [], "import cycles: " + "; ".join(" <-> ".join(c) for c in found)


def reaches(graph: dict[str, set[str]], start: str) -> set[str]:
    """Every module ``start`` imports, directly or through others (any import statement)."""
    seen, todo = set(), [start]
    while todo:
        for m in graph[todo.pop()] - seen:
            seen.add(m)
            todo.append(m)
    return seen


# The training core: what a sample is, the objective, the batch, the learner, and intake's checks.
CORE = ("ftis_edge.rollout.samples", "ftis_edge.learn.objective", "ftis_edge.learn.batch", "ftis_edge.learn.learner", "ftis_edge.peers.intake")
# What assembles a node from its settings: the core must never reach it.
ABOVE = ("ftis_edge.config", "ftis_edge.run.node", "ftis_edge.cli", "ftis_edge.peers.swarm", "ftis_edge.store.rundir",
         "ftis_edge.export", "ftis_edge.tui")


def test_the_training_core_sits_below_config():
    graph = import_graph()
    for m in CORE:
        above = {a for a in reaches(graph, m) if a.startswith(ABOVE)}
        assert not above, f"{m} imports {sorted(above)}"
    assert "ftis_edge.learn.learner" not in reaches(graph, "ftis_edge.learn.batch")     # batch: the sample types only
    assert "ftis_edge.learn.batch" not in reaches(graph, "ftis_edge.peers.intake")
    assert "ftis_edge.config" not in reaches(graph, "ftis_edge.metrics.metric_keys")   # the docs generator joins them


# Modules with no tensor in them: importing one must not load torch (seconds, and a GPU driver),
# so intake's checks, the wire format and the relay's socket-free parts stay cheap to run and test.
NO_TORCH = ("ftis_edge.rollout.samples", "ftis_edge.peers.intake", "ftis_edge.rollout.wire", "ftis_edge.metrics.metric_keys", "ftis_edge.learn.fit",
            "ftis_edge.config", "ftis_edge.store.checkpoint", "relay.protocol", "relay.topic", "relay.budget",
            "relay.limits", "relay.auth", "relay.frames", "relay.server", "relay.client")
HEAVY = ("torch", "transformers", "peft", "llama_cpp")


def test_modules_without_tensors_import_no_torch():
    probe = "import importlib, sys; importlib.import_module(sys.argv[1]); print(' '.join(sorted(set(m.split('.')[0] for m in sys.modules))))"
    procs = {m: subprocess.Popen([sys.executable, "-c", probe, m], cwd=ROOT, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True) for m in NO_TORCH}
    for m, p in procs.items():
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, (m, err[-2000:])
        loaded = set(out.split())
        assert not loaded & set(HEAVY), f"importing {m} loads {sorted(loaded & set(HEAVY))}"
    # the probe can fail: the learner does load torch
    out = subprocess.run([sys.executable, "-c", probe, "ftis_edge.learn.learner"], cwd=ROOT, capture_output=True,
                         text=True, timeout=120).stdout
    assert "torch" in out.split()


# --- floors: how many layers the packages stand on ---------------------------------------------
# A subpackage (ftis_edge.tasks, ftis_edge.tui, ftis_edge.generate, relay.keys) is one unit seen
# from outside: its own inner layering is its business. A module's floor is 1 + the highest floor
# it imports (a module importing nothing of the packages: floor 1); the graph's floors are the
# highest. Every import counts, a function-level one too (it runs when the function does).
MAX_FLOORS = 8


def unit(module: str) -> str:
    return ".".join(module.split(".")[:2])


def unit_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for m, targets in graph.items():
        out.setdefault(unit(m), set()).update(unit(t) for t in targets if unit(t) != unit(m))
    return out


def floors(graph: dict[str, set[str]]) -> dict[str, int]:
    """Each unit's floor (the graph must be free of cycles)."""
    out: dict[str, int] = {}

    def floor(m: str) -> int:
        if m not in out:
            out[m] = 1 + max((floor(t) for t in graph[m]), default=0)
        return out[m]
    for m in sorted(graph):
        floor(m)
    return out


def longest_chain(graph: dict[str, set[str]], floor: dict[str, int]) -> list[str]:
    m = max(sorted(graph), key=floor.__getitem__)
    chain = [m]
    while graph[m]:
        m = max(sorted(graph[m]), key=floor.__getitem__)
        chain.append(m)
    return chain


def test_no_import_runs_back_up_into_a_subpackage_and_the_floors_stay_few():
    units = unit_graph(import_graph())
    back_up = cycles(units)        # a subpackage's module importing what imports the subpackage
    assert back_up == [], "imports that run back up: " + "; ".join(" <-> ".join(c) for c in back_up)
    floor = floors(units)
    assert max(floor.values()) <= MAX_FLOORS, " > ".join(longest_chain(units, floor))


if __name__ == "__main__":         # python tests/test_import_cycles.py: the numbers the test holds
    graph = import_graph()
    units = unit_graph(graph)
    back_up = cycles(units)
    floor = floors(units) if not back_up else {}
    print(f"modules {len(graph)}, cycles {len(cycles(graph))}, imports that run back up {len(back_up)}, "
          f"floors {max(floor.values()) if floor else '-'}")
    if floor:
        print("longest chain: " + " > ".join(longest_chain(units, floor)))
