"""Faults found by real inputs (issue 10): equal-score groups, non-finite rewards, groups of one."""

import math

import pytest
import torch

from dapo_rl.algo import compute_grpo_advantages
from dapo_rl.config import ConfigError, load_config
from dapo_rl.reward import compute_score
from dapo_rl.reward.pool import RewardPool, summarize


# ----------------------------------------------------------------------------------- equal scores -> exactly 0
@pytest.mark.parametrize("value", [0.7, 0.1, -0.3, 1e-3, 123.456, 1.0, -1.0, 0.0])
@pytest.mark.parametrize("size", [2, 3, 7, 16, 64, 1000])
@pytest.mark.parametrize("norm", [True, False])
def test_a_group_of_equal_scores_gets_exactly_zero(value, size, norm):
    adv = compute_grpo_advantages(
        torch.full((size,), value), torch.zeros(size, dtype=torch.long), norm_adv_by_std_in_grpo=norm
    )
    assert torch.equal(adv, torch.zeros(size)) and adv.dtype == torch.float32


def test_the_issue_case_and_a_mixed_batch():
    adv = compute_grpo_advantages(torch.full((16,), 0.7), torch.zeros(16, dtype=torch.long))
    assert float(adv.abs().max()) == 0.0  # was 0.106
    # a constant group beside a varying one: the constant one is exactly 0, the other as before
    scores = torch.tensor([0.7] * 5 + [1.0, -1.0, 1.0, -1.0], dtype=torch.float64)
    gidx = torch.tensor([3] * 5 + [9] * 4)
    adv = compute_grpo_advantages(scores, gidx)
    assert adv.dtype == torch.float64 and torch.equal(adv[:5], torch.zeros(5, dtype=torch.float64))
    std = math.sqrt(4 / 3)  # unbiased std of (1, -1, 1, -1)
    assert adv[5:].tolist() == pytest.approx([1 / (std + 1e-6), -1 / (std + 1e-6)] * 2)


# --------------------------------------------------------------------------------- non-finite rewards
def nan_reward(data_source, solution_str, ground_truth, extra_info=None):
    return float("nan")


def inf_dict_reward(data_source, solution_str, ground_truth, extra_info=None):
    return {"score": float("-inf"), "acc": False, "pred": "x"}


def text_reward(data_source, solution_str, ground_truth, extra_info=None):
    return {"score": "1.0", "acc": True, "pred": "x"}


def numpy_reward(data_source, solution_str, ground_truth, extra_info=None):
    import numpy as np

    return {"score": np.float32(0.5), "acc": True, "pred": "x"}


@pytest.mark.parametrize(
    "fn, reason",
    [
        ("nan_reward", "nan"),
        ("inf_dict_reward", "-inf"),
        ("text_reward", "'1.0'"),
    ],
)
def test_a_non_finite_or_non_numeric_score_is_an_error_result(fn, reason):
    res = compute_score("math", "Answer: 1", "1", verifier=f"{__name__}:{fn}")
    assert res["score"] == -1.0 and res["acc"] is False
    assert res["error"] == f"ValueError: the verifier returned a score that is not a finite number: {reason}"


def test_non_finite_scores_count_in_the_error_rate_through_the_pool():
    with RewardPool(f"{__name__}:nan_reward", num_workers=1) as pool:
        results = pool.score([("math", "Answer: 1", "1", None)] * 4)
    assert [r["score"] for r in results] == [-1.0] * 4
    assert summarize(results)["reward/error_rate"] == 1.0


def test_a_finite_numpy_score_is_accepted_as_a_float():
    res = compute_score("math", "Answer: 1", "1", verifier=f"{__name__}:numpy_reward")
    assert res == {"score": 0.5, "acc": True, "pred": "x"} and type(res["score"]) is float


# ------------------------------------------------------------------------------------------ groups of one
@pytest.mark.parametrize("n", [1, 0])
def test_rollout_n_below_two_is_a_config_error_for_grpo(n):
    with pytest.raises(ConfigError, match=rf"rollout.n={n}"):
        load_config(None, [f"rollout.n={n}"])


