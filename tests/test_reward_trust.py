"""Rewards a policy cannot game (issue 29, ../shared/reviews/correctness.md findings 2 and 3): DAPO's binary reward
for reasoning-gym, comma-split digits, unevaluated expressions and unanchored answers in the `math` verifier, the
options that keep the old leniency, and the whole-call time budget."""

from __future__ import annotations

import json
import logging
import time

import pytest

from dapo_rl.cli import main
from dapo_rl.config import ConfigError, load_config
from dapo_rl.reward import INVALID_PRED, compute_score, compute_score_reasoning_gym
from dapo_rl.reward.math_verifier import compute_score_math, is_unevaluated_expression
from dapo_rl.reward.pool import RewardPool
from dapo_rl.reward.reasoning_gym import misplaced_commas

pytest.importorskip("reasoning_gym")

CHAIN_SUM_INFO = {"question": "7 + 9 =", "metadata": {}}


# --- reasoning-gym: DAPO's +1 / -1 by default ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("response", "binary", "partial"),
    [
        # chain_sum's partial credit is len(gold)/len(answer) when the gold is a substring: 2/3 -> 2*(2/3)-1
        ("Answer: -16", -1.0, 1 / 3),
        ("Answer: 116", -1.0, 1 / 3),
        ("Answer: 1612", -1.0, 0.0),  # 2/4 -> 0
        ("Answer: 15", -1.0, -1.0),
        ("Answer: 16", 1.0, 1.0),
        ("Answer: 1,6", -1.0, -1.0),  # reasoning-gym would strip the comma and call it 16
    ],
)
def test_reasoning_gym_reward_is_binary_unless_partial_credit_is_asked_for(response, binary, partial):
    res = compute_score_reasoning_gym("chain_sum", response, "16", CHAIN_SUM_INFO)
    assert res["score"] == binary and res["acc"] is (binary == 1.0)
    res = compute_score_reasoning_gym("chain_sum", response, "16", CHAIN_SUM_INFO, partial_credit=True)
    assert res["score"] == pytest.approx(partial) and res["acc"] is (binary == 1.0)
    # the verl-style entry point and the pool carry the option
    assert compute_score("reasoning_gym/chain_sum", response, "16", CHAIN_SUM_INFO)["score"] == binary
    got = compute_score("reasoning_gym/chain_sum", response, "16", CHAIN_SUM_INFO, partial_credit=True)[
        "score"
    ]
    assert got == pytest.approx(partial)


def test_partial_credit_reaches_the_worker_processes():
    items = [("reasoning_gym/chain_sum", "Answer: -16", "16", CHAIN_SUM_INFO)]
    with RewardPool("auto", num_workers=1) as pool:
        assert pool.score(items)[0]["score"] == -1.0
    with RewardPool("auto", num_workers=1, partial_credit=True) as pool:
        assert pool.score(items)[0]["score"] == pytest.approx(1 / 3)


@pytest.mark.parametrize(
    ("answer", "gold", "misplaced"),
    [
        ("1,6", "16", True),
        ("12,34", "1234", True),
        ("1,6000", "16000", True),
        ("0,500", "500", True),
        ("-1,60", "-160", True),
        ("1,600", "1600", False),  # a thousands separator
        ("-12,345.5", "-12345.5", False),
        ("1,234,567", "1234567", False),
        ("16", "16", False),
        ("1,6", "1,6", False),  # a list gold: left to the task's scorer
        ("x,y", "16", False),
    ],
)
def test_misplaced_commas(answer, gold, misplaced):
    assert misplaced_commas(answer, gold) is misplaced


def test_thousands_separators_stay_right_and_list_golds_stay_with_reasoning_gym():
    assert compute_score_reasoning_gym("chain_sum", "Answer: 1,600", "1600", CHAIN_SUM_INFO)["acc"] is True
    assert compute_score_reasoning_gym("chain_sum", "Answer: 1,60,0", "1600", CHAIN_SUM_INFO)["acc"] is False


# --- math: no credit for restating the problem or for a response without its answer line ----------------------


@pytest.mark.parametrize(
    ("response", "gold"),
    [
        ("Answer: \\sum_{k=1}^{100} k", "5050"),
        ("Answer: 17 \\cdot 23 - 4", "387"),
        ("Answer: 2^{100} \\mod 7", "2"),
        ("Answer: \\int_0^1 2x\\,dx", "1"),
        ("Answer: 2+3", "5"),
        ("Answer: 5!", "120"),
        ("Answer: \\sqrt{16}", "4"),
        ("Answer: 2^{10}", "1024"),
        ("Answer: \\binom{5}{2}", "10"),
        ("Answer: \\frac{1}{2} + \\frac{1}{3}", "\\frac{5}{6}"),
        ("Answer: 6 \\times 7", "42"),
        ("Answer: \\log_2 8", "3"),
        ("Answer: 17 = 12 + 5", "17"),  # the value it ends on is the expression
    ],
)
def test_unevaluated_expressions_are_no_final_answer_for_a_numeric_gold(response, gold):
    res = compute_score_math(response, gold)
    assert (res["score"], res["acc"]) == (-1.0, False)
    assert compute_score_math(response, gold, lenient=True)["acc"] is True  # the option keeps the old verdict


