"""The reasoning-gym side of a grader worker: rebuild an item from its id, run the dataset's
own ``score_answer`` on the (untrusted) answer. Imported only inside grader worker processes.

Some verifiers of reasoning-gym 0.1.25 hand the answer to Python's ``eval`` (binary_matrix,
n_queens, spiral_matrix, string_insertion: "is it a Python list?") or to sympy's ``parse_expr``,
which evals too (countdown, puzzle24, the integration datasets): a peer's
``__import__('os').system(...)`` would run on every node that re-grades it. So, for the
duration of a ``score_answer`` call, ``eval`` in the dataset's module means
``ast.literal_eval`` (literals only) and ``parse_expr`` / ``sympify`` accept only arithmetic
over single-letter symbols and a few function names; an audit hook, installed once the
datasets are built, refuses process spawning, sockets and file writes in the worker. The
caller's pre-filter already refuses answers with a dunder. Time is bounded by the worker's
budget, as for math-verify.
"""
from __future__ import annotations

import ast
import os
import re
import sys
import types
from collections import OrderedDict

from .gym_source import Source, build_dataset, parse_id

SAFE_NAMES = frozenset({"sin", "cos", "tan", "exp", "log", "ln", "sqrt", "pi", "Abs", "asin", "acos",
                        "atan", "sinh", "cosh", "tanh", "sec", "csc", "cot", "oo"})
_MATH_TEXT = re.compile(r"[\w\s+\-*/^().,=]*")
_EVAL_NAMES = ("eval", "exec", "compile", "parse_expr", "sympify", "parse_latex")


# MemoryErrors raised while evaluating an answer: verifiers catch every exception and score
# the answer as wrong, so the worker's memory limit (grader.MEMORY_LIMIT_MB) would fire unseen
_memory_hits = [0]


