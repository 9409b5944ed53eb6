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

All grammars also cap the length (`MAX_CHARS`) and bracket depth (`MAX_DEPTH`). What still gets through (``9**9**9**9``
is arithmetic) can only cost time and memory: the scoring worker's limits (`dapo_rl.sandbox`) and the pool's
time-out bound it, and these tasks are always scored in a worker (`dapo_rl.reward.pool`).

Nothing here imports sympy or evaluates anything: the checks are a tokenizer and Python's ``ast`` parser.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Mapping
from typing import Any

from dapo_rl.reward.extract import nesting_depth

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
    return _expression_refusal(answer, allowed_names(task, gold, metadata), commas=task in INTEGRATION)
