"""Is a math answer a result, or a computation that math-verify would evaluate for it?

math-verify evaluates ``9 - 4`` to 5, so restating the question was graded as its answer: a Gemma 3
node alone learned to answer ``<answer>9 - 4</answer>`` within 32 rounds (H6 seed 1: 97.5 %
held-out "accuracy" on answers that compute nothing), and a twin found ``⋅`` where ``×`` was
refused. So an answer may not write out more operations on numbers than its reference does.

What counts is read from the text after it is brought to one spelling (``_canonical``): every
sign that multiplies (``× ⋅ ∗ · \\times \\cdot \\ast``…), divides (``÷ ∕ ⁄ \\div \\over``), subtracts
(``− – \\pm``…), ``**``, full-width and superscript digits, wrappers (``\\mathrm{…}``, ``\\mbox{…}``,
``\\mathbf{…}``…) and spacing. Spellings are refused as classes, not lists (issue 62.4: a
spacing command before the operator, or another operator symbol, got arith's own question
through 10 of 10): spacing is every Unicode space and format character and every LaTeX spacing
command (``\\hspace{…}``, ``\\kern…``, ``\\mkern…``, ``\\hskip…``, ``\\phantom{…}``, any
``\\…space``, ``\\…quad``, ``\\…fil``…); an operator is every symbol of Unicode's math, other
and dash classes (Sm, So, Pd, Po) that is not a relation, arrow or value (``⊠ ∘ ⋆ ⋈ ✕``…), and
every LaTeX command that is not a value, relation, structure or function counted below
(``\\boxtimes``, ``\\star``, ``\\circ`` between numbers…). Then one operation each:

* a binary ``+ - * / ^ %`` with a number (or a closing bracket, ``%``, ``!``) before it and a
  number or a numeric command after it (``9-4``, ``(3+3) - 5``, ``2^{10}``, ``7 % 3``);
* a ``\\frac`` / ``\\dfrac`` / ``\\tfrac`` / ``\\cfrac`` that is not two integers in lowest terms
  (nested, decimal or unreduced fractions: ``\\frac{16}{2}``, ``\\frac{4}{8}``, ``\\frac{0.5}{1}``);
* a function: roots, logarithms, binomials, trigonometric, ``gcd``/``lcm``/``max``…, ``!``,
  an absolute value ``|-5|``, a product written ``2(3)``.

Not operations (decided honest, docs/tasks.md): a leading sign; a fraction of two integers in
lowest terms (``1/2``, ``\\frac{3}{4}``: a number written as a fraction); normalized scientific
notation (``1.5 \\times 10^{3}``, ``1.5e3``: mantissa 1 ≤ m < 10, the way a result is written,
not a question restated); a percent sign after a number (``50\\%``); units, also with powers
(``\\mathbf{m}^2``, ``\\text{cm}^3``, ``m/s``): their operands are letters, not numbers.
Decided computations although math-verify accepts them: a power of a number (``2^{10}`` for
1024, ``10^{-3}`` for 0.001) and an unreduced fraction (``\\frac{4}{8}`` for ½) — the arithmetic is
left undone; each is fine when the reference writes it the same way (the counts compare).

Linear-time regular expressions only: answers are peer text.
"""
from __future__ import annotations

import re
import unicodedata
from math import gcd

_SUPERSCRIPT = {"⁰": "0", "¹": "1", "²": "2", "³": "3", "⁴": "4", "⁵": "5", "⁶": "6", "⁷": "7", "⁸": "8",
                "⁹": "9", "⁻": "-", "⁺": "+"}
_SUPERSCRIPT_RUN = re.compile("[" + "".join(_SUPERSCRIPT) + "]+")
# one spelling per operation: what a reader and math-verify both read as that operation
# ÷ stays ÷: a division sign, never a fraction in lowest terms ("3 ÷ 4" restates arith's question)
_SIGNS = {**{c: "*" for c in "×⋅∗·•∙✕✖⨯⨉⊗⊙"}, **{c: "/" for c in "∕⁄"}, "➗": "÷",
          **{c: "-" for c in "−–—―‐‑‒﹣⁃➖"}, **{c: "+" for c in "±∓﹢➕"}}
_SIGN_TABLE = str.maketrans(_SIGNS)
_OP_COMMANDS = {"times": "*", "cdot": "*", "cdotp": "*", "ast": "*", "star": "*", "bullet": "*",
                "centerdot": "*", "otimes": "*", "odot": "*", "div": "÷", "over": "/", "slash": "/",
                "pm": "+", "mp": "+", "bmod": "%", "pmod": "%", "mod": "%"}
_OP_COMMAND = re.compile(r"\\(" + "|".join(sorted(_OP_COMMANDS, key=len, reverse=True)) + r")(?![A-Za-z])")
_WRAPPER = re.compile(r"\\(?:math(?:bin|rm|ord|bf|it|sf|tt|normal|op|cal|bb)|text(?:rm|bf|it|sf|tt|normal|up)?|"
                      r"[mh]box|operatorname\*?|boldsymbol|bm|boxed|fbox|underline|overline)\s*\{([^{}]*)\}")
