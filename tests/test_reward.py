"""Tests of dapo_rl.reward: DAPO's "Answer:" verifier, the reasoning-gym verifier, data_source dispatch."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from dapo_rl.reward import (
    INVALID_PRED,
    compute_score,
    compute_score_math_dapo,
    compute_score_reasoning_gym,
    last_answer_line,
    normalize_final_answer,
)

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
AIME24_DAPO = DATA / "aime24_dapo" / "aime-2024.parquet"
DAPO_MATH_17K = DATA / "dapo_math_17k" / "dapo_math_17k.parquet"

# A realistic preamble long enough to push an early "Answer:" line out of the 300-character window.
REASONING = "Let me work through this carefully. " * 12


def _assert_result(result: dict, score: float, acc: bool) -> None:
    assert result["score"] == score
    assert result["acc"] is acc
    assert isinstance(result["pred"], str)
    assert "error" not in result


# --- DAPO "Answer:" verifier --------------------------------------------------------------------------------


def test_math_dapo_plain_answer_line_is_correct():
    result = compute_score_math_dapo(REASONING + "\nAnswer: 540", "540")
    assert result == {"score": 1.0, "acc": True, "pred": "540"}


def test_math_dapo_wrong_answer():
    result = compute_score_math_dapo("So the result follows.\nAnswer: 541", "540")
    assert result == {"score": -1.0, "acc": False, "pred": "541"}


def test_math_dapo_quirk_trailing_period_fails():
    # Kept on purpose: DAPO's scorer does not strip a trailing period.
    result = compute_score_math_dapo("Answer: 540.", "540")
    _assert_result(result, -1.0, False)
    assert result["pred"] == "540."


def test_math_dapo_quirk_bold_without_answer_line_fails():
    result = compute_score_math_dapo("The final result is **540**", "540")
    assert result == {"score": -1.0, "acc": False, "pred": INVALID_PRED}


def test_math_dapo_quirk_bold_inside_answer_line_fails():
    _assert_result(compute_score_math_dapo("Answer: **540**", "540"), -1.0, False)


def test_math_dapo_quirk_boxed_without_answer_line_fails():
    result = compute_score_math_dapo("Therefore the result is $\\boxed{540}$.", "540")
    assert result == {"score": -1.0, "acc": False, "pred": INVALID_PRED}


def test_math_dapo_boxed_inside_answer_line_is_unwrapped():
    _assert_result(compute_score_math_dapo("Answer: $\\boxed{540}$", "540"), 1.0, True)


def test_math_dapo_last_answer_line_wins():
    _assert_result(
        compute_score_math_dapo("Answer: 1\nWait, I made an error.\nAnswer: 540", "540"), 1.0, True
    )
    _assert_result(
        compute_score_math_dapo("Answer: 540\nWait, I made an error.\nAnswer: 1", "540"), -1.0, False
    )


def test_math_dapo_answer_before_last_300_chars_is_ignored():
    response = "Answer: 540\n" + "x" * 300
    assert compute_score_math_dapo(response, "540") == {"score": -1.0, "acc": False, "pred": INVALID_PRED}
    # The same line inside the window counts.
    _assert_result(compute_score_math_dapo("Answer: 540\n" + "x" * 280, "540"), 1.0, True)


def test_math_dapo_answer_is_case_insensitive():
    _assert_result(compute_score_math_dapo("ANSWER : 540", "540"), 1.0, True)
    _assert_result(compute_score_math_dapo("answer:540", "540"), 1.0, True)


@pytest.mark.parametrize(
    ("answer_line", "ground_truth"),
    [
        ("Answer: $\\frac{1}{2}$", "\\frac{1}{2}"),
        ("Answer: \\frac12", "\\frac{1}{2}"),
        ("Answer: \\sqrt2", "\\sqrt{2}"),
        ("Answer: 1,000", "1000"),
        ("Answer: 10 degrees", "10"),
        ("Answer: 10^\\circ", "10"),
        ("Answer: x = 5", "5"),
        ("Answer: \\text{(B)}", "(B)"),
        ("Answer: $540$ dollars", "540"),
        ("Answer: 540\r", "540"),
    ],
)
def test_math_dapo_normalisation_equivalences(answer_line, ground_truth):
    _assert_result(compute_score_math_dapo(REASONING + "\n" + answer_line, ground_truth), 1.0, True)


@pytest.mark.parametrize(
    ("raw", "normalised"),
    [
        ("$\\frac{1}{2}$", "\\frac{1}{2}"),
        ("\\dfrac12", "\\dfrac{1}{2}"),
        ("\\sqrt3", "\\sqrt{3}"),
        ("1,000,000", "1000000"),
        ("-1,000", "-1,000"),  # only unsigned comma-grouped integers lose their commas
        ("\\textbf{7}", "7"),
        ("\\overline{12}", "12"),
        ("5 \\text{ cm}^2", "5"),  # "cm" goes, then the empty "\\text{}^2" it leaves
        ("x = \\boxed{\\{1, 2\\}}", "\\{1,2\\}"),
        ("[INVALID]", "[INVALID]"),
    ],
)
def test_normalize_final_answer(raw, normalised):
    assert normalize_final_answer(raw) == normalised


def test_last_answer_line():
    assert last_answer_line("no answer here") is None
    assert last_answer_line("Answer: 1\nAnswer:  2 \nthe end") == "2 "
    assert last_answer_line("Answer: 1\n" + "y" * 10, window=5) is None
    assert last_answer_line("Answer:\n42") == "42"  # the blank after the colon may span a line break


def test_math_dapo_coerces_ground_truth_to_str():
    _assert_result(compute_score_math_dapo("Answer: 540", 540), 1.0, True)


def test_math_dapo_never_raises_on_bad_response():
    result = compute_score_math_dapo(None, "540")  # type: ignore[arg-type]
    assert result["score"] == -1.0 and result["acc"] is False and result["pred"] == ""
    assert result["error"].startswith("TypeError: ")


def _parquet_rows(path: Path, limit: int | None = None) -> list[dict]:
    pq = pytest.importorskip("pyarrow.parquet")
    if not path.exists():
        pytest.skip(f"missing data file {path}")
    table = pq.read_table(path, columns=["data_source", "reward_model", "extra_info"])
    if limit is not None:
        table = table.slice(0, limit)
    return table.to_pylist()


def test_aime24_dapo_ground_truths_score_one():
    rows = _parquet_rows(AIME24_DAPO)
    by_problem = {row["extra_info"]["index"]: row for row in rows}
    assert len(by_problem) == 30  # 30 problems x 32 copies; two problems share the answer 033 -> "33"
    for row in by_problem.values():
        truth = row["reward_model"]["ground_truth"]
        response = f"{REASONING}\nThus the answer is {truth}.\nAnswer: {truth}"
        result = compute_score(row["data_source"], response, truth, row["extra_info"])
        assert result == {"score": 1.0, "acc": True, "pred": truth}, (truth, result)
        assert compute_score(row["data_source"], f"Answer: {truth}1", truth)["score"] == -1.0


def test_dapo_math_17k_ground_truths_score_one():
    rows = _parquet_rows(DAPO_MATH_17K, limit=200)
    assert len(rows) == 200
    for row in rows:
        assert row["data_source"] == "DAPO-17k"
        truth = row["reward_model"]["ground_truth"]
        result = compute_score(row["data_source"], f"{REASONING}\nAnswer: {truth}", truth, row["extra_info"])
        assert result["score"] == 1.0 and result["acc"] is True, (truth, result)


# --- reasoning-gym verifier ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def chain_sum_entries() -> list[dict]:
    reasoning_gym = pytest.importorskip("reasoning_gym")
    dataset = reasoning_gym.create_dataset("chain_sum", size=5, seed=0)
    return [dataset[i] for i in range(len(dataset))]


def _extra_info(entry: dict) -> dict:
    return {"question": entry["question"], "metadata": entry["metadata"]}


def test_reasoning_gym_correct_answer(chain_sum_entries):
    for entry in chain_sum_entries:
        response = f"Adding the terms one by one.\nAnswer: {entry['answer']}"
        result = compute_score_reasoning_gym("chain_sum", response, entry["answer"], _extra_info(entry))
        assert result == {"score": 1.0, "acc": True, "pred": entry["answer"]}


def test_reasoning_gym_wrong_answer(chain_sum_entries):
    for entry in chain_sum_entries:
        wrong = str(int(entry["answer"]) + 1)
        result = compute_score_reasoning_gym(
            "chain_sum", f"Answer: {wrong}", entry["answer"], _extra_info(entry)
        )
        assert result == {"score": -1.0, "acc": False, "pred": wrong}


def test_reasoning_gym_without_answer_line(chain_sum_entries):
    entry = chain_sum_entries[0]
    result = compute_score_reasoning_gym("chain_sum", entry["answer"], entry["answer"], _extra_info(entry))
    assert result == {"score": -1.0, "acc": False, "pred": ""}


def test_reasoning_gym_metadata_round_tripped_through_json(chain_sum_entries):
    for entry in chain_sum_entries:
        assert isinstance(entry["metadata"]["difficulty"]["num_terms"], tuple)
        info = json.loads(json.dumps(_extra_info(entry)))
        result = compute_score_reasoning_gym("chain_sum", f"Answer: {entry['answer']}", entry["answer"], info)
        assert result["score"] == 1.0 and result["acc"] is True
        # Metadata stored as a JSON string (as a parquet column might hold it) is decoded.
        info_str = {"question": entry["question"], "metadata": json.dumps(entry["metadata"])}
        result = compute_score_reasoning_gym(
            "chain_sum", f"Answer: {entry['answer']}", entry["answer"], info_str
        )
        assert result["score"] == 1.0


def test_reasoning_gym_without_extra_info(chain_sum_entries):
    entry = chain_sum_entries[1]
    result = compute_score_reasoning_gym("chain_sum", f"Answer:  {entry['answer']} ", entry["answer"], None)
    assert result == {"score": 1.0, "acc": True, "pred": entry["answer"]}


def test_reasoning_gym_unknown_task_returns_error_without_raising():
    result = compute_score_reasoning_gym("no_such_task", "Answer: 3", "3", {})
    assert result["score"] == -1.0 and result["acc"] is False and result["pred"] == ""
    assert result["error"].startswith("ValueError: ")


def test_reasoning_gym_malformed_metadata_returns_error(chain_sum_entries):
    entry = chain_sum_entries[0]
    result = compute_score_reasoning_gym(
        "chain_sum", f"Answer: {entry['answer']}", entry["answer"], {"metadata": 3}
    )
    assert result["score"] == -1.0 and result["error"].startswith("TypeError: ")


# --- dispatch -----------------------------------------------------------------------------------------------


def test_compute_score_dispatches_reasoning_gym(chain_sum_entries):
    entry = chain_sum_entries[2]
    result = compute_score(
        "reasoning_gym/chain_sum", f"Answer: {entry['answer']}", entry["answer"], _extra_info(entry)
    )
    assert result == {"score": 1.0, "acc": True, "pred": entry["answer"]}
    # The same final-answer extraction as `math` (a later \\boxed{} wins), light clean-up only.
    result = compute_score(
        "reasoning_gym/chain_sum",
        f"Answer: 7\n**\\boxed{{{entry['answer']}}}.**",
        entry["answer"],
        _extra_info(entry),
    )
    assert result == {"score": 1.0, "acc": True, "pred": entry["answer"]}


@pytest.mark.parametrize(
    "data_source", ["math_dapo", "DAPO-17k", "aime24", "aime-2025", "math500", "some_new_set"]
)
def test_compute_score_math_sources_use_the_math_verifier_by_default(data_source):
    assert compute_score(data_source, "Answer: 1,000", "1000") == {"score": 1.0, "acc": True, "pred": "1000"}
    assert compute_score(data_source, "\\boxed{1000}", "1000")["acc"] is True
    # reward.name=math_dapo reproduces DAPO's published scorer, quirks included
    assert compute_score(data_source, "\\boxed{1000}", "1000", verifier="math_dapo")["pred"] == INVALID_PRED
    assert compute_score(data_source, "Answer: 1000.", "1000", verifier="math_dapo")["acc"] is False


def test_compute_score_unknown_reasoning_gym_task():
    result = compute_score("reasoning_gym/not_a_task", "Answer: 1", "1", None)
    assert result["score"] == -1.0 and result["acc"] is False and "error" in result


def test_reward_package_does_not_import_torch():
    code = (
        "import sys, dapo_rl.reward as r; r.compute_score('math_dapo', 'Answer: 1', '1');"
        "print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
