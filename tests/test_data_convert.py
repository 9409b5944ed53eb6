"""`dapo data convert` / `dapo data inspect` on the shared files (GSM8K, MATH-500, DAPO-Math-17k), a dataset saved
with `datasets`, CSV and small duplicated files; what they write is read back by the loaders `dapo train` and
`dapo eval` use."""

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from e2e import dapo

from dapo_rl.data import load_samples
from dapo_rl.data.convert import answer_text, answer_type, convert, inspect_dataset, read_dataset
from dapo_rl.data.dataset import DataError
from dapo_rl.data.templates import BOXED_SUFFIX, DAPO_TEMPLATE
from dapo_rl.evaluate import load_eval_set
from dapo_rl.models.tiny import build_tiny_tokenizer

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


def test_answers_by_hand():
    assert answer_text("Janet sells 16 - 3 - 4 = <<16-3-4=9>>9 eggs.\n#### 18") == "18"
    assert answer_text("so the answer is $\\boxed{\\frac{1}{2}}$ and not \\boxed{3}.") == "3"
    assert (
        answer_text("We get \\boxed{\\left( 3, \\frac{\\pi}{2} \\right)}.")
        == "\\left( 3, \\frac{\\pi}{2} \\right)"
    )
    assert answer_text(27.0) == "27" and answer_text(-1.0) == "-1" and answer_text(0.25) == "0.25"
    assert answer_text(7) == "7" and answer_text(float("nan")) is None and answer_text(True) is None
    assert answer_text(["1"]) is None and answer_text("  ") is None and answer_text(None) is None
    kinds = {
        "18": "integer",
        "-3": "integer",
        "1,000": "integer",
        "0.5": "decimal",
        ".0000672": "decimal",
        "3/4": "fraction",
        "\\frac{3}{4}": "fraction",
        "-\\frac{35}{9}": "fraction",
        "\\frac43": "fraction",
        "\\sqrt{2}": "expression",
        "p - q": "expression",
        "(1,2)": "expression",
        "\\text{east}": "text",
        "Evelyn": "text",
    }
    assert {k: answer_type(k) for k in kinds} == kinds


def test_gsm8k_to_verl_parquet_with_a_seeded_split(tmp_path):
    src = DATA / "gsm8k" / "test.jsonl"
    s = convert(src, tmp_path / "a", val_size=100, seed=3)
    assert (s.question_column, s.answer_column, s.guessed) == ("question", "answer", True)
    assert (s.rows_read, s.train_rows, s.val_rows, s.duplicates_removed) == (1319, 1219, 100, 0)
    assert s.answer_types["integer"] == 1319
    train = load_samples(tmp_path / "a" / "train.parquet")  # what `dapo train` reads
    val = load_eval_set(tmp_path / "a" / "val.parquet")  # what `dapo eval` reads
    assert len(train) == 1219 and len(val.samples) == 100 and val.repeats == 1
    first = json.loads(src.read_text().splitlines()[0])
    by_raw = {x.extra_info["raw_problem"]: x for x in train + val.samples}
    row = by_raw[first["question"]]
    assert row.ground_truth == "18" and row.data_source == "math_dapo"
    assert row.prompt == [{"role": "user", "content": DAPO_TEMPLATE.format(problem=first["question"])}]
    assert row.extra_info["source_row"] == 0 and row.extra_info["split"] in ("train", "val")
    # the same seed gives the same split; another seed another one
    convert(src, tmp_path / "b", val_size=100, seed=3)
    convert(src, tmp_path / "c", val_size=0.1, seed=4)
    vals = [pq.read_table(tmp_path / d / "val.parquet").to_pylist() for d in "abc"]
    assert vals[0] == vals[1] and len(vals[2]) == 132 and vals[2] != vals[0]


