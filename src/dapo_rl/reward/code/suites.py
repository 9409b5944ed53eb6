"""A code row's tests, read from its ground truth in the forms the field uses, and the parent's comparisons.

Forms (`parse_tests`; the ground truth is a dict or its JSON text):

| form | ground truth | run as |
|---|---|---|
| standard input/output (verl `prime_code`, TACO, APPS, CodeContests) | ``{"inputs": [str, ...], "outputs": [str, ...]}`` | the program once per test, the input on stdin; its stdout compared (`stdio_equal`) |
| function calls (TACO/APPS ``fn_name``, LeetCode) | ``{"fn_name": str, "inputs": [[arg, ...], ...], "outputs": [value, ...]}`` | the function called once per test; its value compared (`call_equal`) |
| HumanEval | ``{"prompt": str, "test": str, "entry_point": str}`` (``test`` defines ``check(candidate)``) | the check run against the function's recorded values (`dapo_rl.reward.code.child`) |
| LiveCodeBench / DeepCoder | ``[{"input": str, "output": str, "testtype": "stdin" or "functional"}, ...]`` (+ ``{"fn_name": ...}`` or ``metadata.func_name`` for functional tests) | as the first two forms (a functional input holds one JSON value per line) |

Expected outputs stay in the trainer's process: the sandboxed program gets only the inputs.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dapo_rl.reward.code.child import encode

CODE_SOURCES = (
    "code",
    "codecontests",
    "apps",
    "codeforces",
    "taco",
    "humaneval",
    "mbpp",
    "livecodebench",
    "primeintellect",
    "deepcoder",
    "leetcode",
)
"""``data_source`` values whose rows `reward.name: auto` scores with the code reward (verl routes `codecontests`,
`apps`, `codeforces` and `taco` to code execution; the rest name the code sets `dapo data convert` writes), besides
any ``code/<task>``."""

CODE_PREFIX = "code/"


def is_code_source(data_source: str) -> bool:
    """Whether `auto` scores a row of this ``data_source`` with the code reward (`CODE_SOURCES`, ``code/...``,
    matched without case; ``HumanEval/12``-style names by their first part)."""
    source = str(data_source).lower()
    return source.startswith(CODE_PREFIX) or source.split("/")[0] in CODE_SOURCES


FLOAT_TOL = 1e-6
"""Relative and absolute tolerance of a float comparison (a printed or returned number against the expected one)."""


@dataclass(frozen=True)
class StdioTests:
    """Standard input/output tests: test i feeds ``inputs[i]`` on stdin and expects ``outputs[i]`` on stdout."""

    inputs: tuple[str, ...]
    outputs: tuple[str, ...]

    def __len__(self) -> int:
        return len(self.inputs)


@dataclass(frozen=True)
class CallTests:
    """Function-call tests: test i calls ``fn_name(*args_i, **kwargs_i)`` (``calls[i]``, tagged data as
    `dapo_rl.reward.code.child.encode` writes it) and expects ``outputs[i]`` (plain JSON values). ``wrapped``: the
    TACO/APPS form, whose outputs may hold the value in a one-element list (`call_equal`)."""

    fn_name: str
    calls: tuple[Any, ...]
    outputs: tuple[Any, ...]
    wrapped: bool = False

    def __len__(self) -> int:
        return len(self.calls)


@dataclass(frozen=True)
class CheckTests:
    """A HumanEval-style test: ``check(candidate)`` in ``test``, the function ``entry_point`` of ``prompt``."""

    prompt: str
    test: str
    entry_point: str

    def __len__(self) -> int:
        return 1


TestSuite = StdioTests | CallTests | CheckTests

TEST_TYPES = {
    "stdin": "stdin",
    "stdin_stdout": "stdin",
    "functional": "functional",
    "function_call": "functional",
}
"""A test list's ``testtype`` (or ``type``) values: LiveCodeBench's, rllm's DeepCoder rows', PrimeIntellect's."""


def _text(value: Any, what: str) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(x, str) for x in value):
        return "\n".join(value)
    raise ValueError(f"{what} is {type(value).__name__}, not text (or a list of lines)")


def _call(args: Any) -> list:
    """One call's tagged ``[args, kwargs]`` (a non-list input is the one argument)."""
    return [encode(list(args) if isinstance(args, list) else [args]), encode({})]


