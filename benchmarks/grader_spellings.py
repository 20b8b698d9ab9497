"""Spellings of an operation generated from classes, not listed (issue 62.4): the grader corpus's
second part, ``tests/data/grader_corpus_generated.jsonl``.

Candidates:

* operator symbols: every Unicode character of the math, other, dash and punctuation symbol
  classes (Sm, So, Pd, Po) and every LaTeX command math-verify's own parser knows (the strings
  of its lexer's rules, and the commands its normalisation names), each written between two
  numbers (``12 X 4`` and ``12X4``);
* spacing: every Unicode space and format character (Zs, Cf), every spacing token of that lexer,
  and LaTeX's spacing primitives (``\\hspace``, ``\\kern``, ``\\mkern``, ``\\hskip``, ``\\phantom``…)
  with each unit, put before or after an operator that restates the question (``12 S - 4``).

math-verify reads each once; a candidate it grades equal to the operation's result (``12 X 4``
as 48, 8, 16, 3 or 20736) is a computation entry (the grader must refuse it). Honest entries: a
result with each spacing around or inside it (``18 S``, ``1 S 000``) that math-verify accepts
(the grader must not refuse it).

    python -m benchmarks.grader_spellings [--out tests/data/grader_corpus_generated.jsonl]

It takes a few minutes (about 20,000 parses); the corpus it writes is committed, and
``benchmarks.grader_corpus --generated`` measures the grader on it.
"""
from __future__ import annotations

import json
import logging
import re
import sys
import unicodedata
from pathlib import Path

from benchmarks.harness import parser

