"""`dapo data convert` and `dapo data inspect`: question/answer data in the formats users hold, to and from verl's
parquet schema, through Hugging Face `datasets` (which reads JSONL, CSV, parquet, saved datasets and dataset
directories) and pyarrow.

Output rows (verl schema, as DAPO-Math-17k): `data_source`, `prompt` (one user message, the template applied),
`ability` (`MATH`), `reward_model` (`{"style": "rule", "ground_truth": str}`), `extra_info` (`{"index", "split",
"raw_problem", "source_row"}`).
"""

from __future__ import annotations

import json
import math
import random
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dapo_rl.data.dataset import DataError
from dapo_rl.data.templates import TEMPLATES, apply_prompt_template
from dapo_rl.reward.code.suites import is_code_source

QUESTION_COLUMNS = ("problem", "question", "prompt", "query", "instruction", "input", "Problem", "Question")
"""Column names tried, in order, for the question when `--question-column` is not given."""
ANSWER_COLUMNS = ("answer", "ground_truth", "final_answer", "target", "solution", "output", "Answer", "label")
"""Column names tried, in order, for the answer when `--answer-column` is not given."""

ANSWER_TYPES = ("integer", "decimal", "fraction", "expression", "text")


def read_dataset(path: str | Path, split: str | None = None):
    """Read a dataset with Hugging Face `datasets`.

    Args:
        path: a directory written by `save_to_disk` (a `Dataset` or `DatasetDict`), another local dataset directory
            (data files `datasets.load_dataset` recognises), or a `.jsonl` / `.json` / `.csv` / `.parquet` file.
        split: for a `DatasetDict` or a dataset directory: which split (default `train` when there is one, else
            the only split).

    Returns:
        A `datasets.Dataset`.

    Raises:
        DataError: no such path, an unsupported file type, a file `datasets` cannot parse, or an unknown or
            ambiguous split (the splits listed).
    """
    import datasets

    datasets.disable_progress_bars()
    path = Path(path)
    if not path.exists():
        raise DataError(f"{path}: no such file or directory")
    try:
        if path.is_dir():
            if (path / "dataset_info.json").exists() or (path / "dataset_dict.json").exists():
                ds = datasets.load_from_disk(str(path))
            else:
                ds = datasets.load_dataset(str(path))
        else:
            kind = {".jsonl": "json", ".json": "json", ".csv": "csv", ".parquet": "parquet"}.get(
                path.suffix.lower()
            )
            if kind is None:
                raise DataError(
                    f"{path}: unsupported file type {path.suffix!r}; give .jsonl, .json, .csv, .parquet or a "
                    "dataset directory"
                )
            ds = datasets.load_dataset(kind, data_files=str(path), split="train")
    except DataError:
        raise
    except Exception as e:
        raise DataError(f"{path}: datasets could not read it ({type(e).__name__}: {e})") from e
    if isinstance(ds, datasets.DatasetDict):
        names = list(ds)
        if split is None:
            if "train" in ds:
                split = "train"
            elif len(names) == 1:
                split = names[0]
            else:
                raise DataError(f"{path}: several splits ({', '.join(names)}); choose one with --split")
        if split not in ds:
            raise DataError(f"{path}: no split {split!r}; it has {', '.join(names)}")
        ds = ds[split]
    elif split not in (None, "train"):
        raise DataError(f"{path}: a single dataset without splits; drop --split {split}")
    return ds


def is_verl(columns: list[str]) -> bool:
    """Whether a table already has verl's schema (`prompt` and `reward_model` columns)."""
    return "prompt" in columns and "reward_model" in columns


def guess_columns(columns: list[str], question: str | None, answer: str | None) -> tuple[str, str]:
    """The question and answer columns: the ones asked for, else the first of `QUESTION_COLUMNS` /
    `ANSWER_COLUMNS` present (an answer column other than the question's).

    Raises:
        DataError: an asked-for column is missing, or no candidate is present (the columns listed).
    """
    have = ", ".join(columns)
    for asked, flag in ((question, "--question-column"), (answer, "--answer-column")):
        if asked is not None and asked not in columns:
            raise DataError(f"{flag} {asked!r}: no such column; the data has {have}")
    q = question or next((c for c in QUESTION_COLUMNS if c in columns), None)
    if q is None:
        raise DataError(f"no question column among {have}; name it with --question-column")
    a = answer or next((c for c in ANSWER_COLUMNS if c in columns and c != q), None)
    if a is None:
        raise DataError(f"no answer column among {have}; name it with --answer-column")
    return q, a


