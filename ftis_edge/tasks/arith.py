"""arith: procedurally generated arithmetic and short word problems, offline and endless.

A prompt id is everything needed to rebuild it: ``arith/L<level>/<n>`` seeds the generator
with the string "arith/L<level>/<n>" (``random`` hashes string seeds with sha512, so every
machine and Python version builds the same problem). Answers are exact: every problem is an
expression tree evaluated with ``fractions.Fraction``.

Levels (the accuracy of SmolLM2-135M-Instruct on each is in docs/tasks.md):
  1  one step, single digits:            7 + 5, 9 - 4, 3 × 4
  2  one-step word problems (≤ 12):      "Sam has 5 apples and buys 3 more…"
  3  one step, two digits:               47 + 38, 63 - 29, 12 × 7, 84 ÷ 7
  4  two-step word problems
  5  three numbers with precedence / parentheses: (12 + 7) × 3 - 5
  6  fractions and decimals:             1/2 + 1/3, 3/4 of 20, 1.5 + 2.25
"""
from __future__ import annotations

import random
import re
from fractions import Fraction
from typing import Callable, Iterator

from .base import Prompt, Task, TaskError, drawn_stream
from .unseen import distinct_held_out, held_out_by_text

LEVELS = (1, 2, 3, 4, 5, 6)
# SmolLM2-135M-Instruct at T=1, G=8 (benchmarks/calibrate_arith.py, docs/tasks.md): level 1
# 22% correct with 70% of groups mixed, level 2 10% / 30%, level 3 4% / 30%.
DEFAULT_LEVELS = (1, 2)
EVAL_OFFSET = 10**9                 # eval ids live above the training id range
EVAL_PER_LEVEL = 50                 # eval_prompts(None) size per level (fewer where a level has fewer)
HELD_OUT_SALT = "arith"             # the text-space split (unseen.held_out_by_text)

NAMES = ["Sam", "Mia", "Tom", "Ana", "Ben", "Lea", "Max", "Zoe", "Leo", "Ivy", "Raj", "Kim"]
ITEMS = ["apples", "pencils", "stickers", "marbles", "cookies", "books", "cards", "shells"]
THINGS = ["pen", "notebook", "toy car", "ball", "sandwich", "ticket"]

# --- expression trees: ("num", Fraction) or (op, left, right) ------------------------------
OPS = {"+": (1, lambda a, b: a + b), "-": (1, lambda a, b: a - b),
       "*": (2, lambda a, b: a * b), "/": (2, lambda a, b: a / b)}
SHOWN = {"+": "+", "-": "-", "*": "×", "/": "÷"}
OPS_OF = {"add": "+", "sub": "-", "mul": "*", "div": "/"}


def num(value) -> tuple:
    return ("num", Fraction(value))


def evaluate(tree) -> Fraction:
    if tree[0] == "num":
        return tree[1]
    return OPS[tree[0]][1](evaluate(tree[1]), evaluate(tree[2]))


def _fmt_number(x: Fraction, decimals: bool) -> str:
    if x.denominator == 1:
        return str(x.numerator)
    if decimals:
        return _fmt_decimal(x)
    return f"{x.numerator}/{x.denominator}"


def render(tree, python: bool = False, decimals: bool = False) -> str:
    """Infix text with the fewest parentheses; ``python`` uses * and / instead of × and ÷."""
    if tree[0] == "num":
        return _fmt_number(tree[1], decimals)
    op, left, right = tree
    prec = OPS[op][0]

    def side(child, is_right):
        text = render(child, python, decimals)
        if child[0] != "num":
            cprec = OPS[child[0]][0]
            if cprec < prec or (is_right and cprec == prec and op in "-/"):
                return f"({text})"
        elif child[1].denominator != 1 and not decimals and is_right and op == "/":
            return f"({text})"          # 6 ÷ (1/2), not (6 ÷ 1)/2
        return text

    sym = op if python else SHOWN[op]
    return f"{side(left, False)} {sym} {side(right, True)}"