_DROP = re.compile(r"\\(?:[dt]isplaystyle|textstyle|scriptstyle|left|right|[bB]ig+[lr]?|q?quad|dots|ldots|cdots)"
                   r"(?![A-Za-z])|\\[!,;:> ]|\\\$|\$|~|\^\s*\{?\s*\\circ\s*\}?|°|\{,\}")
# spacing as a class: LaTeX's spacing commands with their argument or dimension, any command
# named for spacing (\thinspace, \negmedspace, \qquad, \hfill, \strut…), and the short ones
# a TeX dimension has a unit: "\vskip 4" is \vskip before the number 4 (math-verify ignores it)
_DIM = r"(?:\s*[-+]?\s*(?:\d+(?:\.\d*)?|\.\d+)\s*(?:pt|em|ex|mu|cm|mm|in|bp|pc|dd|cc|sp|px)(?![A-Za-z]))?"
_SPACING = re.compile(r"\\(?:[hv]space\*?\s*\{[^{}]*\}|[hv]?phantom\s*\{[^{}]*\}|[hvm]?kern" + _DIM
                      + r"|[hvm]?skip" + _DIM + r"(?:\s*(?:plus|minus)" + _DIM + r"(?:fil+)?)*"
                      + r"|[A-Za-z]*(?:space|quad|fil+|strut|break|penalty|relax|vrule|vcenter|vbox)(?![A-Za-z])"
                      + r"|[,;:!> ])")
_COMMAND = re.compile(r"\\([A-Za-z]+)")
_GREEK = frozenset(unicodedata.name(chr(c)).rsplit(" ", 1)[-1].lower() for c in range(0x3B1, 0x3CA)) - {"final"}
# what a command between two numbers may be without being an operation: values, relations,
# structure; the functions and fractions are counted on their own below
_NOT_OPERATORS = _GREEK | {g.capitalize() for g in _GREEK} | {"var" + g for g in _GREEK} | {
    "infty", "emptyset", "varnothing", "degree", "prime", "partial", "hbar", "ell", "imath", "jmath",
    "le", "leq", "ge", "geq", "ne", "neq", "lt", "gt", "approx", "equiv", "sim", "simeq", "cong", "propto",
    "in", "notin", "ni", "subset", "subseteq", "supset", "supseteq", "to", "gets", "mapsto", "implies", "iff",
    "rightarrow", "leftarrow", "Rightarrow", "Leftarrow", "leftrightarrow", "Leftrightarrow", "parallel", "perp",
    "begin", "end", "hline", "newline", "cr", "limits", "nolimits", "not", "colon", "vdots", "ddots",
    "frac", "dfrac", "tfrac", "cfrac", "sqrt", "root", "of"}
_BAR = re.compile(r"\\(?:[lr]?vert|[lr]Vert|mid|\|)(?![A-Za-z])")
# 1 <= mantissa < 10 times a power of ten: how a result is written, collapsed to one number
_SCIENTIFIC = re.compile(r"(?<![\d.])[1-9](?:\.\d+)?(?:\s*\*\s*10\s*\^\s*(?:\{\s*[-+]?\s*\d+\s*\}|[-+]?\d+)"
                         r"|[eE][-+]?\d+)(?![\d.])")
_FRAC_CMD = re.compile(r"\\[dtc]?frac(?![A-Za-z])")
_INT_ARG = r"(?:\{\s*([-+]?\s*\d+)\s*\}|\s*(\d))"      # a braced integer, or one digit: \frac{10}2
_PLAIN_FRAC = re.compile(rf"\\[dtc]?frac\s*{_INT_ARG}\s*{_INT_ARG}")
_FUNCTIONS = ("sqrt", "log", "ln", "lg", "exp", "sin", "cos", "tan", "cot", "sec", "csc", "sinh", "cosh", "tanh",
              "arcsin", "arccos", "arctan", "binom", "dbinom", "tbinom", "choose", "sum", "prod", "int", "lim",
              "max", "min", "gcd", "lcm", "det", "floor", "ceil", "lfloor", "lceil", "abs")
_FUNCTION_NAMES = frozenset(_FUNCTIONS)
_FUNCTION = re.compile(r"\\(?:" + "|".join(sorted(_FUNCTIONS, key=len, reverse=True)) + r")(?![A-Za-z])"
                       r"|(?<![A-Za-z\\])(?:" + "|".join(sorted(_FUNCTIONS, key=len, reverse=True)) + r")(?=\s*\()")
_ROOT_OR_FACTORIAL = re.compile(r"[√∛∜]|(?:\d|[)\]}])\s*!")
_ABS = re.compile(r"\|(?=\s*[-+]?\s*\d)")                 # an opening bar before a number: |-5|
_PRODUCT = re.compile(r"(?:\d|[)\]])\s*[(\[]\s*[-+]?\s*\d|[)\]]\s*\d")   # 2(3), (2)(3), (2)3
_NUMBER = r"\d+(?:\.\d+)?"
# the signs, and the ASCII punctuation math-verify also reads between numbers (12:4 as 3, 12 " 4 as 16)
_BINARY = re.compile(rf"(?:(?<![\d.])({_NUMBER})|[)\]}}%!|])\s*([-+*/^%÷:;\"'#@&?_])"
                     rf"(?=\s*[{{(\[]*\s*[-+]?\s*(?:({_NUMBER})|\\[A-Za-z]))")