def answer_text(value: Any) -> str | None:
    """A ground truth from an answer cell: GSM8K's worked answers give the number after `####`, a MATH-style
    solution its last `\\boxed{...}`, numbers their shortest exact text (`27.0` -> `27`); None: empty or not usable
    (a list, a dict, NaN, a bool)."""
    from dapo_rl.reward.math_verifier import gsm8k_ground_truth

    if value is None or isinstance(value, (bool, list, dict)):
        return None
    if isinstance(value, float):
        if not math.isfinite(value):
            return None
        return str(int(value)) if value.is_integer() else repr(value)
    if isinstance(value, int):
        return str(value)
    text = str(value).strip()
    if "####" in text:
        text = gsm8k_ground_truth(text)
    elif "\\boxed" in text:
        from dapo_rl.reward.extract import find_boxed

        boxes = find_boxed(text)
        text = boxes[-1][2].strip() if boxes else text
    return text or None


_INT = re.compile(r"^[-+]?\d{1,3}(,\d{3})+$|^[-+]?\d+$")
_DEC = re.compile(r"^[-+]?(\d+\.\d*|\.\d+)(e[-+]?\d+)?$", re.I)
_FRAC = re.compile(r"^[-+]?(\d+\s*/\s*\d+|\\d?frac\{?\d+\}?\{?\d+\}?)$")


def answer_type(text: str) -> str:
    """`integer` (`18`, `-3`, `1,000`), `decimal` (`0.5`, `1e-3`), `fraction` (`3/4`, `\\frac{3}{4}`),
    `expression` (anything with math: `\\sqrt{2}`, `2x+1`, `p - q`, `(1,2)`) or `text` (words only: `Monday`,
    `\\text{east}`)."""
    t = text.strip().strip("$").strip()
    if _INT.match(t):
        return "integer"
    if _DEC.match(t):
        return "decimal"
    if _FRAC.match(t.replace(" ", "")):
        return "fraction"
    bare = re.sub(r"\\text\{([^}]*)\}", r"\1", t)
    if re.fullmatch(r"[A-Za-z][A-Za-z .,'-]*", bare) and re.search(r"[A-Za-z]{3}", bare):
        return "text"
    return "expression"


@dataclass
class ConvertSummary:
    """What `convert` read, dropped and wrote."""

    source: str
    question_column: str
    answer_column: str
    guessed: bool
    rows_read: int
    dropped_empty: list[str] = field(default_factory=list)
    duplicates_removed: int = 0
    train_rows: int = 0
    val_rows: int = 0
    answer_types: dict[str, int] = field(default_factory=dict)
    outputs: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        how = "guessed; --question-column / --answer-column to choose" if self.guessed else "as given"
        out = [
            f"read {self.rows_read} rows from {self.source}",
            f"question column {self.question_column!r}, answer column {self.answer_column!r} ({how})",
        ]
        if self.dropped_empty:
            shown = "; ".join(self.dropped_empty[:3])
            out.append(
                f"dropped {len(self.dropped_empty)} row(s) without a usable question or answer: {shown}"
            )
        out.append(f"removed {self.duplicates_removed} duplicate prompt(s)")
        types = ", ".join(f"{k} {v}" for k, v in self.answer_types.items() if v)
        out.append(f"answers: {types}")
        out.append(f"wrote train {self.train_rows} rows, val {self.val_rows} rows: {', '.join(self.outputs)}")
        return out