def _fmt_decimal(x: Fraction) -> str:
    """A terminating decimal without trailing zeros (the generators only make those)."""
    sign = "-" if x < 0 else ""
    x = abs(x)
    whole, rest = divmod(x.numerator, x.denominator)
    digits = ""
    while rest and len(digits) < 12:
        rest *= 10
        d, rest = divmod(rest, x.denominator)
        digits += str(d)
    return f"{sign}{whole}.{digits}" if digits else f"{sign}{whole}"


def answer_text(x: Fraction, decimals: bool = False) -> str:
    """The reference string: an integer, a reduced fraction n/d, or a decimal."""
    return _fmt_number(x, decimals)


# --- generators, one per level: rng -> (question, tree, kind) -------------------------------

def _bare(tree, kind: str):
    return f"What is {render(tree)}?", tree, kind


def level1(rng: random.Random):
    kind = rng.choice(["add", "sub", "mul"])
    a, b = rng.randint(1, 9), rng.randint(1, 9)
    if kind == "sub":
        a, b = max(a, b), min(a, b)
    if kind == "mul":
        a, b = rng.randint(2, 5), rng.randint(1, 9)
    return _bare((OPS_OF[kind], num(a), num(b)), kind)


def level2(rng: random.Random):
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    kind = rng.choice(["add", "sub", "mul", "div"])
    a, b = rng.randint(2, 12), rng.randint(2, 12)
    if kind == "add":
        q = f"{name} has {a} {item}. {name} gets {b} more. How many {item} does {name} have now?"
        tree = ("+", num(a), num(b))
    elif kind == "sub":
        a, b = a + b, b
        q = f"{name} had {a} {item} and gave {b} of them to a friend. How many {item} does {name} have left?"
        tree = ("-", num(a), num(b))
    elif kind == "mul":
        a, b = rng.randint(2, 6), rng.randint(2, 9)
        q = f"There are {a} bags with {b} {item} in each bag. How many {item} are there in total?"
        tree = ("*", num(a), num(b))
    else:
        a, b = rng.randint(2, 6), rng.randint(2, 9)
        q = (f"{name} shares {a * b} {item} equally among {a} friends. "
             f"How many {item} does each friend get?")
        tree = ("/", num(a * b), num(a))
    return q, tree, f"word-{kind}"


def level3(rng: random.Random):
    kind = rng.choice(["add", "sub", "mul", "div"])
    if kind in ("add", "sub"):
        a, b = rng.randint(10, 99), rng.randint(10, 99)
        if kind == "sub":
            a, b = max(a, b), min(a, b)
    elif kind == "mul":
        a, b = rng.randint(11, 19), rng.randint(2, 9)
    else:
        b, q = rng.randint(2, 9), rng.randint(3, 15)
        a = b * q
    return _bare((OPS_OF[kind], num(a), num(b)), kind)


