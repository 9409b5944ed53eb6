"""`dapo score`: one response or a JSONL file, through the real verifiers and the reward pool."""

import json

from dapo_rl.cli import main


def test_score_one_response(tmp_path, capsys):
    f = tmp_path / "resp.txt"
    f.write_text("Let me think.\n\nAnswer: $\\dfrac{1}{2}$.")
    assert main(["score", "--response-file", str(f), "--ground-truth", "0.5"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out) == {"score": 1.0, "acc": True, "pred": "\\frac{1}{2}"}
    assert json.loads(err)["acc_mean"] == 1.0
    assert main(["score", "--response-file", str(f), "--ground-truth", "0.5", "--verifier", "math_dapo"]) == 0
    assert json.loads(capsys.readouterr().out)["acc"] is False  # DAPO's scorer: no symbolic equivalence


def test_score_jsonl_with_summary_and_output_file(tmp_path, capsys):
    rows = [
        {"response": "Answer: 540", "ground_truth": "540"},
        {"response": "\\boxed{541}", "ground_truth": "540"},
        {
            "response": "Answer: 3",
            "ground_truth": "3",
            "data_source": "reasoning_gym/chain_sum",
            "extra_info": {"question": "1 + 2 =", "metadata": {}},
        },
    ]
    src = tmp_path / "in.jsonl"
    src.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    out = tmp_path / "out.jsonl"
    assert main(["score", "--jsonl", str(src), "--output", str(out), "--num-workers", "2"]) == 0
    got = [json.loads(x) for x in out.read_text().splitlines()]
    assert [g["acc"] for g in got] == [True, False, True]
    summary = json.loads(capsys.readouterr().err)
    assert summary["responses"] == 3 and summary["acc_mean"] == 2 / 3


def test_score_bad_rows_name_file_line_and_field(tmp_path, capsys):
    src = tmp_path / "bad.jsonl"
    src.write_text(
        json.dumps({"response": "Answer: 1", "ground_truth": "1"}) + "\n" + json.dumps({"response": "x"})
    )
    assert main(["score", "--jsonl", str(src)]) == 2
    assert "bad.jsonl: line 2: field 'ground_truth' is missing" in capsys.readouterr().err
    for row, message in [
        ({"response": None, "ground_truth": "1"}, "field 'response' must be a string, got null"),
        ({"response": 5, "ground_truth": "1"}, "field 'response' must be a string, got int"),
        (
            {"response": "x", "ground_truth": [5]},
            "field 'ground_truth' must be a string or a number, got list",
        ),
        (
            {"response": "x", "ground_truth": True},
            "field 'ground_truth' must be a string or a number, got bool",
        ),
        (
            {"response": "x", "ground_truth": None},
            "field 'ground_truth' must be a string or a number, got null",
        ),
        (
            {"response": "x", "ground_truth": "1", "extra_info": "oops"},
            "field 'extra_info' must be an object",
        ),
    ]:
        src.write_text(json.dumps({"response": "Answer: 1", "ground_truth": "1"}) + "\n" + json.dumps(row))
        assert main(["score", "--jsonl", str(src)]) == 2
        assert f"bad.jsonl: line 2: {message}" in capsys.readouterr().err
    src.write_text('{"response": "x", "ground_truth": NaN}\n')
    assert main(["score", "--jsonl", str(src)]) == 2
    assert "bad.jsonl: line 1: field 'ground_truth' is not a finite number" in capsys.readouterr().err
    src.write_text("")
    assert main(["score", "--jsonl", str(src)]) == 0
    assert json.loads(capsys.readouterr().err.strip().splitlines()[-1])["acc_mean"] is None
    assert main(["score", "--response", "Answer: 1"]) == 2
    assert "--ground-truth is required" in capsys.readouterr().err
    assert main(["score", "--response", "Answer: 1", "--ground-truth", "1", "--verifier", "nope"]) == 2
    assert "unknown verifier" in capsys.readouterr().err


def test_score_output_that_would_overwrite_the_input_or_is_a_directory_is_refused(tmp_path, capsys):
    rows = tmp_path / "rows.jsonl"
    original = json.dumps({"response": "Answer: 5", "ground_truth": "5"}) + "\n"
    rows.write_text(original)
    assert main(["score", "--jsonl", str(rows), "--output", str(rows)]) == 2
    assert "is the --jsonl input" in capsys.readouterr().err
    assert rows.read_text() == original  # nothing lost
    assert main(["score", "--jsonl", str(rows), "--output", str(tmp_path)]) == 2
    assert "is a directory" in capsys.readouterr().err
    assert main(["score", "--jsonl", str(rows), "--output", str(tmp_path / "no" / "out.jsonl")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_overrides_may_follow_resume():
    from dapo_rl.cli import _flags_last, _parser

    args = _parser().parse_args(_flags_last(["train", "a.b=1", "--resume", "c.d=2"]))
    assert args.resume and [args.recipe, *args.overrides] == ["a.b=1", "c.d=2"]


def test_score_refuses_a_timeout_that_is_not_a_finite_positive_number(capsys):
    for bad in ("nan", "inf", "0", "-1", "3e6"):
        assert main(["score", "--response", "Answer: 5", "--ground-truth", "5", "--timeout-s", bad]) == 2
        err = capsys.readouterr().err.strip()
        assert err.endswith(f"--timeout-s={float(bad)} must be a finite number > 0 and <= 86400"), err
        assert len(err.splitlines()) == 1
    assert main(["score", "--response", "Answer: 5", "--ground-truth", "5", "--num-workers", "-1"]) == 2
    assert "--num-workers=-1 must be >= 0" in capsys.readouterr().err
    assert main(["score", "--response", "Answer: 5", "--ground-truth", "5", "--num-workers", "100000"]) == 2
    assert (
        "--num-workers=100000 must be >= 0 (0: score in this process) and <= 512" in capsys.readouterr().err
    )
    assert main(["score", "--response", "Answer: 5", "--ground-truth", "5", "--timeout-s", "2.5"]) == 0
    assert json.loads(capsys.readouterr().out)["acc"] is True
