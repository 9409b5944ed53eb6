"""Strict answer grammars for the reasoning-gym scorers that evaluate text: a model's answer reaches them only if it
is written in the task's answer form.

Nine of reasoning-gym's scorers (reasoning-gym 0.1.x, ``score_answer`` of each task) hand the answer string to
something that runs Python:

- sympy's ``parse_expr`` (which ends in ``eval``): ``countdown``, ``puzzle24`` (``parse_expr(answer)``),
  ``polynomial_multiplication`` (``sp.parse_expr(answer)``), ``simple_integration`` and ``intermediate_integration``
  (``sympy.parse_expr(answer, local_dict={var: x, "C": C})``). An answer such as ``open('f', 'w').write('x')`` is a
  valid ``parse_expr`` input: names resolve to Python's builtins.
- ``eval(answer)`` when the answer is not the gold verbatim (partial credit for a Python list):
  ``binary_matrix``, ``spiral_matrix``, ``string_insertion``, ``n_queens``.

(``number_sorting`` evaluates the gold, not the answer; ``propositional_logic``'s ``parse_expr`` is a parser of its
own.) Each task here gets a grammar of its answer form, checked before its scorer runs; an answer outside it is
refused (`refusal` returns the reason) and scores -1 (`reward/refused_rate`):

- ``ARITHMETIC`` tasks (``countdown``, ``puzzle24``): numbers, ``+ - * / ^ **``, parentheses, spaces; no names.
- ``ALGEBRA`` tasks: the same plus the task's variable names (the entry's ``metadata["variable"]`` /
  ``metadata["variables"]``, the names in its gold and integrand), ``C`` for the integration constant, and for the
  integration tasks a fixed list of sympy's elementary functions (`MATH_FUNCTIONS`) and commas (their golds write
  ``Integral(f, x)``). Names are letters and digits only (no ``_``, so no dunder), and each must be one of these.
- ``LITERAL`` tasks (the four ``eval`` ones): text that Python parses as an expression must be a literal (numbers,
  strings, lists, tuples, sets, dicts, a sign; no names, calls, attributes, operators or f-strings); text Python
  cannot parse passes, since ``eval`` then fails at compilation, before anything runs (the golds of these tasks,
  ``1 0 1\\n0 1 0`` or a board of ``_ Q _``, are such text). A bare word is a name: a wrong ``string_insertion``
  answer such as ``ABCDE`` is refused (it scores -1 either way; the gold itself always passes).

All grammars also cap the length (`MAX_CHARS`) and bracket depth (`MAX_DEPTH`), and the expression grammars refuse
powers sympy would spend seconds expanding (`_power_refusal`): a numeric exponent of more than `MAX_EXPONENT_DIGITS`
digits (``99999999999**99999999999``), a number power of more than `MAX_TOWER_DIGITS` digits, which every tower
of numbers beyond a few levels is (``9**9**9**9**9``, ``2^2^2^2^2^2``; ``^`` is read as ``**``), and an exponent
that holds a power and a name (``x**x**x``). What still gets through (``(x + 1)**9999``, which a scorer may expand)
can only cost time and memory: the scoring worker's limits (`dapo_rl.sandbox`) and the pool's time-out bound it,
and these tasks are always scored in a worker (`dapo_rl.reward.pool`).

Nothing here imports sympy or evaluates the answer: the checks are a tokenizer, Python's ``ast`` parser and exact
arithmetic on the answer's numbers, each step bounded before it is taken.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Mapping
from fractions import Fraction
from typing import Any

from dapo_rl.reward.extract import nesting_depth
from dapo_rl.reward.math_verifier import MAX_EXPONENT_DIGITS, MAX_TOWER_DIGITS

ARITHMETIC = frozenset({"countdown", "puzzle24"})
"""reasoning-gym tasks whose answer is an arithmetic expression over numbers (scored with ``parse_expr``)."""

ALGEBRA = frozenset({"polynomial_multiplication", "simple_integration", "intermediate_integration"})
"""reasoning-gym tasks whose answer is an expression in the task's variables (scored with ``parse_expr``)."""

INTEGRATION = frozenset({"simple_integration", "intermediate_integration"})
"""The `ALGEBRA` tasks whose answers may use `MATH_FUNCTIONS`, the constant ``C`` and commas."""

LITERAL = frozenset({"binary_matrix", "spiral_matrix", "string_insertion", "n_queens"})
"""reasoning-gym tasks whose scorer calls ``eval(answer)`` on an answer that is not the gold verbatim."""

