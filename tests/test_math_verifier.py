"""Tests of the math verifier: final-answer extraction, cleaning, hedges, guards, and agreement with real data."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from dapo_rl.reward.extract import (
    clean_answer,
    extract_final_answer,
    fallback_final_answer,
    gold_final_answer,
    is_hedged,
    split_top_level,
)
from dapo_rl.reward.math_verifier import (
    INVALID_PRED,
    answer_is_too_complex,
    compute_score_math,
    gsm8k_ground_truth,
)
from dapo_rl.reward.result import CORRECT_SCORE, WRONG_SCORE

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
needs_data = pytest.mark.skipif(not DATA.is_dir(), reason="shared data folder not present")


def _correct(response: str, ground_truth) -> bool:
    result = compute_score_math(response, ground_truth)
    assert "error" not in result, result
    assert result["score"] == (CORRECT_SCORE if result["acc"] else WRONG_SCORE)
    assert isinstance(result["pred"], str)
    return result["acc"]


# --- extraction --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("So the total is 540.\nAnswer: 540", "540"),
        ("**Answer:** 540", "540"),
        ("**Answer**: 540", "540"),
        ("Answer: $540$", "$540$"),
        ("The final answer is $\\boxed{540}$. I hope it is correct.", "540"),
        ("Answer:\n540", "540"),
        ("Answer: $$\n540\n$$", "$$\n540\n$$"),
        ("thus \\boxed{\\frac{1}{2}} and more text", "\\frac{1}{2}"),
        ("\\boxed{\\{1, 2\\}}", "\\{1, 2\\}"),
        ("\\fbox{7}", "7"),
        ("\\boxed 5", "5"),
        ("Answer: 1\nLet me recheck.\n\\boxed{540}", "540"),
        ("\\boxed{540}\nWait.\nAnswer: 541", "541"),
        ("\\boxed{1} and \\boxed{2}", "1, 2"),
        ("\\boxed{1} or \\boxed{2}", "1 or 2"),
        ("\\boxed{5}\n\\]\n\\[\n\\boxed{5}", "5"),
        ("First \\boxed{3}. After a long second look at the problem, the result is \\boxed{4}", "4"),
        ("Answer: \\boxed{1} or 2", "\\boxed{1} or 2"),
        ("no final answer here", None),
        ("\\boxed{unclosed", None),
    ],
)
def test_extract_final_answer(text, expected):
    assert extract_final_answer(text) == expected


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("540.", "540"),
        ("**540**", "540"),
        ("`42`", "42"),
        ("$540$", "540"),
        ("\\(\\frac{1}{2}\\)", "\\frac{1}{2}"),
        ("1,000", "1000"),
        ("1,234.50", "1234.50"),
        ("(1,2)", "(1,2)"),
        ("1, 2", "1, 2"),
        ("11,\\! 111,\\! 100", "11111100"),
        ("10{,}000", "10000"),
        ("\\text{Evelyn}", "Evelyn"),
        ("15\\mbox{ cm}^2", "15"),
        ("10 degrees", "10"),
        ("5 cm", "5"),
        ("\\$12 dollars", "12"),
        ("10^\\circ", "10"),
        ("90^{\\circ}", "90"),
        ("25\\%", "25"),
        ("\\dfrac{1}{2}", "\\frac{1}{2}"),
        ("\\tfrac12", "\\frac12"),
        ("\u22125", "-5"),
        ("x = 5", "5"),
        ("(p, q) = (3, 2)", "(3, 2)"),
        ("x \\in [-2, 7]", "[-2, 7]"),
        ("x = 1/3 \\approx 0.33", "1/3"),
        ("2x + 4y - 3 = 0", "2x + 4y - 3 = 0"),
        ("025", "25"),
        ("27.0", "27"),
        ("-007.00", "-7"),
        ("\\text{(C)}", "C"),
        ("The volume of $V$ is 120", "120"),
        ("540 (since 3 + 537 = 540)", "540"),
        ("5!", "5!"),
        ("a + m", "a + m"),
        ("\\left( 1, 2 \\right)", "( 1, 2 )"),
    ],
)
def test_clean_answer(raw, expected):
    assert clean_answer(raw) == expected


@pytest.mark.parametrize(
    ("answer", "ground_truth", "hedged"),
    [
        ("540 or 541", "540", True),
        ("540 and 541", "540", True),
        ("either 3 or 4", "3", True),
        ("540, 541", "540", True),
        ("\\pm 3", "3", True),
        ("540", "540", False),
        ("(1, 2)", "(1,2)", False),
        ("[0, 1)", "[0,1)", False),
        ("5, 5", "5", False),
        ("1 and 2", "1, 2", False),  # a list-valued ground truth: listing is the expected form
        ("2 or 1", "1, 2", False),
        ("1, 2", "(1,2)", False),
    ],
)
def test_is_hedged(answer, ground_truth, hedged):
    assert is_hedged(answer, ground_truth) is hedged


def test_split_top_level_keeps_brackets():
    assert split_top_level("(1,2), [0,1), \\{3,4\\}") == ["(1,2)", "[0,1)", "\\{3,4\\}"]


# --- scoring ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("response", "ground_truth", "correct"),
    [
        ("Answer: 540.", "540", True),
        ("Answer: **540**", "540", True),
        ("The result follows.\n\\boxed{540}", "540", True),
        ("Answer: 1\nHmm, that is wrong. Recomputing...\n\\boxed{540}", "540", True),
        ("\\boxed{540}\n Answer: 541", "540", False),
        ("Answer: 540\nOn reflection:\nAnswer: 541", "540", False),
        ("Answer: 540 or 541", "540", False),
        ("Answer: 540 and 541", "540", False),
        ("Answer: either 3 or 4", "3", False),
        ("Answer: 1,000", "1000", True),
        ("Answer: 1,000", 1000, True),
        ("Answer: \u22125", "-5", True),
        ("Answer: \\dfrac{1}{2}", "\\frac12", True),
        ("Answer: \\dfrac{1}{2}", "0.5", True),
        ("Answer: 10^\\circ", 10, True),
        ("Answer: (1, 2)", "(1,2)", True),
        ("Answer: (1, 2)", "(2,1)", False),
        ("Answer: \\sqrt{8}", "2\\sqrt{2}", True),
        ("Answer: [0, 1)", "[0,1)", True),
        ("Answer: [0, 1]", "[0,1)", False),
        ("Answer: 025", 25, True),
        ("Answer: 25", "025", True),
        ("Answer: 27", 27.0, True),
        ("Answer: -1", -1.0, True),
        ("Answer: 5 cm", 5, True),
        ("Answer: `42`", 42, True),
        ("Answer: $540$", "540", True),
        ("The final answer is $\\boxed{540}$", "540", True),
        ("Answer: x = 5", "5", True),
        ("Answer: y = 2x + 3", "y=2x+3", True),
        ("Answer: \\frac{1}{3}", "0.333333", True),
        ("Answer: 541", "540", False),
        ("Answer: \\frac{3}{4}", "\\frac{5}{8}", False),
        ("Answer: 4:30 p.m.", "4:30 p.m.", True),
        ("Answer: 4:30 a.m.", "4:30 p.m.", False),
        ("\\boxed{-2} \\quad \\text{and} \\quad \\boxed{1}", "1,-2", True),
        ("\\boxed{-2} \\quad \\text{and} \\quad \\boxed{1}", "1", False),
        ("Answer: 540 (since 3 + 537 = 540)", "540", True),
        ("Answer: 541 (not 540)", "540", False),
        ("540", "540", False),  # no "Answer:" line or box: no final answer (lenient reads it whole)
        ("I believe it is 540", "540", False),
        ("Answer: \\text{(B)}", "B", True),
        ("Answer: 5!", "120", False),  # an unevaluated expression against a number (lenient: True)
    ],
)
def test_compute_score_math(response, ground_truth, correct):
    assert _correct(response, ground_truth) is correct


def test_correct_result_shape():
    assert compute_score_math("Answer: 540.", "540") == {"score": 1.0, "acc": True, "pred": "540"}
    assert compute_score_math("Answer: 541", "540") == {"score": -1.0, "acc": False, "pred": "541"}


LONG = "Let me think about this step by step. " * 10


@pytest.mark.parametrize(
    ("ending", "ground_truth", "pred", "correct"),
    [
        ("So it is 540.", "540", "540", True),
        ("So it is 541.", "540", "541", False),
        ("The answer is 540. Wait, no: it is 541.", "540", "541", False),  # the later value counts
        ("So it is 540 or 541.", "541", "540 or 541", False),  # hedge
        ("It is either $3$ or $4$.", "4", "3 or 4", False),
        ("Maybe 1, 2, 3, 4, and 5.", "5", "1, 2, 3, 4, 5", False),  # a list of guesses
        ("The roots are 3 and 4.", "3, 4", "3, 4", True),  # a list the ground truth asks for
        ("the system is $(7, 6)$.", "(7,6)", "(7, 6)", True),
        ("We get 5.<|im_start|>user Now 7.", "5", "5", True),  # a new chat turn ends the response
        ("Therefore there are 12 sequences. I hope it is correct.", "12", "12", True),
        ("It costs 1,000 dollars.", "1000", "1000", True),
        ("The error increases by 100%.", "100", "100", True),
    ],
)
def test_long_response_without_marker_falls_back_to_its_last_sentence(ending, ground_truth, pred, correct):
    result = compute_score_math(LONG + ending, ground_truth, lenient=True)
    assert result == {"score": 1.0 if correct else -1.0, "acc": correct, "pred": pred}
    # training never reads a response without its answer line: the truncation hack of the review (finding 3)
    assert compute_score_math(LONG + ending, ground_truth) == {
        "score": -1.0,
        "acc": False,
        "pred": INVALID_PRED,
    }


def test_long_response_without_any_number_at_its_end_is_invalid():
    response = "The value is 540. " + "Let me think about this step by step. " * 10 + "Done."
    assert compute_score_math(response, "540") == {"score": -1.0, "acc": False, "pred": INVALID_PRED}


def test_fallback_window_never_starts_inside_a_math_span():
    # 600+ characters of one $...$ span: the window must not read its closing "$" as an opening one.
    response = "$" + "x + " * 200 + "1$ and so we get 7."
    assert fallback_final_answer(response) == "7"


@pytest.mark.parametrize(
    ("gold", "answer"),
    [
        (
            "$\\\\boxed{35 cm} ++++++ \\\\boxed{4}$",
            "35 cm, 4",
        ),  # boxes that only symbols separate: one answer
        ("\\boxed{1} no no no no no \\boxed{2}", "2"),  # words between boxes: the last one
        ("\\boxed{1}, \\boxed{2}", "1, 2"),
        ("so \\boxed{3} and again \\boxed{3}", "3"),
        ("540", "540"),
    ],
)
def test_gold_final_answer(gold, answer):
    assert gold_final_answer(gold) == answer


def test_empty_response_is_invalid():
    assert compute_score_math("", "540") == {"score": -1.0, "acc": False, "pred": INVALID_PRED}


@pytest.mark.parametrize("bad", [None, 540, b"Answer: 540"])
def test_non_str_response_never_raises(bad):
    result = compute_score_math(bad, "540")
    assert result["score"] == -1.0 and result["acc"] is False and "error" in result


def test_bad_ground_truth_never_raises():
    result = compute_score_math("Answer: 540", object())
    assert result["acc"] is False and "error" in result


# --- guards: never slow, never an error on model output ----------------------------------------------------


@pytest.mark.parametrize(
    "answer",
    [
        "1" * 5000,
        "9^9^9^9^9",
        "9^{9^{9^{9}}}",
        "(9999^{9999})^{9999}",
        "10^{123456}",
        "123456!",
        "(" * 2000 + "1" + ")" * 2000,
        "\\frac{" * 300 + "1" + "}{2}" * 300,
    ],
)
def test_hostile_answers_are_wrong_quickly(answer):
    start = time.perf_counter()
    result = compute_score_math(f"Answer: {answer}", "5")
    assert time.perf_counter() - start < 2.0
    assert result["acc"] is False and result["score"] == -1.0
    assert "error" not in result


def test_guard_allows_ordinary_powers():
    for answer in ("2^{10}\\cdot 3^5", "e^{x^2}", "10^{9999}", "9999!", "2^{-3}", "x^2+y^2"):
        assert answer_is_too_complex(answer) is None, answer
    assert answer_is_too_complex("(9^9)!") is not None


def test_off_main_thread_never_raises():
    results = []

    def work():
        results.append(compute_score_math("Answer: \\sqrt{8}", "2\\sqrt{2}"))
        results.append(compute_score_math("Answer: \\frac{1}{3}", "0.3333333"))

    thread = threading.Thread(target=work)
    thread.start()
    thread.join(timeout=60)
    assert [r["acc"] for r in results] == [True, True]
    assert all("error" not in r for r in results)


# --- GSM8K ------------------------------------------------------------------------------------------------


def test_gsm8k_ground_truth():
    assert gsm8k_ground_truth("She pays 2 * 3 = <<2*3=6>>6 dollars.\n#### 1,234") == "1234"
    assert gsm8k_ground_truth("#### 18") == "18"
    with pytest.raises(ValueError):
        gsm8k_ground_truth("no marker")


# --- agreement figures on the shared data (benchmarks/verifier_agreement.py prints the same) ----------------


def _jsonl(path: Path) -> list[dict]:
    with path.open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def _is_default_row(row: dict) -> bool:
    """Rows labelled with this verifier's settings: LaTeX + expression extraction, float_rounding=6, strict, no
    set-relation comparison (the 14 ``verify(parse(gold), parse(pred))`` rows use those defaults)."""
    if row.get("match_types") is None:
        return True
    return (
        set(row["match_types"]) == {"latex", "expr"}
        and row["precision"] == 6
        and row["strict"]
        and not row["allow_set_relation_comp"]
    )


# Examined by hand (judgement in benchmarks/verifier_agreement.py): 263 is labelled equal only because Math-Verify
# drops \mathrm{e}; 1 - 1/e and 1 + 1/e differ. Rows with LaTeX-only or expression-only extraction are not at the
# verifier's default settings (LaTeX + expressions) and are reported, not asserted, by the benchmark.
KNOWN_DISAGREEMENTS_A = {263}
# Label errors of the Qwen2.5-Math grader: idx 3 (gt field garbled from "\text{4:30 p.m.}"), idx 72 response 7
# (\boxed{10000} for 10{,}000).
KNOWN_DISAGREEMENTS_B = {(3, j) for j in range(8)} | {(72, 7)}


@needs_data
def test_agreement_with_math_verify_labels():
    rows = _jsonl(DATA / "answer_equivalence" / "math_verify_test_cases.jsonl")
    default_rows = [row for row in rows if _is_default_row(row)]
    assert len(rows) == 268 and len(default_rows) == 149
    disagreements = {
        row["id"]
        for row in default_rows
        if compute_score_math(row["pred"], row["gold"], lenient=True)["acc"] != bool(row["expected"])
    }  # bare answers and prose as a harness sees them: lenient, as benchmarks/verifier_agreement.py scores them
    assert disagreements == KNOWN_DISAGREEMENTS_A
    assert len(default_rows) - len(disagreements) == 148


@needs_data
def test_agreement_with_cot_labels():
    rows = _jsonl(DATA / "responses_math_cot_100" / "math_cot_100.jsonl")
    disagreements = set()
    total = 0
    for row in rows:
        for j, (response, label) in enumerate(zip(row["response"], row["score"])):
            total += 1
            if compute_score_math(response, row["gt"])["acc"] != label:
                disagreements.add((row["idx"], j))
    assert total == 800
    assert disagreements == KNOWN_DISAGREEMENTS_B  # 791/800 raw; 800/800 with the label errors corrected


def _reference_answers() -> list[tuple[str, list]]:
    import pyarrow.parquet as pq

    def parquet_gts(path: Path) -> list:
        table = pq.read_table(path, columns=["reward_model"])
        return [r["ground_truth"] for r in table.column(0).to_pylist()]

    sample = json.loads((DATA / "dapo_math_17k_sample" / "dapo_math_17k_sample.json").read_text("utf-8"))
    return [
        ("aime24", [r["answer"] for r in _jsonl(DATA / "aime24" / "test.jsonl")]),
        ("aime24_dapo", parquet_gts(DATA / "aime24_dapo" / "aime-2024.parquet")),
        ("aime25", [r["answer"] for r in _jsonl(DATA / "aime25" / "test.jsonl")]),
        ("qwq_aime24", [r["answer"] for r in _jsonl(DATA / "qwq_eval" / "aime24.jsonl")]),
        ("qwq_aime25", [r["answer"] for r in _jsonl(DATA / "qwq_eval" / "aime25.jsonl")]),
        ("amc23", [r["answer"] for r in _jsonl(DATA / "amc23" / "test.jsonl")]),
        ("math500", [r["answer"] for r in _jsonl(DATA / "math500" / "test.jsonl")]),
        ("gsm8k", [gsm8k_ground_truth(r["answer"]) for r in _jsonl(DATA / "gsm8k" / "test.jsonl")]),
        ("dapo_math_17k", parquet_gts(DATA / "dapo_math_17k" / "dapo_math_17k.parquet")),
        ("dapo_math_17k_sample", [r["reward_model"]["ground_truth"] for r in sample]),
    ]


@needs_data
def test_every_reference_answer_scores_correct():
    counts = {}
    failures = []
    for name, answers in _reference_answers():
        counts[name] = len(answers)
        for gt in answers:
            for response in (f"Answer: {gt}", f"\\boxed{{{gt}}}"):
                if not compute_score_math(response, gt)["acc"]:
                    failures.append((name, response))
    assert counts["dapo_math_17k"] == 17917 and counts["gsm8k"] == 1319 and counts["math500"] == 500
    assert failures == []


@needs_data
def test_raw_ground_truth_types():
    aime24 = _jsonl(DATA / "aime24" / "test.jsonl")
    assert any(r["answer"].startswith("0") for r in aime24)  # zero-padded strings such as "025"
    amc = _jsonl(DATA / "amc23" / "test.jsonl")
    assert all(isinstance(r["answer"], float) for r in amc)
    gt = amc[0]["answer"]
    assert _correct(f"Answer: {int(gt)}", gt)