def test_math500_boxed_and_dapo_math_17k_dedup(tmp_path):
    s = convert(DATA / "math500" / "test.jsonl", tmp_path / "m", template="boxed")
    assert (s.question_column, s.answer_column, s.train_rows) == ("problem", "answer", 500)
    ev = load_eval_set(tmp_path / "m" / "train.parquet")
    assert ev.samples[0].ground_truth == "\\left( 3, \\frac{\\pi}{2} \\right)"
    assert ev.samples[0].prompt[0]["content"].endswith(BOXED_SUFFIX) and ev.samples[0].data_source == "math"
    # the shared DAPO-Math-17k parquet is verl data already: its prompts keep their template, 627 repeats go
    s = convert(DATA / "dapo_math_17k" / "dapo_math_17k.parquet", tmp_path / "d", dedup=True)
    assert (s.rows_read, s.duplicates_removed, s.train_rows) == (17917, 627, 17290)
    rows = pq.read_table(tmp_path / "d" / "train.parquet").to_pylist()
    assert rows[0]["prompt"][0]["content"].count("Solve the following math problem") == 1


def test_duplicated_file_saved_dataset_and_csv(tmp_path):
    import datasets

    # a small file shaped like DAPO-Math-17k's release: each prompt many times; one row without an answer
    lines = [{"prompt": f"What is {i} + {i}?", "solution": str(2 * i)} for i in range(3) for _ in range(4)]
    lines.insert(5, {"prompt": "No answer here", "solution": None})
    dup = tmp_path / "dup.jsonl"
    dup.write_text("".join(json.dumps(x) + "\n" for x in lines))
    s = convert(dup, tmp_path / "o1", dedup=True, template="none")
    assert (s.rows_read, s.duplicates_removed, s.train_rows) == (13, 9, 3)
    assert s.dropped_empty == ["row 5: field 'solution' is empty or not text"]
    assert [x.ground_truth for x in load_samples(tmp_path / "o1" / "train.parquet")] == ["0", "2", "4"]
    assert convert(dup, tmp_path / "o2", template="none").train_rows == 12  # without --dedup every row stays

    # `datasets` saved to disk, with column names that need the flags, and two splits
    dd = datasets.DatasetDict(
        {
            "train": datasets.Dataset.from_dict({"q": ["1+1?", "2+2?"], "a": [2, 4]}),
            "test": datasets.Dataset.from_dict({"q": ["3+3?"], "a": [6]}),
        }
    )
    dd.save_to_disk(str(tmp_path / "saved"))
    with pytest.raises(DataError, match=r"no question column among q, a; name it with --question-column"):
        convert(tmp_path / "saved", tmp_path / "o3")
    s = convert(tmp_path / "saved", tmp_path / "o3", question_column="q", answer_column="a", template="none")
    assert s.train_rows == 2 and not s.guessed
    s = convert(
        tmp_path / "saved",
        tmp_path / "o4",
        question_column="q",
        answer_column="a",
        split="test",
        template="none",
    )
    assert [x.ground_truth for x in load_samples(tmp_path / "o4" / "train.parquet")] == ["6"]
    with pytest.raises(DataError, match=r"no split 'dev'; it has train, test"):
        read_dataset(tmp_path / "saved", "dev")

    csv = tmp_path / "qa.csv"
    csv.write_text('question,answer\n"What is 2, doubled?",4\nHow many legs has a cat?,4\n')
    s = convert(csv, tmp_path / "o5", template="none")
    assert [x.prompt[0]["content"] for x in load_samples(tmp_path / "o5" / "train.parquet")] == [
        "What is 2, doubled?",
        "How many legs has a cat?",
    ]


def test_inspect_counts_by_hand(tmp_path):
    rows = [
        {"question": "abc", "answer": "1"},
        {"question": "abc", "answer": "1"},
        {"question": "abcdefg", "answer": "\\frac{1}{2}"},
        {"question": "", "answer": "3"},
    ]
    f = tmp_path / "q.jsonl"
    f.write_text("".join(json.dumps(x) + "\n" for x in rows))
    r = inspect_dataset(f, tokenizer=build_tiny_tokenizer(), max_prompt_length=5)
    assert (r["rows"], r["distinct_prompts"], r["duplicate_prompts"], r["unusable_rows"]) == (4, 2, 1, 1)
    assert r["answer_types"] == {"integer": 2, "decimal": 0, "fraction": 1, "expression": 0, "text": 0}
    # the byte-level tiny tokenizer: a prompt renders as its text plus "\n", one token per byte: 4, 4, 8
    assert r["prompt_tokens"] == {"p50": 4, "p90": 8, "p99": 8, "max": 8}
    assert r["dropped_at_max_prompt_length"] == {"max_prompt_length": 5, "rows": 1}
    assert r["schema"] == {"question": "Value('string')", "answer": "Value('string')"}


