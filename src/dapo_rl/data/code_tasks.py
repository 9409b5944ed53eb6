"""The project's own procedural code task, `tiny_functions`: write `f` from a few input/output examples, judged by
hidden tests (the `tiny_code` miniature's data; `reward.name: code` scores it).

A problem is a linear function ``f(x) = a*x + b`` (``a`` in 1..`a_max`, ``b`` in 0..`b_max`) shown at ``x = 0, 1,
..., visible - 1``; the hidden tests are ``x = visible, ..., visible + hidden - 1``, in the code reward's function-call
form. The prompt, for ``a = 3, b = 5``::

    f(0)=5
    f(1)=8
    f(2)=11

and a right answer is ``f=lambda x:3*x+5`` in a Python block (`program`). A program that only tabulates the
examples (`table_program`, ``f=[5,8,11].__getitem__``) passes every example the prompt shows and no hidden test:
the overfitting that hidden tests exist to catch. Both are one line without indentation: the 1.5M-parameter
byte-level model miscounted ``def f(x):`` and its four spaces of indentation (greedy, it wrote eleven spaces and no
``return``; 0 of 500 held-out programs ran, 2026-12-07).

Held-out functions: those with ``(7*a + b) % 10 == 0`` (one in ten) are never training problems (``held_out:
false``) and are the only validation problems (``held_out: true``), so validation asks for functions the model never
saw.

`task_samples` dispatches a task name of `PROJECT_TASKS` (`dapo_rl.data.dataset.reasoning_gym_samples` calls it for
these names, so a recipe's `data.train_reasoning_gym.task` and `sft.task.task` can name them).
"""

from __future__ import annotations

import json
import random
from typing import Any

from dapo_rl.data.dataset import DataError, Sample

PROJECT_TASKS = ("tiny_functions",)
"""Task names generated here rather than by reasoning-gym."""

DATA_SOURCE_PREFIX = "code/"


def held_out(a: int, b: int) -> bool:
    """Whether ``a*x + b`` is a validation-only function."""
    return (7 * a + b) % 10 == 0


def program(a: int, b: int) -> str:
    """The right answer's code: ``f=lambda x:a*x+b`` and a newline."""
    return f"f=lambda x:{a}*x+{b}\n"


def table_program(a: int, visible: int, b: int) -> str:
    """A program that tabulates the `visible` examples, ``f=[f(0),f(1),...].__getitem__`` (passes them; every
    hidden test raises IndexError)."""
    return f"f=[{','.join(str(a * x + b) for x in range(visible))}].__getitem__\n"


def code_block(code: str) -> str:
    """`code` in a fenced Python block, as the code reward reads it (`dapo_rl.reward.code.last_code_block`)."""
    return f"```python\n{code}```"


def tiny_functions_samples(
    size: int,
    seed: int,
    *,
    held_out_only: bool = False,
    visible: int = 3,
    hidden: int = 7,
    a_max: int = 9,
    b_max: int = 99,
) -> list[Sample]:
    """`size` problems of `tiny_functions` (the module docstring), problem i drawn from ``random.Random(seed + i)``.

    Args:
        size: problems.
        seed: the first problem's seed.
        held_out_only: draw only the held-out functions (validation) instead of only the others (training).
        visible: examples shown (``x = 0 .. visible-1``), >= 2.
        hidden: hidden tests (the next `hidden` inputs), >= 1.
        a_max: the largest slope, >= 1.
        b_max: the largest intercept, >= 0.

    Returns:
        Samples with ``data_source`` ``code/tiny_functions``, the prompt's lines as one user message, the hidden
        tests as ground truth (JSON: ``{"fn_name": "f", "inputs": [[x], ...], "outputs": [...]}``) and
        ``extra_info`` holding ``a``, ``b``, ``program`` and ``table_program`` (the warm-up's targets).

    Raises:
        DataError: a parameter out of range.
    """
    if visible < 2 or hidden < 1 or a_max < 1 or b_max < 0 or size < 0:
        raise DataError(
            f"tiny_functions: visible={visible} (>= 2), hidden={hidden} (>= 1), a_max={a_max} (>= 1), "
            f"b_max={b_max} (>= 0), size={size} (>= 0)"
        )
    pool = [(a, b) for a in range(1, a_max + 1) for b in range(b_max + 1) if held_out(a, b) == held_out_only]
    if not pool:
        raise DataError(f"tiny_functions: no {'held-out' if held_out_only else 'training'} function")
    out = []
    xs = list(range(visible, visible + hidden))
    for i in range(size):
        a, b = random.Random(seed + i).choice(pool)
        prompt = "\n".join(f"f({x})={a * x + b}" for x in range(visible))
        tests = {"fn_name": "f", "inputs": [[x] for x in xs], "outputs": [a * x + b for x in xs]}
        out.append(
            Sample(
                uid=f"tiny_functions:{seed}:{i}",
                data_source=DATA_SOURCE_PREFIX + "tiny_functions",
                prompt=[{"role": "user", "content": prompt}],
                ground_truth=json.dumps(tests),
                extra_info={
                    "a": a,
                    "b": b,
                    "program": program(a, b),
                    "table_program": table_program(a, visible, b),
                    "index": i,
                },
            )
        )
    return out


def task_samples(task: str, size: int, seed: int, params: dict[str, Any] | None = None) -> list[Sample]:
    """The samples of one of `PROJECT_TASKS`.

    Raises:
        DataError: an unknown task or parameter (named).
    """
    if task != "tiny_functions":
        raise DataError(f"unknown project task {task!r}; project tasks: {', '.join(PROJECT_TASKS)}")
    params = dict(params or {})
    known = {"held_out_only", "visible", "hidden", "a_max", "b_max"}
    unknown = sorted(set(params) - known)
    if unknown:
        raise DataError(
            f"tiny_functions: unknown parameter(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}"
        )
    return tiny_functions_samples(size, seed, **params)


def code_completion(sample: Sample, table: bool = False) -> str:
    """A warm-up target for a `tiny_functions` sample: its program (or, with `table`, its table program) in a
    Python block.

    Raises:
        DataError: not a `tiny_functions` sample.
    """
    key = "table_program" if table else "program"
    code = (sample.extra_info or {}).get(key)
    if sample.data_source != DATA_SOURCE_PREFIX + "tiny_functions" or not isinstance(code, str):
        raise DataError(
            f"sample {sample.uid}: code completions are written for the tiny_functions task only "
            f"(data_source {sample.data_source!r})"
        )
    return code_block(code)