def _functional_input(text: str, where: str) -> list:
    """LiveCodeBench's functional input: one JSON value per line, one line per argument."""
    try:
        return [json.loads(line) for line in text.split("\n") if line.strip()]
    except json.JSONDecodeError as e:
        raise ValueError(f"{where}: a functional test's input is not one JSON value per line ({e})") from e


def parse_tests(ground_truth: Any) -> TestSuite:
    """The tests of one code row (see the module docstring for the forms).

    Args:
        ground_truth: the row's ``reward_model.ground_truth``: a dict, a list of test dicts, or the JSON text of one.

    Returns:
        `StdioTests`, `CallTests` or `CheckTests`.

    Raises:
        ValueError: not one of the forms; the message names the field (``inputs``, ``outputs[3]``, ...).
    """
    gt = ground_truth
    if isinstance(gt, (bytes, str)):
        try:
            gt = json.loads(gt)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ValueError(f"the ground truth is not JSON ({e})") from e
    if isinstance(gt, list):
        return _parse_test_list(gt, None)
    if not isinstance(gt, Mapping):
        raise ValueError(f"the ground truth is {type(gt).__name__}, not a dict of tests")
    if "test" in gt or "entry_point" in gt:
        for k in ("prompt", "test", "entry_point"):
            if not isinstance(gt.get(k), str) or (k != "prompt" and not gt[k].strip()):
                raise ValueError(f"a HumanEval-style test needs text in {k!r}")
        if "def check" not in gt["test"]:
            raise ValueError("a HumanEval-style 'test' must define check(candidate)")
        return CheckTests(gt["prompt"], gt["test"], gt["entry_point"].strip())
    if "tests" in gt and isinstance(gt["tests"], list):
        return _parse_test_list(gt["tests"], gt.get("fn_name"))
    for k in ("inputs", "outputs"):
        if not isinstance(gt.get(k), list):
            raise ValueError(f"{k!r} must be a list (got {type(gt.get(k)).__name__})")
    inputs, outputs = gt["inputs"], gt["outputs"]
    if len(inputs) != len(outputs):
        raise ValueError(f"{len(inputs)} inputs for {len(outputs)} outputs")
    if not inputs:
        raise ValueError("no tests ('inputs' is empty)")
    fn = gt.get("fn_name")
    if fn:
        if not isinstance(fn, str) or not fn.isidentifier():
            raise ValueError(f"'fn_name' must be a Python name, not {fn!r}")
        return CallTests(fn, tuple(_call(a) for a in inputs), tuple(outputs), wrapped=True)
    return StdioTests(
        tuple(_text(x, f"inputs[{i}]") for i, x in enumerate(inputs)),
        tuple(_text(x, f"outputs[{i}]") for i, x in enumerate(outputs)),
    )


def _parse_test_list(tests: list, fn_name: Any) -> TestSuite:
    if not tests:
        raise ValueError("no tests (the list is empty)")
    kinds, ins, outs = set(), [], []
    for i, t in enumerate(tests):
        if not isinstance(t, Mapping) or "input" not in t or "output" not in t:
            raise ValueError(f"tests[{i}] must be an object with 'input' and 'output'")
        kind = str(t.get("testtype", t.get("type", "stdin")))
        kind = TEST_TYPES.get(kind, kind)
        if kind not in ("stdin", "functional"):
            raise ValueError(f"tests[{i}].testtype is {kind!r}, not one of {', '.join(TEST_TYPES)}")
        kinds.add(kind)
        meta = t.get("metadata")
        if kind == "functional" and not fn_name:
            fn_name = t.get("fn_name") or (meta.get("func_name") if isinstance(meta, Mapping) else None)
        ins.append(t["input"])
        outs.append(t["output"])
    if len(kinds) > 1:
        raise ValueError("tests mix 'stdin' and 'functional' test types")
    if kinds == {"stdin"}:
        return StdioTests(
            tuple(_text(x, f"tests[{i}].input") for i, x in enumerate(ins)),
            tuple(_text(x, f"tests[{i}].output") for i, x in enumerate(outs)),
        )
    if not isinstance(fn_name, str) or not fn_name.isidentifier():
        raise ValueError("functional tests need 'fn_name' (or metadata.func_name) naming a Python function")
    calls, wanted = [], []
    for i, (x, y) in enumerate(zip(ins, outs)):
        where = f"tests[{i}]"
        args = _functional_input(_text(x, f"{where}.input"), where) if isinstance(x, str) else x
        calls.append(_call(args))
        if isinstance(y, str):
            try:
                y = json.loads(y)
            except json.JSONDecodeError as e:
                raise ValueError(f"{where}.output is not JSON ({e})") from e
        wanted.append(y)
    return CallTests(fn_name, tuple(calls), tuple(wanted))