def test_cli_bad_input_is_one_line_and_writes_nothing(tmp_path):
    out = tmp_path / "out"
    r = dapo("data", "convert", str(tmp_path / "missing.jsonl"), "--out", str(out))
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0 and "no such file or directory" in r.stderr
    bad = tmp_path / "x.txt"
    bad.write_text("hello\n")
    r = dapo("data", "convert", str(bad), "--out", str(out))
    assert r.returncode == 2 and "unsupported file type '.txt'" in r.stderr
    src = DATA / "gsm8k" / "test.jsonl"
    r = dapo("data", "convert", str(src), "--out", str(out), "--answer-column", "solution")
    assert (
        r.returncode == 2
        and "--answer-column 'solution': no such column; the data has question, answer" in r.stderr
    )
    assert not out.exists()
    r = dapo("data", "convert", str(src), "--out", str(out), "--val-size", "1319")
    assert r.returncode == 2 and "would leave no training rows" in r.stderr and not out.exists()
    r = dapo("data", "convert", str(src), "--out", str(out))
    assert r.returncode == 0 and "wrote train 1319 rows" in r.stdout
    before = (out / "train.parquet").read_bytes()
    r = dapo("data", "convert", str(DATA / "math500" / "test.jsonl"), "--out", str(out))
    assert r.returncode == 2 and "already exists; nothing written (--force to overwrite)" in r.stderr
    assert (out / "train.parquet").read_bytes() == before  # nothing already written is lost
    r = dapo("data", "inspect", str(out / "train.parquet"), "--max-prompt-length", "10")
    assert r.returncode == 2 and "--max-prompt-length needs --tokenizer" in r.stderr
    r = dapo("data", "inspect", str(out / "train.parquet"), "--tokenizer", "embedded", "--json")
    assert r.returncode == 0, r.stderr[-2000:]
    report = json.loads(r.stdout)
    assert report["rows"] == 1319 and report["format"] == "verl" and report["prompt_tokens"]["max"] > 100
    r = dapo(
        "data", "inspect", str(out / "train.parquet"), "--tokenizer", "embedded", "--max-prompt-length", "64"
    )
    top = report["prompt_tokens"]["max"]
    assert r.stdout.strip().splitlines()[-1] == (
        f"dapo train would drop 1319 row(s) at data.max_prompt_length=64: every prompt; raise it to at least {top} "
        "to keep them all"
    )


@pytest.mark.slow
def test_converted_files_run_through_dapo_train_and_dapo_eval(base_model, tmp_path):
    out = tmp_path / "gsm"
    convert(DATA / "gsm8k" / "test.jsonl", out, template="none", val_size=16, seed=0)
    r = dapo(
        "eval",
        "--model",
        str(base_model),
        "--data",
        str(out / "val.parquet"),
        "--n",
        "2",
        "--max-tokens",
        "8",
        "--output",
        str(tmp_path / "ev"),
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads((tmp_path / "ev" / "summary.json").read_text())["gsm_val"]["num_problems"] == 16
    run = tmp_path / "run"
    r = dapo(
        "train",
        f"model.path={base_model}",
        f"trainer.output_dir={run}",
        f"data.train_files=[{out / 'train.parquet'}]",
        f"data.val_files=[{out / 'val.parquet'}]",
        "data.max_prompt_length=512",
        "data.max_response_length=8",
        "algorithm.overlong_buffer.len=4",
        "algorithm.filter_groups.enable=false",
        "data.train_batch_size=4",
        "data.gen_batch_size=4",
        "rollout.n=2",
        "actor.ppo_mini_batch_size=4",
        "trainer.total_training_steps=1",
        "trainer.test_freq=-1",
        "trainer.progress_bar=false",
    )
    assert r.returncode == 0, r.stderr[-3000:]
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["step"] == 1 and rows[-1]["train/gen_samples"] == 8