EVALUATING_TASKS = ARITHMETIC | ALGEBRA | LITERAL
"""Every reasoning-gym task whose scorer evaluates the answer's text (found by reading each ``score_answer``;
`tests/test_answer_grammar.py` checks the whole registry with an audit hook)."""

MATH_FUNCTIONS = frozenset(
    {
        "sin", "cos", "tan", "cot", "sec", "csc", "asin", "acos", "atan", "acot", "sinh", "cosh", "tanh",
        "asinh", "acosh", "atanh", "exp", "log", "ln", "sqrt", "pi", "E", "Abs", "Integral",
    }
)  # fmt: skip
"""sympy names an integration answer may use (each is a sympy function or constant in ``parse_expr``'s
namespace)."""

MAX_CHARS = 1000
"""Longer answers are refused (the `math` verifier's `MAX_ANSWER_CHARS`)."""

MAX_DEPTH = 30
"""Answers whose brackets nest deeper are refused (the `math` verifier's `MAX_NESTING_DEPTH`)."""

_TOKEN = re.compile(r"\s+|\d+(?:\.\d*)?|\.\d+|[A-Za-z][A-Za-z0-9]*|\*\*|[-+*/^(),]")
_NAME = re.compile(r"[A-Za-z][A-Za-z0-9]*")
_LITERAL_NODES = (
    ast.Expression,
    ast.Constant,
    ast.List,
    ast.Tuple,
    ast.Set,
    ast.Dict,
    ast.UnaryOp,
    ast.UAdd,
    ast.USub,
    ast.Load,
)


def effective_task(task: str, metadata: Mapping[str, Any]) -> str:
    """The task whose scorer runs: reasoning-gym's ``composite`` dataset hands each entry to the scorer of
    ``metadata["source_dataset"]``."""
    if task == "composite":
        return str(metadata.get("source_dataset", task))
    return task


def _names(value: Any) -> set[str]:
    """The names (letters and digits) written in a gold, an integrand or a variable list."""
    if value is None:
        return set()
    if isinstance(value, (list, tuple, set)):
        return set().union(*(_names(v) for v in value)) if value else set()
    return set(_NAME.findall(str(value)))


def allowed_names(task: str, gold: Any, metadata: Mapping[str, Any]) -> frozenset[str]:
    """The names an answer to `task` may use: none for `ARITHMETIC`; for `ALGEBRA` the entry's variables and the
    names in its gold and integrand, plus ``C`` and `MATH_FUNCTIONS` for `INTEGRATION`.

    Args:
        task: the effective reasoning-gym task (`effective_task`).
        gold: the entry's ``answer``.
        metadata: the entry's ``metadata``.
    """
    if task in ARITHMETIC:
        return frozenset()
    names = _names(gold) | _names(metadata.get("variable")) | _names(metadata.get("variables"))
    if task in INTEGRATION:
        names |= _names(metadata.get("integrand")) | {"C"} | MATH_FUNCTIONS
    return frozenset(names)


def _expression_refusal(answer: str, names: frozenset[str], commas: bool) -> str | None:
    pos = 0
    while pos < len(answer):
        m = _TOKEN.match(answer, pos)
        if m is None:
            return f"character {answer[pos]!r} is not part of the answer form"
        tok = m.group()
        if tok == "," and not commas:
            return "',' is not part of the answer form"
        if _NAME.fullmatch(tok) and tok not in names:
            return f"name {tok!r} is not one of the task's names"
        pos = m.end()
    return None


_LOG10_2 = 0.30103


def _digits(q: Fraction) -> float:
    """About how many decimal digits the larger of `q`'s numerator and denominator has (from bit lengths: cheap)."""
    return max(q.numerator.bit_length(), q.denominator.bit_length(), 1) * _LOG10_2


class _TooLarge(Exception):
    """An answer's power would cost sympy more than a moment; its message is the refusal."""