def _canonical(text: str) -> str:
    """The answer in one spelling of each number and operation (see the module docstring)."""
    text = _SUPERSCRIPT_RUN.sub(lambda m: "^{" + "".join(_SUPERSCRIPT[c] for c in m.group()) + "}", text)
    text = unicodedata.normalize("NFKC", text)          # full-width digits and signs, ½ -> 1⁄2
    text = text.translate(_SIGN_TABLE).replace("**", "^")
    text = _OP_COMMAND.sub(lambda m: " " + _OP_COMMANDS[m.group(1)] + " ", text)
    text = _BAR.sub("|", text.replace("\\%", "%"))
    text = _SPACING.sub(" ", text)
    for _ in range(3):                                    # \mathrm{\mathbf{m}}: a few levels
        text = _WRAPPER.sub(r"\1", text)
    text = _DROP.sub(" ", text)
    text = _COMMAND.sub(lambda m: m.group() if m.group(1) in _NOT_OPERATORS or m.group(1) in _FUNCTION_NAMES
                        else " * ", text)
    return "".join(_char_class(c) for c in text) if not text.isascii() else text


def _char_class(c: str) -> str:
    """A character as counting reads it: spacing a space, an operator symbol ``*``."""
    if c.isascii() or c in _COUNTED_LATER:
        return c
    cat = unicodedata.category(c)
    if cat in ("Zs", "Zl", "Zp", "Cf", "Cc"):
        return " "
    if cat in ("Sm", "So", "Pd", "Po") and not _RELATION.search(unicodedata.name(c, "")):
        return " * "
    return c


_COUNTED_LATER = "÷√∛∜"                   # a division sign; roots (_ROOT_OR_FACTORIAL)
# relations, arrows and values among the symbol classes: not operations
_RELATION = re.compile(r"EQUAL|LESS|GREATER|EQUIVALENT|APPROX|ASYMPTOTIC|TILDE|SIMILAR|ARROW|INFINITY|ELEMENT|"
                       r"SUBSET|SUPERSET|PROPORTIONAL|PARALLEL|PERPENDICULAR|DEGREE|PRIME|PERCENT|PER MILLE|"
                       r"PER TEN THOUSAND|ELLIPSIS|DITTO|QUOTATION|APOSTROPHE|EXCLAMATION|QUESTION|COMMA|FULL STOP|"
                       r"COLON|SEMICOLON|EMPTY SET|THEREFORE|BECAUSE|NOT SIGN|FOR ALL|THERE EXISTS|DIVIDES$")


def _lowest_terms(numerator: str, denominator: str) -> bool:
    n, d = int(numerator.replace(" ", "")), int(denominator)
    return d > 1 and gcd(n, d) == 1


# two numbers with only space between them: math-verify reads "12 4" (and "12 \quad 4") as 16;
# not a digit group ("12 400", one space, three digits) nor a mixed number's fraction ("3 1/2")
_JUXTAPOSED = re.compile(rf"(?<![\d./])({_NUMBER})(\s+)(?=(\d+)(?:\.\d+)?(?![\d.])(?!\s*/))")


def _juxtaposed(text: str) -> int:
    return sum(not (gap == " " and len(right) == 3 and len(left.split(".")[0]) <= 3 and "." not in left)
               for left, gap, right in _JUXTAPOSED.findall(text))


def computations(text: str) -> int:
    """How many operations on numbers TEXT writes out (see the module docstring)."""
    text = _SCIENTIFIC.sub("1", _canonical(text))
    juxtaposed = _juxtaposed(text)
    plain = [_lowest_terms(n or n1, d or d1) for n, n1, d, d1 in _PLAIN_FRAC.findall(text)]
    count = len(_FRAC_CMD.findall(text)) - sum(plain)
    text = _PLAIN_FRAC.sub(" 1 ", text)                 # counted: now one number
    text = text.replace("{", " ").replace("}", " ")      # grouping only now: 3{\cdot}4, {3}\times{4}
    count += len(_FUNCTION.findall(text)) + len(_ROOT_OR_FACTORIAL.findall(text))
    count += len(_ABS.findall(text)) + len(_PRODUCT.findall(text))
    for left, op, right in _BINARY.findall(text):
        plain_fraction = (op == "/" and left and right and "." not in left + right
                          and _lowest_terms(left, right))
        count += not plain_fraction
    return count + juxtaposed


def computation_refusal(answer: str, reference: str) -> str | None:
    """Why a math answer is a computation rather than its result (None when it is not): it writes
    out more operations on numbers than its reference does ("9 - 4" for 5, "16/2" for 8,
    "\\sqrt{25}" for 5). With working shown ("11 + 6 = 17") the result is what follows the last "="."""
    sides = [side for side in answer.split("=") if side.strip()] or [answer]
    result = sides[-1] if "=" not in reference else answer
    if computations(result) > computations(reference):
        return "a computation, not its result"
    return None