def level4(rng: random.Random):
    name, item, thing = rng.choice(NAMES), rng.choice(ITEMS), rng.choice(THINGS)
    kind = rng.randrange(5)
    if kind == 0:
        a, b = rng.randint(2, 6), rng.randint(2, 9)
        c = rng.randint(1, a * b - 1)
        q = (f"{name} buys {a} packs of {item} with {b} {item} in each pack, then gives away {c}. "
             f"How many {item} does {name} have now?")
        tree = ("-", ("*", num(a), num(b)), num(c))
    elif kind == 1:
        a, b = rng.randint(3, 20), rng.randint(2, 15)
        c = rng.randint(1, a + b - 1)
        q = (f"{name} has {a} {item}, buys {b} more and then gives {c} to a friend. "
             f"How many {item} does {name} have now?")
        tree = ("-", ("+", num(a), num(b)), num(c))
    elif kind == 2:
        a, b = rng.randint(2, 9), rng.randint(2, 5)
        bill = next(v for v in (10, 20, 50, 100) if v >= a * b)
        q = (f"A {thing} costs {a} dollars. {name} buys {b} of them and pays with a {bill}-dollar bill. "
             f"How many dollars of change does {name} get?")
        tree = ("-", num(bill), ("*", num(a), num(b)))
    elif kind == 3:
        a, b, c = rng.randint(2, 12), rng.randint(2, 7), rng.randint(2, 20)
        q = (f"{name} reads {a} pages a day for {b} days, then reads {c} more pages. "
             f"How many pages did {name} read in total?")
        tree = ("+", ("*", num(a), num(b)), num(c))
    else:
        b, per, c = rng.randint(2, 6), rng.randint(2, 9), rng.randint(1, 9)
        q = (f"{name} puts {b * per} {item} into {b} boxes, the same number in each box, "
             f"then adds {c} more {item} to the first box. How many {item} are in the first box?")
        tree = ("+", ("/", num(b * per), num(b)), num(c))
    return q, tree, "word-2step"


def level5(rng: random.Random):
    while True:
        ops = [rng.choice("+-*"), rng.choice("+-*/")]
        a, b, c = (num(rng.randint(2, 20)) for _ in range(3))
        tree = (ops[0], (ops[1], a, b), c) if rng.random() < 0.5 else (ops[0], a, (ops[1], b, c))
        value = evaluate(tree)
        if value.denominator == 1 and 0 <= value <= 400:
            return _bare(tree, "3-operand")


def level6(rng: random.Random):
    kind = rng.choice(["frac-add", "frac-of", "dec-add", "dec-mul"])
    if kind == "frac-add":
        a, b = (Fraction(1, rng.randint(2, 6)) * rng.randint(1, 3) for _ in range(2))
        op = rng.choice("+-")
        if op == "-" and a < b:
            a, b = b, a
        return _bare((op, num(a), num(b)), kind)
    if kind == "frac-of":
        den = rng.randint(2, 6)
        frac = Fraction(rng.randint(1, den - 1), den)
        whole = den * rng.randint(2, 10)
        tree = ("*", num(frac), num(whole))
        return f"What is {frac.numerator}/{frac.denominator} of {whole}?", tree, kind
    if kind == "dec-add":
        a, b = (Fraction(rng.randint(1, 99), rng.choice([10, 100])) for _ in range(2))
        op = rng.choice("+-")
        if op == "-" and a < b:
            a, b = b, a
        tree = (op, num(a), num(b))
    else:
        a, b = Fraction(rng.randint(1, 9), 10), num(rng.randint(2, 20))
        tree = ("*", num(a), b)
    return f"What is {render(tree, decimals=True)}?", tree, kind


GENERATORS: dict[int, Callable] = {1: level1, 2: level2, 3: level3, 4: level4, 5: level5, 6: level6}


def make_problem(level: int, n: int) -> Prompt:
    """Problem ``n`` of ``level``: the same on every machine."""
    if level not in GENERATORS:
        raise TaskError(f"arith: unknown level {level}; levels are {', '.join(map(str, LEVELS))}")
    question, tree, kind = GENERATORS[level](random.Random(f"arith/L{level}/{n}"))
    decimals = kind.startswith("dec")
    return Prompt(id=f"arith/L{level}/{n}", question=question,
                  reference=answer_text(evaluate(tree), decimals),
                  meta={"level": level, "kind": kind,
                        "expression": render(tree, python=True, decimals=decimals)})