def test_group_of_one_message_says_why_and_val_n_must_be_positive():
    with pytest.raises(ConfigError, match="a group of one has advantage 0 and the run would learn nothing"):
        load_config(None, ["rollout.n=1"])
    with pytest.raises(ConfigError, match=r"rollout.val_kwargs.n=0 must be >= 1"):
        load_config(None, ["rollout.val_kwargs.n=0"])
    assert load_config(None, ["rollout.n=2", "rollout.val_kwargs.n=1"]).rollout.n == 2


def test_the_first_scoring_error_of_a_run_is_logged_once():
    from dapo_rl.collect import Rollout, Scorer
    from dapo_rl.data import Sample
    from dapo_rl.models.tiny import build_tiny_tokenizer

    tok = build_tiny_tokenizer()
    lines: list[str] = []
    sample = Sample("s:0", "math", [{"role": "user", "content": "1 + 1 ="}], "2")
    with RewardPool(f"{__name__}:nan_reward", num_workers=0) as pool:
        scorer = Scorer(tok, pool, log=lines.append)
        for _ in range(2):
            rollouts = [Rollout(sample, 0, j, response_ids=tok("Answer: 2")["input_ids"]) for j in range(3)]
            scorer(rollouts)
            assert [(r.status, r.reward, r.acc) for r in rollouts] == [("error", -1.0, False)] * 3
    assert lines == [
        "reward: a response could not be scored and counts as wrong (ValueError: the verifier returned a score "
        "that is not a finite number: nan); further errors are only counted in reward/error_rate"
    ]


# ------------------------------------------------------------------------------- maj@k pools equivalent answers
def _problem(pid: int, responses: list[str], gold: str):
    from dapo_rl.collect import Rollout
    from dapo_rl.data import Sample

    sample = Sample(f"p:{pid}", "math", [{"role": "user", "content": "?"}], gold)
    return [Rollout(sample, pid, j, text=t) for j, t in enumerate(responses)]


def _maj(groups, n):
    """Score with the real `math` verifier through the pool, pool the votes, return the dataset metrics."""
    from dapo_rl.evaluate import dataset_metrics, pool_equivalent_answers

    with RewardPool("math", num_workers=1, timeout_s=5.0) as pool:
        rollouts = [r for g in groups for r in g]
        for r, res in zip(
            rollouts, pool.score([("math", r.text, r.sample.ground_truth, None) for r in rollouts])
        ):
            r.acc, r.pred = bool(res["acc"]), str(res["pred"])
        pool_equivalent_answers(groups, pool)
    return dataset_metrics(rollouts, n)


def test_maj_at_k_pools_the_forms_of_one_answer():
    forms = [r"\boxed{\frac{1}{2}}", r"\boxed{0.5}", r"\boxed{3}", r"\boxed{1/2}", r"\boxed{3}"]
    g = _problem(0, forms, "1/2")
    m = _maj([g], 5)
    assert [r.acc for r in g] == [True, True, False, True, False]
    assert m["maj@5"] == 1.0  # 1/2 three times against 3 twice (was 0: "3" won 2 to 1 on strings)
    assert m["maj@1"] == 1.0 and m["maj@2"] == 1.0  # \frac{1}{2} and 0.5 already pool at k = 2
    assert [r.vote for r in g] == [r"\frac{1}{2}", r"\frac{1}{2}", "3", r"\frac{1}{2}", "3"]


def test_maj_at_k_pooling_siblings_wrong_majority_and_ties():
    # a wrong answer in three forms beats the right one twice; invalid answers do not vote
    wrong = _problem(
        0,
        [r"\boxed{2/3}", "Answer: 7", r"\boxed{\dfrac{2}{3}}", "", "Answer: 7", r"\boxed{4/6}"],
        "7",
    )
    # a tie between pooled clusters goes to the cluster seen first: 0.25 (x2 via 1/4) vs 5 (x2)
    tie = _problem(
        1, [r"\boxed{5}", r"\boxed{0.25}", r"\boxed{5}", r"\boxed{\frac14}", "Answer: 9", "Answer: 9"], "1/4"
    )
    m = _maj([wrong, tie], 6)
    assert m["maj@6"] == 0.0  # problem 0: 2/3 wins 3-2; problem 1: 5 (seen first) ties 1/4 and 9
    assert m["maj@4"] == 0.0  # problem 0: 2/3 (2) vs 7 (1); problem 1: 5 and 1/4 tie, 5 first
    assert {r.vote for r in wrong if r.vote} == {"2/3", "7"} and wrong[3].vote == ""
