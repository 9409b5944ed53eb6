"""Evaluation: the unbiased pass@k estimator, majority votes with ties, the shared file formats, `dapo eval`."""

import json
import shutil
from math import comb
from pathlib import Path

import pytest

from dapo_rl.cli import main
from dapo_rl.collect import Rollout
from dapo_rl.data import Sample
from dapo_rl.evaluate import dataset_metrics, ks_up_to, load_eval_set, majority_vote, pass_at_k
from dapo_rl.models.tiny import build_tiny_model, build_tiny_tokenizer

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


@pytest.mark.parametrize(
    "n, c, k", [(10, 3, 1), (10, 3, 2), (10, 3, 5), (32, 1, 4), (5, 0, 3), (8, 8, 8), (7, 2, 6)]
)
def test_pass_at_k_matches_the_closed_form(n, c, k):
    assert pass_at_k(n, c, k) == pytest.approx(1 - comb(n - c, k) / comb(n, k), abs=1e-12)


def test_pass_at_k_hand_values_and_errors():
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)
    assert pass_at_k(4, 1, 2) == pytest.approx(0.5)  # 1 - C(3,2)/C(4,2) = 1 - 3/6
    assert pass_at_k(4, 3, 2) == 1.0  # n - c < k: any 2 of 4 hold a correct one
    with pytest.raises(ValueError):
        pass_at_k(4, 5, 1)
    with pytest.raises(ValueError):
        pass_at_k(4, 1, 5)


def test_majority_vote_ties_go_to_the_first_answer_and_invalid_does_not_vote():
    assert majority_vote(["5", "6", "6"], [True, False, False]) is False
    assert majority_vote(["5", "6", "5", "6"], [True, False, True, False]) is True  # tie: 5 came first
    assert majority_vote(["6", "5", "5", "6"], [False, True, True, False]) is False  # tie: 6 came first
    assert majority_vote(["[INVALID]", "", "[INVALID]", "7"], [False, False, False, True]) is True
    assert majority_vote(["", "[INVALID]"], [False, False]) is False


def test_dataset_metrics_by_hand():
    rec = []
    # problem 0: answers 3,4,3,3 (right: 3) -> 3/4 right; problem 1: 1,2,2,1 (right: 2) -> tie 1 first -> maj wrong
    for p, answers, right in ((0, "3433", "3"), (1, "1221", "2")):
        for j, a in enumerate(answers):
            rec.append(
                Rollout(
                    Sample(f"t:{p}", "math", [{"role": "user", "content": "q"}], right),
                    problem_idx=p,
                    sample_idx=j,
                    pred=a,
                    acc=a == right,
                    response_length=10 + j,
                    finish_reason="length" if j == 3 else "stop",
                )
            )
    m = dataset_metrics(rec, 4)
    assert m["avg@4"] == pytest.approx((3 + 2) / 8)
    assert m["pass@1"] == pytest.approx((0.75 + 0.5) / 2)
    assert m["pass@2"] == pytest.approx((1.0 + (1 - comb(2, 2) / comb(4, 2))) / 2)
    assert m["maj@1"] == pytest.approx(0.5)  # first answers: 3 (right), 1 (wrong)
    assert m["maj@4"] == pytest.approx(0.5)
    assert m["response_length_mean"] == 11.5 and m["truncation_rate"] == 0.25
    # per-problem means 0.75 and 0.5: sd (ddof 1) = 0.25 / sqrt(2), over sqrt(2) problems -> 0.125
    assert m["avg@4_stderr"] == pytest.approx(0.125)
    assert ks_up_to(6) == [1, 2, 4, 6] and ks_up_to(32) == [1, 2, 4, 8, 16, 32]