def convert(
    src: str | Path,
    out_dir: str | Path,
    *,
    question_column: str | None = None,
    answer_column: str | None = None,
    template: str = "dapo",
    data_source: str | None = None,
    dedup: bool = False,
    val_size: float = 0.0,
    seed: int = 0,
    split: str | None = None,
    force: bool = False,
) -> ConvertSummary:
    """Convert question/answer data (or verl data) into verl-schema parquet: `<out_dir>/train.parquet` and, with
    `val_size` > 0, `<out_dir>/val.parquet`.

    Args:
        src: see `read_dataset`.
        out_dir: output directory (created).
        question_column, answer_column: column names; None: guessed (`guess_columns`). Ignored for verl input,
            whose `prompt` and `reward_model.ground_truth` are used.
        template: `dapo` (DAPO's "Answer:" prompt; the data source defaults to `math_dapo`), `boxed` or `none`.
        data_source: the rows' `data_source` (default `math_dapo` with the dapo template, else `math`; verl input
            keeps its own unless given).
        dedup: keep the first row of each distinct prompt (DAPO-Math-17k's released file holds each ~100 times).
        val_size: rows held out for validation: a count (>= 1) or a fraction (< 1) of the deduplicated rows.
        seed: the shuffle before the split.
        split: see `read_dataset`.
        force: overwrite existing output files (otherwise they are never touched).

    Returns:
        The summary (also what the CLI prints).

    Raises:
        DataError: unreadable input, missing columns, no usable rows, a validation split that leaves no training
            rows, or output files that exist without `force` (nothing is written then).
    """
    if template not in TEMPLATES:
        raise DataError(f"--template {template!r}: choose one of {', '.join(TEMPLATES)}")
    out_dir = Path(out_dir)
    refuse_existing(out_dir, val_size, force)
    ds = read_dataset(src, split)
    columns = list(ds.column_names)
    verl = is_verl(columns)
    if verl:
        q_col, a_col, guessed = "prompt", "reward_model.ground_truth", False
    else:
        q_col, a_col = guess_columns(columns, question_column, answer_column)
        guessed = question_column is None or answer_column is None
    source = data_source or ("math_dapo" if template == "dapo" else "math")
    summary = ConvertSummary(str(src), q_col, a_col, guessed, len(ds))
    rows: list[dict] = []
    seen: set[str] = set()
    for i, row in enumerate(ds):
        messages, gt, raw = _read_row(row, verl, q_col, a_col)
        if not messages or gt is None:
            field_name = q_col if not messages else a_col
            summary.dropped_empty.append(f"row {i}: field {field_name!r} is empty or not text")
            continue
        row_source = row.get("data_source") if verl and data_source is None else source
        code = is_code_source(
            str(row_source)
        )  # a code row keeps its prompt: the math templates ask for "Answer:"
        prompt = messages if code else apply_prompt_template(messages, template)
        key = json.dumps(prompt, sort_keys=True)
        if dedup and key in seen:
            summary.duplicates_removed += 1
            continue
        seen.add(key)
        rows.append(
            {
                "data_source": row_source,
                "prompt": prompt,
                "ability": "CODE" if code else "MATH",
                "reward_model": {"style": "rule", "ground_truth": gt},
                "extra_info": {"index": 0, "split": "train", "raw_problem": raw or "", "source_row": i},
            }
        )
    if not rows:
        raise DataError(f"{src}: no usable rows (question {q_col!r}, answer {a_col!r}); nothing written")
    written = write_split(rows, out_dir, val_size, seed)
    summary.outputs = [str(path) for _, path, _ in written]
    counts = {name: n for name, _, n in written}
    summary.train_rows, summary.val_rows = counts["train"], counts.get("val", 0)
    summary.answer_types = {t: 0 for t in ANSWER_TYPES}
    for r in rows:
        summary.answer_types[answer_type(r["reward_model"]["ground_truth"])] += 1
    return summary


def refuse_existing(out_dir: Path, val_size: float, force: bool) -> None:
    """Refuse to overwrite: the output files `write_split` would write already exist and `force` is not set.

    Raises:
        DataError: naming them (nothing is written then).
    """
    targets = [out_dir / "train.parquet"] + ([out_dir / "val.parquet"] if val_size > 0 else [])
    existing = [str(t) for t in targets if t.exists()]
    if existing and not force:
        raise DataError(f"{', '.join(existing)}: already exists; nothing written (--force to overwrite)")


def write_split(rows: list[dict], out_dir: Path, val_size: float, seed: int) -> list[tuple[str, Path, int]]:
    """Write `rows` (verl schema) as `<out_dir>/train.parquet` and, with `val_size` > 0, `val.parquet`: a count
    (>= 1) or a fraction (< 1) of the rows, drawn after a shuffle seeded with `seed`; each file keeps the rows' order
    and numbers them (`extra_info.index`, `extra_info.split`).

    Returns:
        `(split name, path, rows)` per file written.

    Raises:
        DataError: a validation split that leaves no training rows (nothing is written then).
    """
    order = list(range(len(rows)))
    n_val = 0
    if val_size > 0:
        random.Random(seed).shuffle(order)
        n_val = int(val_size) if val_size >= 1 else round(val_size * len(rows))
        if n_val >= len(rows):
            raise DataError(
                f"--val-size {val_size}: {n_val} of {len(rows)} rows would leave no training rows"
            )
    parts = [("train", sorted(order[n_val:]))] + ([("val", sorted(order[:n_val]))] if val_size > 0 else [])
    out_dir.mkdir(parents=True, exist_ok=True)
    out = []
    for name, idx in parts:
        chosen = [
            {**rows[j], "extra_info": {**rows[j]["extra_info"], "index": k, "split": name}}
            for k, j in enumerate(idx)
        ]
        _write_parquet(chosen, out_dir / f"{name}.parquet")
        out.append((name, out_dir / f"{name}.parquet", len(idx)))
    return out


