"""Dataset rows in verl's schema, from parquet, JSONL or reasoning-gym, tokenized into prompts.

verl's row schema: `data_source` (str), `prompt` (list of `{"role", "content"}` chat messages, or a plain string),
`ability` (str, optional), `reward_model.ground_truth` (str or number), `extra_info` (dict, optional).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dapo_rl.data.templates import apply_prompt_template


class DataError(ValueError):
    """A data file or row that cannot be used; the message names the file, the row and the field."""


@dataclass
class Sample:
    """One dataset row, normalised.

    Attributes:
        uid: unique id of the prompt within its dataset (`<name>:<row>`).
        data_source: selects the verifier (`math_dapo`, `DAPO-17k`, `reasoning_gym/<task>`, ...).
        prompt: chat messages, `[{"role": "user", "content": ...}]`.
        ground_truth: the reference answer as a string.
        extra_info: anything else the verifier may need (reasoning-gym metadata, indices).
    """

    uid: str
    data_source: str
    prompt: list[dict]
    ground_truth: str
    extra_info: dict = field(default_factory=dict)


REQUIRED_COLUMNS = ("prompt", "reward_model")


def _require_file(path: Path) -> None:
    """Raise `DataError` unless `path` is a file (a directory or a missing path is named as such)."""
    if not path.is_file():
        if path.is_dir():
            raise DataError(f"{path.resolve()}: is a directory; give a .parquet or .jsonl file")
        raise DataError(f"{path.resolve()}: no such file")


def read_jsonl(path: str | Path, errors: list[DataError] | None = None) -> list[tuple[int, Any]]:
    """`(line number, value)` for each non-blank line of a JSONL file; line numbers count from 1.

    Args:
        path: the file.
        errors: when given, a line that is not valid UTF-8 JSON is skipped and its `DataError` appended here
            instead of raised.

    Raises:
        DataError: no such file, or (without `errors`) a line that is not valid UTF-8 JSON (the message names file
            and line).
    """
    path = Path(path)
    _require_file(path)
    rows = []
    with open(path, "rb") as fh:
        for i, raw in enumerate(fh):
            if not raw.strip():
                continue
            try:
                rows.append((i + 1, json.loads(raw.decode("utf-8"))))
            except (UnicodeDecodeError, json.JSONDecodeError) as e:
                reason = (
                    "not valid UTF-8" if isinstance(e, UnicodeDecodeError) else f"not valid JSON ({e.msg})"
                )
                err = DataError(f"{path}: line {i + 1}: {reason}")
                if errors is None:
                    raise err from e
                errors.append(err)
    return rows


def _read_rows(
    path: Path, required: tuple[str, ...] = REQUIRED_COLUMNS, errors: list[DataError] | None = None
) -> list[tuple[str, Any]]:
    """`(where, row)` pairs; `where` is `row N` (0-based) for parquet and `line N` (1-based) for JSONL. A parquet
    file must have the `required` columns. `errors`: see `read_jsonl`."""
    _require_file(path)
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        import pyarrow.parquet as pq

        try:
            table = pq.read_table(path)
        except Exception as e:
            raise DataError(f"{path}: not a readable parquet file ({e})") from e
        missing = [c for c in required if c not in table.column_names]
        if missing:
            raise DataError(
                f"{path}: missing column(s) {', '.join(missing)} (verl schema: data_source, prompt, "
                f"reward_model.ground_truth, extra_info); the file has {', '.join(table.column_names)}"
            )
        return [(f"row {i}", r) for i, r in enumerate(table.to_pylist())]
    if suffix in (".jsonl", ".json"):
        return [(f"line {n}", row) for n, row in read_jsonl(path, errors)]
    raise DataError(f"{path}: unsupported file type {suffix!r}; use .parquet or .jsonl")


def _preview(value: Any, limit: int = 40) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _normalise_row(row: Any, path: Path, at: str, i: int, name: str) -> Sample:
    where = f"{path}: {at}"
    if not isinstance(row, dict):
        raise DataError(f"{where}: expected an object, got {type(row).__name__}")
    prompt = row.get("prompt")
    if isinstance(prompt, str):
        prompt = [{"role": "user", "content": prompt}]
    if not isinstance(prompt, list) or not prompt:
        got = "missing" if prompt is None else f"got {type(prompt).__name__} {_preview(prompt)}"
        raise DataError(
            f"{where}: field 'prompt' must be a string or a non-empty list of chat messages ({got})"
        )
    for j, m in enumerate(prompt):
        if not isinstance(m, dict) or not isinstance(m.get("content"), str):
            raise DataError(
                f"{where}: field 'prompt[{j}]' must be a chat message with a string 'content' (got {_preview(m)})"
            )
        if not isinstance(m.get("role", "user"), str):
            raise DataError(
                f"{where}: field 'prompt[{j}].role' must be a string (got {_preview(m.get('role'))})"
            )
        if not m["content"].strip():
            raise DataError(f"{where}: field 'prompt[{j}].content' is empty")
    if "reward_model" not in row or row["reward_model"] is None:
        raise DataError(f"{where}: field 'reward_model' is missing (verl schema: reward_model.ground_truth)")
    rm = row["reward_model"]
    if not isinstance(rm, dict):
        raise DataError(
            f"{where}: field 'reward_model' must be an object with 'ground_truth' (got {type(rm).__name__})"
        )
    gt = rm.get("ground_truth")
    if gt is None or (isinstance(gt, str) and not gt.strip()):
        raise DataError(f"{where}: field 'reward_model.ground_truth' is missing or empty")
    if isinstance(gt, bool) or not isinstance(gt, (str, int, float)):
        raise DataError(
            f"{where}: field 'reward_model.ground_truth' must be a string or a number (got "
            f"{type(gt).__name__} {_preview(gt)})"
        )
    if isinstance(gt, float) and not math.isfinite(gt):
        raise DataError(f"{where}: field 'reward_model.ground_truth' is {gt}")
    extra = row.get("extra_info") or {}
    if not isinstance(extra, dict):
        raise DataError(f"{where}: field 'extra_info' must be an object (got {type(extra).__name__})")
    source = row.get("data_source") or "math"
    if not isinstance(source, str):
        raise DataError(f"{where}: field 'data_source' must be a string (got {type(source).__name__})")
    from dapo_rl.reward.code.suites import is_code_source, parse_tests

    if is_code_source(
        source
    ):  # the code reward's tests: read now, not as a -1 for every response in training
        try:
            parse_tests(gt)
        except ValueError as e:
            raise DataError(
                f"{where}: field 'reward_model.ground_truth' (code tests, data_source {source!r}): {e}"
            ) from e
    return Sample(
        uid=f"{name}:{i}",
        data_source=source,
        prompt=[{"role": m.get("role", "user"), "content": m["content"]} for m in prompt],
        ground_truth=str(gt),
        extra_info=extra,
    )


def load_samples(
    path: str | Path, template: str = "none", errors: list[DataError] | None = None
) -> list[Sample]:
    """Read a parquet or JSONL file in verl's schema.

    Args:
        path: `.parquet` or `.jsonl` file.
        template: prompt template to apply (`none` or `dapo`, see `apply_prompt_template`).
        errors: when given (`data.skip_invalid`), malformed rows are skipped and their `DataError`s appended here
            instead of raised; a missing or unreadable file or missing columns still raise.

    Returns:
        One `Sample` per row, in file order; `uid` is `<file stem>:<row>`.

    Raises:
        DataError: missing or unreadable file, missing columns, invalid UTF-8/JSON, or a row without a usable
            `prompt` or `reward_model.ground_truth`, or with a field of the wrong type (the message names the
            file, the row — `row N` counted from 0 in parquet, `line N` counted from 1 in JSONL — and the field).
    """
    path = Path(path)
    rows = _read_rows(path, errors=errors)
    samples = []
    for i, (at, r) in enumerate(rows):
        try:
            samples.append(_normalise_row(r, path, at, i, path.stem))
        except DataError as e:
            if errors is None:
                raise
            errors.append(e)
    for s in samples:
        s.prompt = apply_prompt_template(s.prompt, template)
    return samples


def reasoning_gym_samples(
    task: str, size: int, seed: int, params: dict | None = None, strip_instruction: bool = False
) -> list[Sample]:
    """Generate a reasoning-gym task as `Sample`s (`data_source` = `reasoning_gym/<task>`), or one of the project's
    own tasks (`dapo_rl.data.code_tasks.PROJECT_TASKS`: `tiny_functions`, `data_source` = `code/<task>`).

    The ground truth is the task's reference answer; `extra_info` carries the question and the JSON-safe metadata
    that reasoning-gym's own `score_answer` needs.

    Raises:
        DataError: unknown task or bad parameters (reasoning-gym's message included).
    """
    from dapo_rl.data.code_tasks import PROJECT_TASKS, task_samples

    if task in PROJECT_TASKS:
        return task_samples(task, size, seed, params)
    import reasoning_gym

    try:
        ds = reasoning_gym.create_dataset(task, size=size, seed=seed, **(params or {}))
    except Exception as e:
        raise DataError(f"reasoning-gym task {task!r} with {params}: {e}") from e
    out = []
    for i in range(size):
        entry = ds[i]
        question = entry["question"]
        if strip_instruction and ": " in question:
            question = question.split(": ", 1)[1]
        out.append(
            Sample(
                uid=f"{task}:{seed}:{i}",
                data_source=f"reasoning_gym/{task}",
                prompt=[{"role": "user", "content": question}],
                ground_truth=str(entry["answer"]),
                extra_info={
                    "question": entry["question"],
                    "metadata": json.loads(json.dumps(entry.get("metadata", {}), default=str)),
                    "index": i,
                },
            )
        )
    return out


def render_prompt(tokenizer: Any, messages: list[dict], tools: list[dict] | None = None) -> str:
    """The text the model sees before its response.

    A tokenizer with a chat template gets `apply_chat_template(..., add_generation_prompt=True)`; one without (the
    embedded tiny model) gets the message contents joined by blank lines and one newline after (`PromptDataset`
    tokenizes it with the tokenizer's special tokens: a BOS where the tokenizer adds one). `tools` (OpenAI function
    schemas) go to the chat template, which lists them (`episode.tool.format=chat_template`).
    """
    if tools:  # the template lists them (`dapo_rl.episode.chat_tools`, which checked it has a chat template)
        return tokenizer.apply_chat_template(
            messages, tools=tools, add_generation_prompt=True, tokenize=False
        )
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return "\n\n".join(m["content"] for m in messages) + "\n"


def encode_prompts(tokenizer: Any, texts: list[str]) -> list[list[int]]:
    """Token ids of `render_prompt`'s texts. A chat template writes its own special tokens; plain text gets the
    tokenizer's (a Llama-style base checkpoint's BOS, which its pretraining always saw; the embedded and Qwen
    tokenizers add none)."""
    if not texts:
        return []
    plain = not getattr(tokenizer, "chat_template", None)
    return [list(ids) for ids in tokenizer(texts, add_special_tokens=plain)["input_ids"]]


class PromptDataset:
    """Samples with their prompt token ids; prompts over `max_prompt_length` tokens are dropped and counted.

    Attributes:
        samples: the kept samples.
        prompt_ids: token ids of each kept sample's rendered prompt.
        num_dropped: how many samples were dropped for length.
        name: dataset name used in metric keys (`val/<name>/acc`).

    `tools`: function schemas the chat template lists in every prompt (`render_prompt`).

    Raises:
        DataError: every prompt was dropped (the message gives the longest-kept limit to raise).
    """

    def __init__(
        self,
        samples: list[Sample],
        tokenizer: Any,
        max_prompt_length: int,
        name: str,
        tools: list[dict] | None = None,
    ):
        self.name = name
        self.samples: list[Sample] = []
        self.prompt_ids: list[list[int]] = []
        self.num_dropped = 0
        encoded = encode_prompts(tokenizer, [render_prompt(tokenizer, s.prompt, tools) for s in samples])
        shortest = None
        for s, ids in zip(samples, encoded):
            if len(ids) > max_prompt_length:
                self.num_dropped += 1
                shortest = len(ids) if shortest is None else min(shortest, len(ids))
                continue
            self.samples.append(s)
            self.prompt_ids.append(list(ids))
        if not self.samples:
            raise DataError(
                f"dataset {name}: all {len(samples)} prompts are longer than data.max_prompt_length="
                f"{max_prompt_length} tokens (the shortest has {shortest}); raise data.max_prompt_length"
            )

    def __len__(self) -> int:
        return len(self.samples)

    def count_prompts(self, prompt_ids: set[tuple[int, ...]]) -> int:
        """How many of this dataset's prompts are in `prompt_ids` (token ids of rendered prompts, as tuples)."""
        return sum(tuple(ids) in prompt_ids for ids in self.prompt_ids)

    def drop_prompts(self, prompt_ids: set[tuple[int, ...]]) -> int:
        """Leave out the samples whose rendered prompt is in `prompt_ids` (`data.val_exclude_train_prompts`).

        Returns:
            How many were left out.

        Raises:
            DataError: every sample would be left out.
        """
        keep = [i for i, ids in enumerate(self.prompt_ids) if tuple(ids) not in prompt_ids]
        if not keep:
            raise DataError(
                f"dataset {self.name}: all {len(self)} prompts are also training prompts "
                "(data.val_exclude_train_prompts); use validation data the training data does not cover"
            )
        dropped = len(self) - len(keep)
        self.samples = [self.samples[i] for i in keep]
        self.prompt_ids = [self.prompt_ids[i] for i in keep]
        return dropped