def parse_levels(level) -> tuple[int, ...]:
    """``level`` as given by a user: None, an int, a list of ints, "2", "1,2,3" or "all"."""
    if level is None:
        return DEFAULT_LEVELS
    if isinstance(level, str):
        if level.strip().lower() == "all":
            return LEVELS
        parts = [p for p in re.split(r"[,\s]+", level.strip()) if p]
        try:
            level = [int(p) for p in parts]
        except ValueError:
            raise TaskError(f"arith: level must be integers like '2' or '1,2,3', got {level!r}") from None
    if isinstance(level, int) and not isinstance(level, bool):
        level = [level]
    if not isinstance(level, (list, tuple)) or not level:
        raise TaskError(f"arith: level must be an int or a list of ints, got {level!r}")
    for lv in level:
        if not isinstance(lv, int) or isinstance(lv, bool) or lv not in GENERATORS:
            raise TaskError(f"arith: unknown level {lv!r}; levels are {', '.join(map(str, LEVELS))}")
    return tuple(level)


class ArithTask(Task):
    """Arithmetic and short word problems at chosen difficulty levels."""

    name = "arith"
    _ID = re.compile(r"arith/L(\d{1,2})/(\d{1,15})")

    def __init__(self, level=None, **options):
        super().__init__(**options)
        self.levels = parse_levels(level)

    def get(self, prompt_id: str) -> Prompt:
        m = self._ID.fullmatch(prompt_id) if isinstance(prompt_id, str) else None
        if not m:
            raise TaskError(f"arith: bad prompt id {prompt_id!r} (expected arith/L<level>/<n>)")
        return make_problem(int(m.group(1)), int(m.group(2)))

    def is_trainable(self, prompt_id: str) -> bool:
        """Training ids are ``n < EVAL_OFFSET`` at any level (peers may train other levels) whose
        question text is not held out: the same text under a training id is the eval question."""
        m = self._ID.fullmatch(prompt_id) if isinstance(prompt_id, str) else None
        if not m or int(m.group(2)) >= EVAL_OFFSET or int(m.group(1)) not in GENERATORS:
            return False
        return not is_held_out(make_problem(int(m.group(1)), int(m.group(2))))

    def prompts(self, seed: int = 0, start: int = 0) -> Iterator[Prompt]:
        return drawn_stream("arith", seed, start, self._training_draw)

    def _training_draw(self, rng: random.Random) -> Prompt | None:
        """One draw of the stream; None for a held-out text (drawn again from a sub-seed)."""
        prompt = make_problem(rng.choice(self.levels), rng.randrange(EVAL_OFFSET))
        return None if is_held_out(prompt) else prompt

    def eval_prompts(self, limit: int | None = None) -> list[Prompt]:
        """Distinct held-out questions, levels in turn (L1 #0, L2 #0, L1 #1, …); a level whose
        text space runs out (level 1 has ~40 held-out questions) leaves the turn to the others."""
        count = EVAL_PER_LEVEL * len(self.levels) if limit is None else max(0, int(limit))
        out, j, live = [], 0, list(self.levels)
        while len(out) < count and live:
            for level in list(live):
                items = eval_level(level, j + 1)
                if len(items) <= j:
                    live.remove(level)
                    continue
                out.append(items[j])
                if len(out) == count:
                    break
            j += 1
        return out


def is_held_out(prompt: Prompt) -> bool:
    return held_out_by_text(prompt.question, HELD_OUT_SALT)


_EVAL_LEVELS: dict[int, tuple[list[Prompt], Iterator[Prompt]]] = {}


def eval_level(level: int, count: int) -> list[Prompt]:
    """The first ``count`` distinct held-out questions of ``level`` (fewer when it has fewer),
    from ids ``n >= EVAL_OFFSET``; grown on demand and kept for the process."""
    if level not in _EVAL_LEVELS:
        draws = distinct_held_out(lambda j: make_problem(level, EVAL_OFFSET + j), lambda p: p.question,
                                  HELD_OUT_SALT)
        _EVAL_LEVELS[level] = ([], iter(draws))
    items, draws = _EVAL_LEVELS[level]
    while len(items) < count:
        nxt = next(draws, None)
        if nxt is None:
            break
        items.append(nxt)
    return items