@pytest.mark.parametrize(
    ("response", "gold"),
    [
        ("Answer: 387", "387"),
        ("Answer: -387", "-387"),
        ("Answer: \\frac{3}{4}", "0.75"),
        ("Answer: -\\frac{3}{4}", "-0.75"),
        ("Answer: \\left( \\frac{1}{3} \\right)", "1/3"),
        ("Answer: 3\\frac{1}{2}", "3.5"),  # a mixed number is a number
        ("Answer: 1.5 \\times 10^{-7}", "0.00000015"),
        ("Answer: 10^{6}", "1000000"),
        ("Answer: 1,000,000", "1000000"),
        ("Answer: 5 apples", "5"),
        ("Answer: 25\\%", "25"),
        ("Answer: x = 12", "12"),
        ("Answer: 2\\sqrt{3}", "\\sqrt{12}"),  # the gold is no plain number: equivalence as before
        ("Answer: 2^{100}", "2^{100}"),
        ("\\boxed{100 / 4}", "25"),  # an integer fraction is a number, reduced or not
        ("Answer: 12 + 5 = 17", "17"),  # a worked answer states its value after its last "="
        ("Answer: 3 \\times 4 = 12 apples", "12"),
        ("\\boxed{2^{10} = 1024}", "1024"),
        (
            "Answer: \\frac{\\pi}{2}",
            "1.5707963267948966",
        ),  # a decimal gold: an exact closed form is an answer
        ("Answer: 2\\sqrt{3}", "3.464102"),
        ("Answer: \\frac{6}{8}", "0.75"),
    ],
)
def test_numbers_and_closed_forms_stay_right(response, gold):
    assert compute_score_math(response, gold)["acc"] is True


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        ("2+3", True),
        ("17 \\cdot 23 - 4", True),
        ("(9+1)", True),
        ("\\sum_{k=1}^{100} k", True),
        ("5!", True),
        ("\\sqrt{4}", True),
        ("-5", False),
        ("+5", False),
        ("0.5", False),
        ("\\frac{3}{4}", False),
        ("-\\frac{3}{4}", False),
        ("(\\frac{1}{3})", False),
        ("10^{-7}", False),
        ("3 \\cdot 10^{8}", False),
        ("\\{5\\}", False),
        ("B", False),
    ],
)
def test_is_unevaluated_expression(answer, expected):
    assert is_unevaluated_expression(answer) is expected


def test_a_truncated_response_without_its_answer_line_gets_no_credit():
    # the review's case: cut off mid-reasoning, ending on the right number, no "Answer:" line
    response = "We need to add the parts one by one. " * 7 + "First 10 + 30 = 40. Then 40 + 2 = 42"
    assert len(response) > 200
    assert compute_score_math(response, "42") == {"score": -1.0, "acc": False, "pred": INVALID_PRED}
    assert compute_score_math(response, "42", lenient=True)["acc"] is True
    assert compute_score_math("42", "42") == {"score": -1.0, "acc": False, "pred": INVALID_PRED}
    assert compute_score_math("42", "42", lenient=True)["acc"] is True


def test_dapo_score_scores_as_training_does_and_lenient_is_a_flag(tmp_path, capsys):
    rows = [
        {"response": "Answer: 17 \\cdot 23 - 4", "ground_truth": "387"},
        {"response": "so 40 + 2 = 42", "ground_truth": "42"},
        {
            "response": "Answer: -16",
            "ground_truth": "16",
            "data_source": "reasoning_gym/chain_sum",
            "extra_info": CHAIN_SUM_INFO,
        },
    ]
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main(["score", "--jsonl", str(src), "--num-workers", "0"]) == 0
    out = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(r["score"], r["acc"]) for r in out] == [(-1.0, False)] * 3
    assert main(["score", "--jsonl", str(src), "--num-workers", "0", "--lenient", "--partial-credit"]) == 0
    out = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["acc"] for r in out] == [True, True, False]
    assert out[2]["score"] == pytest.approx(1 / 3)


def test_the_config_keys_default_to_training_and_overlap_needs_worker_processes():
    cfg = load_config(None, [])
    assert (cfg.reward.partial_credit, cfg.reward.lenient) == (False, False)
    with pytest.raises(ConfigError, match="reward.overlap=true .* reward.num_workers=0"):
        load_config(None, ["reward.overlap=true", "reward.num_workers=0"])


# --- one answer, one time budget --------------------------------------------------------------------------------


def test_an_in_process_call_ends_within_its_budget():
    """38 identities compared one by one: each Math-Verify call has its own alarm, so only a budget for the whole
    call stops it in time (before the fix each call got the full `timeout_s`)."""
    logging.disable(logging.WARNING)
    element, gold_element = "\\sin^{2}(x)+\\cos^{2}(x)", "1"
    pred = "Answer: " + ", ".join([element] * 38) + ", \\ldots"
    gold = ", ".join([gold_element] * 38) + ", \\ldots"
    compute_score_math("Answer: \\sin^{2}(x)+\\cos^{2}(x)", "1")  # imports and caches outside the timings
    start = time.perf_counter()
    assert compute_score_math(pred, gold, timeout_s=60.0)["acc"] is True  # the work is real
    unbounded = time.perf_counter() - start
    budget = unbounded / 4
    start = time.perf_counter()
    res = compute_score_math(pred, gold, timeout_s=budget)
    elapsed = time.perf_counter() - start
    assert res["timeout"] is True and (res["score"], res["acc"]) == (-1.0, False)
    assert (
        elapsed < budget + 1.0
    )  # Math-Verify's alarms are whole seconds: the last call may overrun by < 1 s