OUT = Path(__file__).resolve().parents[1] / "tests" / "data" / "grader_corpus_generated.jsonl"
PROBES = ((12, 4), (15, 5))        # no result equals an operand: math-verify reading the last number is no operation
OPERATIONS = {"×": lambda a, b: a * b, "−": lambda a, b: a - b, "+": lambda a, b: a + b,
              "÷": lambda a, b: a // b, "^": lambda a, b: a ** b}
BASE_OPERATORS = ("-", "+", "*", "/", "\\times", "\\cdot", "\\div", "×", "÷")
UNITS = ("pt", "em", "mu", "ex")


def unicode_class(categories: tuple[str, ...]) -> list[str]:
    return [chr(c) for c in range(0x21, 0x30000) if unicodedata.category(chr(c)) in categories]


def _lexer_strings() -> dict[str, list[str]]:
    """Every literal string each rule of math-verify's LaTeX lexer accepts (finite ones only)."""
    from antlr4.atn.ATNState import RuleStopState
    from antlr4.atn.Transition import Transition
    from latex2sympy2_extended.gen.antlr4_13_2 import PSLexer as L

    atn = L.PSLexer.atn

    def walk(state, prefix, acc, seen, depth=0):
        if len(acc) > 500 or depth > 60:
            return
        if isinstance(state, RuleStopState):
            acc.add(prefix)
            return
        for t in state.transitions:
            if t.isEpsilon:
                if (t.target.stateNumber, prefix) not in seen:
                    seen.add((t.target.stateNumber, prefix))
                    walk(t.target, prefix, acc, seen, depth + 1)
            elif t.serializationType == Transition.ATOM and len(prefix) < 32:
                walk(t.target, prefix + chr(t.label_), acc, seen, depth + 1)

    out = {}
    for name, start in zip(L.PSLexer.ruleNames, atn.ruleToStartState):
        acc: set[str] = set()
        walk(start, "", acc, set())
        out[name] = sorted(acc)
    return out


def latex_commands() -> list[str]:
    """The commands math-verify knows: its lexer's, and those its normalisation code names."""
    import latex2sympy2_extended
    import math_verify
    found = {s for strings in _lexer_strings().values() for s in strings if re.fullmatch(r"\\[A-Za-z]+", s)}
    for pkg in (latex2sympy2_extended, math_verify):
        for f in Path(pkg.__file__).parent.glob("*.py"):
            found.update("\\" + m for m in re.findall(r"\\\\([A-Za-z]{2,})", f.read_text(encoding="utf-8")))
    return sorted(found)


def spacings() -> list[str]:
    lexer = _lexer_strings()
    tokens = {s for rule in ("THINSPACE", "MEDSPACE", "THICKSPACE", "QUAD", "QQUAD", "NEGTHINSPACE",
                             "NEGMEDSPACE", "NEGTHICKSPACE", "IGNORE") for s in lexer.get(rule, []) if s}
    dims = [f"{v}{u}" for u in UNITS for v in ("1", "0.5", "-1")]
    primitives = ([f"\\hspace{{{d}}}" for d in dims] + [f"\\hspace*{{{d}}}" for d in dims]
                  + [f"\\{k}{d}" for k in ("kern", "hskip") for d in dims if not d.endswith("mu")]
                  + [f"\\{k} {d}" for k in ("mkern", "mskip") for d in dims if d.endswith("mu")]
                  + [f"\\{p}{{0}}" for p in ("phantom", "hphantom", "vphantom")] + ["\\ ", "\\hfill", "\\strut"])
    return sorted(tokens) + primitives + unicode_class(("Zs", "Cf"))


class Reader:
    """math-verify, as the grader calls it, with each answer parsed once."""

    def __init__(self):
        from math_verify import parse, verify

        from ftis_edge.tasks.rewards import _gold, as_latex
        self.parse, self.verify, self.gold, self.as_latex = parse, verify, _gold, as_latex
        self._golds: dict[str, object] = {}

    def accepts(self, answer: str, references: list[str]) -> list[str]:
        """The references math-verify grades `answer` equal to."""
        parsed = [self.parse(self.as_latex(answer), parsing_timeout=None)]
        if not any(c in answer for c in "\\{}$"):
            parsed.append(self.parse(answer, parsing_timeout=None))
        out = []
        for ref in references:
            gold = self._golds.get(ref)
            if gold is None:
                gold = self._golds[ref] = self.gold(ref)
            if any(p and self.verify(gold, p, timeout_seconds=None) for p in parsed):
                out.append(ref)
        return out


def generate() -> list[dict]:
    logging.disable(logging.WARNING)
    read = Reader()
    entries: list[dict] = []

    def restatements(spell, note: str) -> None:
        """`spell(a, b)` for each probe: a computation entry per result math-verify finds in it
        (the later probes only where the first found one: a parse is the cost)."""
        for a, b in PROBES:
            results = {str(f(a, b)): op for op, f in OPERATIONS.items()}
            answer = spell(a, b)
            found = read.accepts(answer, list(results))
            for ref in found:
                entries.append({"kind": "computation", "answer": answer, "reference": ref,
                                "note": f"generated: {note} read as {results[ref]}"})
            if not found:
                return

    for c in unicode_class(("Sm", "So", "Pd", "Po")):
        name = unicodedata.name(c, f"U+{ord(c):04X}")
        restatements(lambda a, b, c=c: f"{a} {c} {b}", f"Unicode {unicodedata.category(c)} {name}")
        restatements(lambda a, b, c=c: f"{a}{c}{b}", f"Unicode {unicodedata.category(c)} {name}, no spaces")
    for cmd in latex_commands():
        restatements(lambda a, b, cmd=cmd: f"{a} {cmd} {b}", f"LaTeX {cmd}")
    for s in spacings():
        shown = s if s.isprintable() and not s.isspace() else f"U+{ord(s):04X}"
        for op in BASE_OPERATORS:
            restatements(lambda a, b, s=s, op=op: f"{a} {s} {op} {b}", f"spacing {shown} before {op}")
            restatements(lambda a, b, s=s, op=op: f"{a} {op}{s} {b}", f"spacing {shown} after {op}")
        for answer, ref in ((f"{s}18", "18"), (f"18{s}", "18"), (f"1{s}000", "1000"), (f"-{s}5", "-5"),
                            (f"2.{s}5", "2.5")):
            if read.accepts(answer, [ref]):
                entries.append({"kind": "honest", "answer": answer, "reference": ref,
                                "note": f"generated: a result with spacing {shown}"})
    seen, unique = set(), []
    for e in entries:
        key = (e["kind"], e["answer"], e["reference"])
        if key not in seen:
            seen.add(key)
            unique.append(e)
    return unique


def main(argv=None) -> int:
    ap = parser(__doc__, result=False)
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args(argv)
    entries = generate()
    args.out.write_text("".join(json.dumps(e, ensure_ascii=False) + "\n" for e in entries), encoding="utf-8")
    kinds = {k: sum(e["kind"] == k for e in entries) for k in ("computation", "honest")}
    print(f"wrote {args.out}: {kinds['computation']} computations and {kinds['honest']} honest results "
          "that math-verify grades correct")
    return 0


if __name__ == "__main__":
    sys.exit(main())
