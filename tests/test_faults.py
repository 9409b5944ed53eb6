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