def _read_row(
    row: dict, verl: bool, q_col: str, a_col: str
) -> tuple[list[dict] | None, str | None, str | None]:
    """`(messages, ground truth, bare problem text)` of one input row; None where a part is missing or unusable."""
    if verl:
        messages = _verl_prompt(row.get("prompt"))
        gt = answer_text((row.get("reward_model") or {}).get("ground_truth"))
        raw = (row.get("extra_info") or {}).get("raw_problem") or (
            messages[-1]["content"] if messages else None
        )
        return messages, gt, raw
    q = row.get(q_col)
    raw = q.strip() if isinstance(q, str) and q.strip() else None
    return ([{"role": "user", "content": raw}] if raw else None), answer_text(row.get(a_col)), raw


def _verl_prompt(prompt: Any) -> list[dict] | None:
    if isinstance(prompt, str):
        return [{"role": "user", "content": prompt}] if prompt.strip() else None
    if (
        isinstance(prompt, list)
        and prompt
        and all(isinstance(m, dict) and isinstance(m.get("content"), str) for m in prompt)
    ):
        return [{"role": m.get("role") or "user", "content": m["content"]} for m in prompt]
    return None


def _write_parquet(rows: list[dict], path: Path) -> None:
    """Write rows atomically (a temporary file renamed into place)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    tmp = path.with_name(path.name + ".tmp")
    pq.write_table(pa.Table.from_pylist(rows), tmp)
    tmp.replace(path)


def _percentile(sorted_values: list[int], q: float) -> int:
    if not sorted_values:
        return 0
    return sorted_values[min(len(sorted_values) - 1, max(0, math.ceil(q / 100 * len(sorted_values)) - 1))]


def inspect_dataset(
    src: str | Path,
    *,
    tokenizer: Any = None,
    max_prompt_length: int | None = None,
    question_column: str | None = None,
    answer_column: str | None = None,
    template: str = "none",
    split: str | None = None,
    tools: list[dict] | None = None,
) -> dict:
    """What a data file holds, as `dapo train` would see it.

    Args:
        src: see `read_dataset`.
        tokenizer: counts prompt tokens (the chat template applied as in training, `render_prompt`); None: no
            token counts.
        max_prompt_length: with a tokenizer, how many rows `dapo train` would drop at this `data.max_prompt_length`.
        question_column, answer_column, template: as `convert` (verl input uses its own columns).
        split: see `read_dataset`.
        tools: function schemas the chat template lists in every prompt (`render_prompt`; a tool run with
            `episode.tool.format=chat_template`), counted in the prompt tokens.

    Returns:
        `{"source", "rows", "schema": {column: type}, "format": "verl" | "question/answer", "question_column",
        "answer_column", "unusable_rows", "duplicate_prompts", "distinct_prompts", "answer_types": {type: count},
        "prompt_tokens": {"p50", "p90", "p99", "max"}, "dropped_at_max_prompt_length"}` (the token entries only with
        a tokenizer).

    Raises:
        DataError: as `read_dataset` and `guess_columns`.
    """
    from dapo_rl.data.dataset import encode_prompts, render_prompt

    ds = read_dataset(src, split)
    columns = list(ds.column_names)
    verl = is_verl(columns)
    q_col, a_col = (
        ("prompt", "reward_model.ground_truth")
        if verl
        else guess_columns(columns, question_column, answer_column)
    )
    prompts, answers, unusable = [], [], 0
    for row in ds:
        messages, gt, _ = _read_row(row, verl, q_col, a_col)
        if not messages or gt is None:
            unusable += 1
            continue
        prompts.append(apply_prompt_template(messages, template))
        answers.append(gt)
    keys = [json.dumps(p, sort_keys=True) for p in prompts]
    distinct = len(set(keys))
    types = {t: 0 for t in ANSWER_TYPES}
    for a in answers:
        types[answer_type(a)] += 1
    report: dict[str, Any] = {
        "source": str(src),
        "rows": len(ds),
        "schema": {c: str(t) for c, t in ds.features.items()},
        "format": "verl" if verl else "question/answer",
        "question_column": q_col,
        "answer_column": a_col,
        "unusable_rows": unusable,
        "duplicate_prompts": len(keys) - distinct,
        "distinct_prompts": distinct,
        "answer_types": types,
    }
    if tokenizer is not None and prompts:
        lengths = sorted(
            len(ids)
            for ids in encode_prompts(tokenizer, [render_prompt(tokenizer, p, tools) for p in prompts])
        )
        report["prompt_tokens"] = {f"p{q}": _percentile(lengths, q) for q in (50, 90, 99)} | {
            "max": lengths[-1]
        }
        if max_prompt_length is not None:
            report["dropped_at_max_prompt_length"] = {
                "max_prompt_length": max_prompt_length,
                "rows": sum(x > max_prompt_length for x in lengths),
            }
    return report