def _counting_memory(fn):
    def call(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except MemoryError:
            _memory_hits[0] += 1
            raise
    return call


@_counting_memory
def _literal_eval(text, *args, **kwargs):
    if not isinstance(text, str) or len(text) > 10_000:
        raise ValueError("not a literal")
    return ast.literal_eval(text)


def _refuse(*args, **kwargs):
    raise ValueError("refused in the grader")


def math_text_ok(text) -> bool:
    """Arithmetic over single letters and a few function names: nothing Python could act on.
    ASCII only: Python folds identifiers by NFKC, so a full-width ``ｆｕｎｃ`` is ``func``."""
    if not isinstance(text, str) or len(text) > 2000 or not text.isascii() or "__" in text \
            or not _MATH_TEXT.fullmatch(text):
        return False
    return all(len(name) == 1 or name in SAFE_NAMES for name in re.findall(r"[A-Za-z_]\w*", text))


def _guarded(original):
    @_counting_memory
    def parse(text, *args, **kwargs):
        if not math_text_ok(text):
            raise ValueError("not an arithmetic expression")
        return original(text, *args, **kwargs)
    return parse


def _names_in(code: types.CodeType) -> set[str]:
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _names_in(const)
    return names


def _module_eval_names(module) -> set[str]:
    """Which evaluating names any function or method defined in ``module`` mentions."""
    found = set()
    for value in vars(module).values():
        funcs = [value] if isinstance(value, types.FunctionType) else \
            [v for v in vars(value).values() if isinstance(v, types.FunctionType)] \
            if isinstance(value, type) and value.__module__ == module.__name__ else []
        for f in funcs:
            found |= _names_in(f.__code__) & set(_EVAL_NAMES)
    return found


class _Sandbox:
    """Rebinds the evaluating names of one dataset module while its verifier runs."""

    def __init__(self, module):
        self.module = module
        self.names = _module_eval_names(module)
        import sympy
        from sympy.parsing import sympy_parser
        self.targets = [(module, n) for n in self.names]
        if self.names & {"parse_expr", "sympify"}:
            self.targets += [(sympy, "parse_expr"), (sympy, "sympify"), (sympy_parser, "parse_expr")]

    def __enter__(self):
        self.saved = [(obj, n, obj.__dict__.get(n, _MISSING)) for obj, n in self.targets]
        for obj, n, old in self.saved:
            if n == "eval":
                setattr(obj, n, _literal_eval)
            elif n in ("exec", "compile"):
                setattr(obj, n, _refuse)
            elif old is not _MISSING:
                setattr(obj, n, _guarded(old))
            else:
                setattr(obj, n, _refuse)
        return self

    def __exit__(self, *exc):
        for obj, n, old in self.saved:
            if old is _MISSING:
                delattr(obj, n)         # the builtin shows through again
            else:
                setattr(obj, n, old)
        return False


_MISSING = object()
_BLOCKED_EVENTS = ("os.system", "os.exec", "os.spawn", "os.posix_spawn", "os.fork", "os.forkpty",
                   "subprocess.Popen", "socket.", "os.remove", "os.unlink", "os.rename", "os.rmdir",
                   "os.mkdir", "os.chmod", "os.kill", "shutil.", "ctypes.", "pty.",
                   # what changes a file without opening it for writing
                   "os.truncate", "os.symlink", "os.link", "os.utime", "os.chown", "os.chflags",
                   "os.lchflags", "os.lchmod", "os.setxattr", "os.removexattr", "os.mkfifo", "os.mknod",
                   "sqlite3.", "_winapi.", "winreg.")
# os.open flags that write, create or truncate (the access mode alone misses O_RDONLY|O_CREAT|O_TRUNC)
_WRITE_FLAGS = 0o3
for _flag in ("O_CREAT", "O_TRUNC", "O_APPEND", "O_EXCL", "O_TMPFILE"):
    _WRITE_FLAGS |= getattr(os, _flag, 0)


def _audit(event: str, args) -> None:
    if event.startswith(_BLOCKED_EVENTS):
        raise PermissionError(f"{event} is not allowed in the grader")
    if event == "open" and len(args) >= 2:
        mode, flags = args[1], (args[2] if len(args) > 2 else 0)
        if (isinstance(mode, str) and any(c in mode for c in "wax+")) \
                or (isinstance(flags, int) and flags & _WRITE_FLAGS):
            raise PermissionError("writing files is not allowed in the grader")


def checker(setup: dict):
    """score(answer, prompt_id) -> float for the worker loop (grader._worker_main)."""
    datasets, sandboxes = {}, {}
    for s in setup["sources"]:
        source = Source(s["dataset"], s["settings"], 1.0, s["size"], s["eval_size"], s["key"])
        ds = datasets[source.tag] = (build_dataset(source), source.size + source.eval_size)
        module = sys.modules[type(ds[0]).__module__]
        sandboxes[source.tag] = _Sandbox(module)
        entry = ds[0][0]
        ds[0].score_answer(str(entry.get("answer")), entry)      # warm the verifier's lazy imports
    sys.addaudithook(_audit)       # from here on: no processes, sockets or file writes
    entries: OrderedDict = OrderedDict()

    def score(answer: str, prompt_id: str) -> float:
        parsed = parse_id(prompt_id)
        if parsed is None or parsed[0] not in datasets or parsed[1] >= datasets[parsed[0]][1]:
            raise KeyError("unknown prompt")
        ds = datasets[parsed[0]][0]
        entry = entries.get(prompt_id)
        if entry is None:
            entry = entries[prompt_id] = ds[parsed[1]]
            if len(entries) > 256:
                entries.popitem(last=False)
        hits = _memory_hits[0]
        with sandboxes[parsed[0]]:
            value = ds.score_answer(answer, entry)
        if _memory_hits[0] != hits:           # the verifier swallowed it: the worker says so (and scores 0)
            raise MemoryError("the answer passed the grader worker's memory limit")
        return float(value) if isinstance(value, (int, float)) else 0.0

    return score