def test_shared_formats_are_detected():
    aime = load_eval_set(DATA / "aime24_dapo" / "aime-2024.parquet")
    assert len(aime.samples) == 30 and aime.repeats == 32 and aime.extra["rows"] == 960
    gsm = load_eval_set(DATA / "gsm8k" / "test.jsonl", template="boxed")
    assert len(gsm.samples) == 1319 and gsm.samples[0].ground_truth == "18"
    assert gsm.samples[0].prompt[0]["content"].endswith("within \\boxed{}.")
    amc = load_eval_set(DATA / "amc23" / "test.jsonl", template="dapo")
    assert amc.samples[0].ground_truth == "27.0" and "Answer: $Answer" in amc.samples[0].prompt[0]["content"]
    qwq = load_eval_set(DATA / "qwq_eval" / "aime24.jsonl", template="boxed")
    assert (
        qwq.samples[0].prompt[0]["content"].count("\\boxed{}") == 1
    )  # already asks for a box: not added twice
    assert len(load_eval_set(DATA / "math500" / "test.jsonl").samples) == 500
    assert load_eval_set(DATA / "aime24" / "test.jsonl").samples[0].ground_truth == "204"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A randomly initialised tiny checkpoint for `dapo eval`, written once for this module."""
    path = tmp_path_factory.mktemp("model")
    build_tiny_model().save_pretrained(path)
    build_tiny_tokenizer().save_pretrained(path)
    return path


def test_dapo_eval_summary_recomputes_from_generations_and_resumes(model_dir, tmp_path, capsys):
    model_dir = Path(shutil.copytree(model_dir, tmp_path / "model"))  # its weights go away below
    data = tmp_path / "mini.jsonl"
    data.write_text(
        "".join(json.dumps({"problem": f"{i} + 1 =", "answer": str(i + 1)}) + "\n" for i in range(5))
    )
    out = tmp_path / "out"
    argv = [
        "eval",
        "--model",
        str(model_dir),
        "--data",
        str(data),
        "--n",
        "3",
        "--max-tokens",
        "6",
        "--output",
        str(out),
    ]
    # --limit: the first 2 problems only; the full run into the same output then adds the other 3
    assert main([*argv, "--limit", "2"]) == 0
    first = (out / "generations.jsonl").read_text().splitlines()
    assert len(first) == 6 and {json.loads(x)["problem_idx"] for x in first} == {0, 1}
    assert json.loads((out / "summary.json").read_text())["mini"]["num_problems"] == 2
    assert "limit 2" in (out / "report.md").read_text()
    capsys.readouterr()
    assert main(argv) == 0
    assert "mini: 2 of 5 problems already in" in capsys.readouterr().err
    assert (out / "generations.jsonl").read_text().splitlines()[:6] == first
    gens = [json.loads(x) for x in (out / "generations.jsonl").read_text().splitlines()]
    assert len(gens) == 15 and {g["problem_idx"] for g in gens} == set(range(5))
    summary = json.loads((out / "summary.json").read_text())["mini"]
    assert summary == {
        **dataset_metrics([Rollout.from_record(g) for g in gens], 3),
        "rows": 5,
        "rows_per_problem": 1,
        "dropped_prompts": 0,
    }
    report = (out / "report.md").read_text().splitlines()
    assert report[0] == f"# dapo eval: `{model_dir}`"
    assert (
        report[4]
        == "| dataset | problems | avg@3 | pass@3 | maj@3 | mean length | truncated | unscored | dropped prompts |"
    )
    assert report[6].startswith(f"| mini | 5 | {summary['avg@3']:.4f} ± {summary['avg@3_stderr']:.4f} | ")
    # a rerun skips finished problems: nothing is generated again, and it says so; with nothing to sample it does
    # not load the model (its weights are gone, and it still finishes)
    (model_dir / "model.safetensors").unlink()
    capsys.readouterr()
    assert main(argv) == 0
    assert "mini: 5 of 5 problems already in" in capsys.readouterr().err
    assert len((out / "generations.jsonl").read_text().splitlines()) == 15
    # other settings into the same output are refused
    assert main([*argv[:-2], "--temperature", "0.5", "--output", str(out)]) == 2
    assert "other settings (temperature)" in capsys.readouterr().err
    # a later --limit reads back only its problems, not the ones finished before
    assert main([*argv, "--limit", "1"]) == 0
    assert json.loads((out / "summary.json").read_text())["mini"]["num_problems"] == 1
    assert main([*argv, "--limit", "0"]) == 2
    assert "--limit=0 must be >= 1" in capsys.readouterr().err


def test_dapo_eval_reports_responses_the_verifier_could_not_score(model_dir, tmp_path, monkeypatch, capsys):
    """A verifier that raises: its share per dataset in summary.json, report.md and on stderr, the first error's
    message once, and exit 5 when it scored none of a dataset (its accuracies would be zeros that mean nothing)."""
    (tmp_path / "flaky_rewards.py").write_text(
        "def half(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    if int(ground_truth) % 2:\n"
        "        raise KeyError('no table for ' + ground_truth)\n"
        "    return 0.0\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    data = tmp_path / "mini.jsonl"
    data.write_text(
        "".join(json.dumps({"problem": f"{i} + 1 =", "answer": str(i + 1)}) + "\n" for i in range(4))
    )
    argv = ["eval", "--model", str(model_dir), "--data", str(data), "--n", "2", "--max-tokens", "4"]
    argv += ["--num-workers", "0"]
    assert main([*argv, "--verifier", "flaky_rewards:half", "--output", str(tmp_path / "half")]) == 0
    err = capsys.readouterr().err
    summary = json.loads((tmp_path / "half" / "summary.json").read_text())["mini"]
    assert (summary["error_rate"], summary["timeout_rate"]) == (0.5, 0.0)  # answers 1 and 3 of 1..4
    assert err.count("could not be scored and counts as wrong (KeyError") == 1  # the first error, once
    assert "dapo eval: warning: mini: 50.0% of the responses could not be scored" in err
    gens = [json.loads(x) for x in (tmp_path / "half" / "generations.jsonl").read_text().splitlines()]
    assert sorted(g["status"] for g in gens) == ["error"] * 4 + ["ok"] * 4
    report = (tmp_path / "half" / "report.md").read_text()
    assert (
        "| truncated | unscored |" in report and f"| {summary['truncation_rate']:.3f} | 0.500 | 0 |" in report
    )
    # one dataset the verifier scored nothing of, beside one it scored: exit 5, that dataset named
    odd = tmp_path / "odd.jsonl"
    odd.write_text(
        "".join(json.dumps({"problem": f"{i} + 2 =", "answer": str(i + 2)}) + "\n" for i in (1, 3))
    )
    both = [*argv, "--data", str(odd), "--verifier", "flaky_rewards:half", "--output", str(tmp_path / "both")]
    assert main(both) == 5
    err = capsys.readouterr().err
    assert "odd: 100.0% of the responses could not be scored" in err and "mini: 50.0%" in err
    assert err.count("counts as wrong (KeyError") == 1  # once for the whole evaluation, not once per dataset
    assert err.rstrip().endswith("error: the verifier flaky_rewards:half scored none of the responses of odd")
    assert json.loads((tmp_path / "both" / "summary.json").read_text())["odd"]["error_rate"] == 1.0
    # generations written before `status` existed: the unscored share is unknown, not 0
    gen = tmp_path / "half" / "generations.jsonl"
    gen.write_text("".join(json.dumps({k: v for k, v in g.items() if k != "status"}) + "\n" for g in gens))
    assert main([*argv, "--verifier", "flaky_rewards:half", "--output", str(tmp_path / "half")]) == 0
    err = capsys.readouterr().err
    assert "mini: some generations in" in err and "is unknown" in err and "warning" not in err
    summary = json.loads((tmp_path / "half" / "summary.json").read_text())["mini"]
    assert summary["error_rate"] is None and " | ? | 0 |" in (tmp_path / "half" / "report.md").read_text()


def test_dapo_eval_names_a_split_file_by_its_folder(model_dir, tmp_path, capsys):
    """One problem: the set named by folder and file; no standard error (null, `-` in the table, "one problem" in
    the report: a spread over one problem is undefined, not 0); the console table one metric per line."""
    (tmp_path / "sums").mkdir()
    data = tmp_path / "sums" / "test.jsonl"
    data.write_text(json.dumps({"problem": "1 + 1 =", "answer": "2"}) + "\n")
    out = tmp_path / "out"
    argv = ["eval", "--model", str(model_dir), "--data", str(data), "--max-tokens", "4", "--output", str(out)]
    assert main(argv) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert list(summary) == ["sums_test"] and summary["sums_test"]["avg@1_stderr"] is None
    table = capsys.readouterr().out.splitlines()
    assert table[0].split() == ["metric", "sums_test"]
    assert table[2].split() == ["avg@1_stderr", "-"] and table[3].split() == [
        "pass@1",
        f"{summary['sums_test']['pass@1']:.4f}",
    ]
    assert max(map(len, table[:-1])) < 40
    assert (
        "| sums_test | 1 | " in (out / "report.md").read_text()
        and " (one problem) |" in (out / "report.md").read_text()
    )
    assert json.loads((out / "generations.jsonl").read_text())["dataset"] == "sums_test"


def test_a_problem_answer_parquet_is_read_too(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    p = tmp_path / "pa.parquet"
    pq.write_table(pa.table({"problem": ["1+1?", "2+2?", "1+1?"], "answer": [2, 4, 2]}), p)
    es = load_eval_set(p)
    assert [s.ground_truth for s in es.samples] == ["2", "4"] and es.extra["rows"] == 3


def test_dapo_eval_with_the_tool_episode(model_dir, tmp_path, capsys):
    """`--episode tool`: the same command samples through the tool episode (each generation's calls recorded, the
    tool's share in the summary, the settings in eval_config.json); its flags refused where they do not apply."""
    data = tmp_path / "mini.jsonl"
    data.write_text(
        "".join(json.dumps({"problem": f"{i} + 1 =", "answer": str(i + 1)}) + "\n" for i in range(3))
    )
    argv = ["eval", "--model", str(model_dir), "--data", str(data), "--n", "2", "--max-tokens", "8"]
    out = tmp_path / "tool"
    assert main([*argv, "--episode", "tool", "--max-tool-calls", "2", "--output", str(out)]) == 0
    gens = [json.loads(x) for x in (out / "generations.jsonl").read_text().splitlines()]
    assert len(gens) == 6 and all(g["tool_calls"] == [] for g in gens)  # a random model writes no </code>
    summary = json.loads((out / "summary.json").read_text())["mini"]
    assert (summary["tool_used_rate"], summary["tool_calls_mean"]) == (0.0, 0.0)
    settings = json.loads((out / "eval_config.json").read_text())
    assert (settings["episode"], settings["episode_tool"]["max_calls"]) == ("tool", 2)
    assert (
        settings["episode_tool"]["max_output_tokens"] == 256 and "num_workers" not in settings["episode_tool"]
    )
    plain = tmp_path / "plain"
    assert main([*argv, "--output", str(plain)]) == 0
    assert "episode" not in json.loads(
        (plain / "eval_config.json").read_text()
    )  # older outputs stay comparable
    assert "tool_used_rate" not in json.loads((plain / "summary.json").read_text())["mini"]
    capsys.readouterr()
    assert main([*argv, "--max-tool-calls", "2", "--output", str(tmp_path / "x")]) == 2
    assert "--max-tool-calls is for --episode tool" in capsys.readouterr().err
    assert main([*argv, "--episode", "tool", "--max-tool-calls", "0", "--output", str(tmp_path / "x")]) == 2
    assert "--max-tool-calls=0 must be >= 1" in capsys.readouterr().err
    served = ["--engine", "openai", "--base-url", "http://127.0.0.1:9/v1"]
    assert main([*argv, "--episode", "tool", *served, "--output", str(tmp_path / "x")]) == 2
    assert "--episode tool needs a local model" in capsys.readouterr().err
    assert main([*argv, "--episode", "nope", "--output", str(tmp_path / "x")]) == 2
    assert "--episode='nope' is not one of single_turn, tool" in capsys.readouterr().err


def test_dapo_eval_takes_a_checkpoints_tool_settings_from_its_run(model_dir, tmp_path, capsys, monkeypatch):
    """A checkpoint of a tool run (`<run>/checkpoints/global_step_N/model` beside the run's config.yaml) is
    evaluated with the episode and the tool settings it was trained with, unless a flag says otherwise."""
    import shutil

    from dapo_rl.config import ConfigError, load_config, to_yaml
    from dapo_rl.episode.base import trained_episode

    run = tmp_path / "run"
    model = run / "checkpoints" / "global_step_3" / "model"
    shutil.copytree(model_dir, model)
    trained = ["episode.name=tool", "episode.tool.max_calls=3", "episode.tool.max_output_tokens=40"]
    (run / "config.yaml").write_text(
        to_yaml(load_config("tiny_chain_sum", [*trained, "episode.tool.call_end=</py>"]))
    )
    data = tmp_path / "mini.jsonl"
    data.write_text(json.dumps({"problem": "1 + 1 =", "answer": "2"}) + "\n")
    argv = ["eval", "--model", str(model), "--data", str(data), "--n", "2", "--max-tokens", "8"]
    capsys.readouterr()
    assert main([*argv, "--output", str(tmp_path / "a")]) == 0
    assert f"episode: tool, as the model was trained ({run / 'config.yaml'})" in capsys.readouterr().err
    tool = json.loads((tmp_path / "a" / "eval_config.json").read_text())["episode_tool"]
    assert (tool["max_calls"], tool["max_output_tokens"], tool["call_end"]) == (3, 40, "</py>")
    assert main([*argv, "--max-tool-calls", "1", "--output", str(tmp_path / "b")]) == 0
    tool = json.loads((tmp_path / "b" / "eval_config.json").read_text())["episode_tool"]
    assert (tool["max_calls"], tool["max_output_tokens"]) == (1, 40)
    assert main([*argv, "--episode", "single_turn", "--output", str(tmp_path / "c")]) == 0
    assert "episode" not in json.loads((tmp_path / "c" / "eval_config.json").read_text())
    assert "tool_calls" not in json.loads((tmp_path / "c" / "generations.jsonl").read_text().splitlines()[0])
    capsys.readouterr()
    # the tool run's output is not taken for a run without the tool, nor the reverse
    assert main([*argv, "--episode", "single_turn", "--output", str(tmp_path / "a")]) == 2
    assert "other settings (episode, episode_tool)" in capsys.readouterr().err
    assert main([*argv, "--output", str(tmp_path / "c")]) == 2
    # a relative path from the checkpoint's directory finds the run too
    monkeypatch.chdir(model.parent)
    assert main([*argv[:2], "model", *argv[3:], "--output", str(tmp_path / "d")]) == 0
    assert json.loads((tmp_path / "d" / "eval_config.json").read_text())["episode"] == "tool"
    # a config.yaml of an older version (a setting since removed) still gives its episode; a broken episode
    # section is named, and --episode chooses past it
    saved = (run / "config.yaml").read_text()
    (run / "config.yaml").write_text(saved + "retired_section: {x: 1}\n")
    assert trained_episode(str(model))[0].tool.max_calls == 3
    (run / "config.yaml").write_text(saved.replace("max_calls: 3", "max_calls: 0"))
    with pytest.raises(ConfigError, match="cannot read the episode: section of .*config.yaml"):
        trained_episode(str(model))
    capsys.readouterr()
    assert main([*argv, "--output", str(tmp_path / "e")]) == 2
    assert "choose the episode with --episode" in capsys.readouterr().err
    assert main([*argv, "--episode", "single_turn", "--output", str(tmp_path / "e")]) == 0
    assert trained_episode(str(model_dir)) is None  # not a checkpoint of a run