def _value(node: ast.AST) -> Fraction | None:
    """The exact value of a number expression, None where it holds a name (or divides by zero).

    Raises:
        _TooLarge: a power with an exponent of more than `MAX_EXPONENT_DIGITS` digits, a number (a power's above all)
            of more than `MAX_TOWER_DIGITS` digits, or an exponent holding a power whose exponent holds a name
            (``x**x**x``; ``E**(x**2)`` passes).
    """
    if isinstance(node, ast.Constant):
        return Fraction(str(node.value)) if isinstance(node.value, (int, float)) else None
    if isinstance(node, ast.UnaryOp):
        v = _value(node.operand)
        return None if v is None else (-v if isinstance(node.op, ast.USub) else v)
    if isinstance(node, ast.BinOp):
        left, right = _value(node.left), _value(node.right)
        if isinstance(node.op, ast.Pow):
            return _power(left, right, node.right)
        if left is None or right is None:
            return None
        # +, -, * and / of fractions: at most the digits of both sides (x / (1 / y) multiplies; a sum of fractions
        # multiplies denominators), so the same bound as a product holds each step before it is taken
        if isinstance(node.op, (ast.Add, ast.Sub, ast.Mult, ast.Div)) and _digits(left) + _digits(right) > (
            MAX_TOWER_DIGITS
        ):
            raise _TooLarge(f"a number of more than {MAX_TOWER_DIGITS} digits")
        if isinstance(node.op, ast.Div):
            return None if right == 0 else left / right
        ops = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b}
        op = ops.get(type(node.op))
        return None if op is None else op(left, right)
    for child in ast.iter_child_nodes(node):  # names, calls (sin(x)), tuples (Integral(f, x)): check inside
        _value(child)
    return None


def _power(base: Fraction | None, exponent: Fraction | None, exponent_node: ast.AST) -> Fraction | None:
    """``base ** exponent`` when both are numbers and it is small; None when a name leaves it symbolic."""
    if exponent is None:  # symbolic, e.g. E**(8*x**2 - 8*x) as the integration tasks' prompts suggest
        if any(
            isinstance(n, ast.BinOp) and isinstance(n.op, ast.Pow) and _value(n.right) is None
            for n in ast.walk(exponent_node)
        ):
            raise _TooLarge("an exponent with a symbolic power of its own (a power tower)")
        return None
    if abs(exponent) >= 10**MAX_EXPONENT_DIGITS:
        raise _TooLarge(f"an exponent of more than {MAX_EXPONENT_DIGITS} digits")
    if base is None:
        return None
    if _digits(base) * abs(exponent) > MAX_TOWER_DIGITS:
        raise _TooLarge(f"a power of more than {MAX_TOWER_DIGITS} digits")
    if exponent.denominator != 1 or (base == 0 and exponent < 0):
        return None  # irrational, or zoo: nothing large to compute
    return base ** int(exponent)


def _power_refusal(answer: str) -> str | None:
    """Why the powers in an expression answer (already in its grammar) are too large to hand to sympy, or None.

    ``^`` is read as ``**`` (as sympy's ``convert_xor`` does): a scorer that reads it as XOR costs less, never more.
    """
    try:
        tree = ast.parse(answer.replace("^", "**").strip(), mode="eval")
    except SyntaxError:
        return None  # parse_expr fails on it too, before anything is computed
    except (RecursionError, MemoryError, ValueError):
        return "not parsable (too complex)"
    try:
        _value(tree.body)
    except _TooLarge as e:
        return str(e)
    except RecursionError:
        return "not parsable (too complex)"
    return None


def _literal_refusal(answer: str) -> str | None:
    try:
        tree = ast.parse(
            answer.strip(" \t"), mode="eval"
        )  # as eval reads it: it strips spaces and tabs first
    except SyntaxError:
        return None  # eval fails at compilation: nothing runs
    except Exception as e:  # noqa: BLE001 (too deep, too large: refuse rather than guess)
        return f"not parsable ({type(e).__name__})"
    for node in ast.walk(tree):
        if not isinstance(node, _LITERAL_NODES):
            return f"a Python {type(node).__name__} is not a literal"
    return None


def refusal(task: str, answer: str, gold: Any, metadata: Mapping[str, Any] | None = None) -> str | None:
    """Why `answer` may not reach `task`'s scorer, or None when it may.

    Args:
        task: the reasoning-gym task name (``composite`` is resolved through ``metadata["source_dataset"]``).
        answer: the extracted answer, as the scorer would receive it.
        gold: the entry's ``answer`` (its names are allowed; an answer equal to it always passes).
        metadata: the entry's ``metadata`` (variables, integrand); None reads as ``{}``.

    Returns:
        None for tasks not in `EVALUATING_TASKS`, for the gold itself, and for answers in the task's grammar; else a
        one-line reason (``"name 'open' is not one of the task's names"``).
    """
    metadata = metadata or {}
    task = effective_task(task, metadata)
    if task not in EVALUATING_TASKS or answer == gold:
        return None
    if len(answer) > MAX_CHARS:
        return f"longer than {MAX_CHARS} characters"
    if nesting_depth(answer) > MAX_DEPTH:
        return f"brackets nest deeper than {MAX_DEPTH}"
    if task in LITERAL:
        return _literal_refusal(answer)
    return _expression_refusal(answer, allowed_names(task, gold, metadata), commas=task in INTEGRATION) or (
        _power_refusal(answer)
    )