def _lines(text: str) -> list[str]:
    lines = [line.rstrip() for line in text.replace("\r\n", "\n").split("\n")]
    while lines and not lines[-1]:
        lines.pop()
    return lines


_INT_TOKEN = re.compile(r"[+-]?[0-9]+")
_FLOAT_TOKEN = re.compile(r"[+-]?(?:[0-9]+\.[0-9]*|\.[0-9]+|[0-9]+)(?:[eE][+-]?[0-9]+)?")


def _float_token(token: str) -> float | None:
    """The value of a decimal literal with a point or an exponent (``0.5``, ``1e-9``); None for an integer or
    anything else (ASCII digits only: no ``1_000``, no ``inf``)."""
    if len(token) > 100 or _INT_TOKEN.fullmatch(token) or not _FLOAT_TOKEN.fullmatch(token):
        return None
    return float(token)


def stdio_equal(got: str, want: str, tol: float = FLOAT_TOL) -> bool:
    """Whether a program's stdout answers a test: the same lines (trailing spaces and blank lines at the end
    ignored), or else the same whitespace-separated tokens, where an expected decimal (``0.333333``) accepts a
    number within `tol` (relative or absolute). Integers compare exactly, as text: off by one on ``1000000007`` is
    wrong (verl's ``prime_code`` skips its float check when the tokens are integers; LiveCodeBench compares
    decimals exactly for the same reason).

    Args:
        got: what the program printed.
        want: the expected output.
        tol: the float tolerance.
    """
    if _lines(got) == _lines(want):
        return True
    a, b = got.split(), want.split()
    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        if x == y:
            continue
        fy = _float_token(y)
        fx = None if fy is None else (_float_token(x) or (float(x) if _INT_TOKEN.fullmatch(x) else None))
        if fx is None or not math.isclose(fx, fy, rel_tol=tol, abs_tol=tol):
            return False
    return True


def _plain(v: Any) -> Any:
    """Tuples as lists, at every depth (JSON's outputs have no tuples)."""
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items()}
    return v


def _same(a: Any, b: Any, tol: float) -> bool:
    """`a` (the function's) answers `b` (the expected): a float expected accepts a number within `tol`; everything
    else compares exactly (an expected integer is not met by 1e17 for 100000000000000001)."""
    if isinstance(a, bool) or isinstance(b, bool):
        return a == b and isinstance(a, bool) == isinstance(b, bool)
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        if isinstance(b, float):
            return a == b or math.isclose(a, b, rel_tol=tol, abs_tol=tol)
        return a == b
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y, tol) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        if set(a) != set(b):  # JSON's keys are text: {1: 2} answers {"1": 2}
            a, b = {str(k): v for k, v in a.items()}, {str(k): v for k, v in b.items()}
            if set(a) != set(b):
                return False
        return all(_same(a[k], b[k], tol) for k in a)
    return type(a) is type(b) and a == b


def call_equal(got: Any, want: Any, tol: float = FLOAT_TOL, wrapped: bool = False) -> bool:
    """Whether a function's value answers a test: equal after tuples become lists (JSON has none), an expected float
    met within `tol`; with `wrapped` (TACO's form, `CallTests.wrapped`), also equal to the only element of an
    expected list, as TACO's checker accepts (it wraps outputs in one). `got` is plain data (decoded in this
    process: no object of the model's making is compared).

    Args:
        got: the value the function returned (`dapo_rl.reward.code.child.decode`'d).
        want: the test's expected output (JSON).
        tol: the float tolerance.
        wrapped: accept the value of a one-element expected list.
    """
    g, w = _plain(got), _plain(want)
    if _same(g, w, tol):
        return True
    return wrapped and isinstance(w, list) and len(w) == 1 and _same(g, w[0], tol)
