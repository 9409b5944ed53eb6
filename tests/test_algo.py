"""Unit tests for dapo_rl.algo with hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch

from dapo_rl.algo import (
    LOSS_AGG_MODES,
    agg_loss,
    compute_grpo_advantages,
    compute_policy_loss,
    entropy_from_logits,
    filter_groups,
    kept_group_ids,
    logprobs_from_logits,
    masked_mean,
    masked_sum,
    overlong_penalty,
)

# ----------------------------------------------------------------------------------------------------------------
# compute_grpo_advantages (DAPO Eq. 9)
# ----------------------------------------------------------------------------------------------------------------


def test_advantages_mixed_group_hand_computed():
    # mean 0, unbiased std = sqrt((1 + 1 + 1 + 1) / 3) = sqrt(4/3) -> +-1 / sqrt(4/3) = +-0.8660...
    scores = torch.tensor([1.0, -1.0, -1.0, 1.0])
    adv = compute_grpo_advantages(scores, torch.tensor([0, 0, 0, 0]))
    a = 1.0 / (math.sqrt(4.0 / 3.0) + 1e-6)
    assert a == pytest.approx(0.8660247, abs=1e-6)
    torch.testing.assert_close(adv, torch.tensor([a, -a, -a, a]), rtol=0, atol=1e-6)
    assert adv.dtype == torch.float32


def test_advantages_degenerate_group_is_zero_not_nan():
    adv = compute_grpo_advantages(torch.tensor([0.5, 0.5, 0.5]), torch.tensor([1, 1, 1]))
    assert torch.equal(adv, torch.zeros(3))


def test_advantages_group_of_one_is_zero():
    adv = compute_grpo_advantages(torch.tensor([3.0, 1.0, 0.0]), torch.tensor([0, 1, 1]))
    assert adv[0].item() == 0.0
    # the pair [1, 0]: mean 0.5, std sqrt(0.5) -> +-0.5 / sqrt(0.5) = +-0.7071
    assert adv[1].item() == pytest.approx(0.5 / (math.sqrt(0.5) + 1e-6), abs=1e-6)
    assert adv[2].item() == pytest.approx(-0.5 / (math.sqrt(0.5) + 1e-6), abs=1e-6)


def test_advantages_non_contiguous_ids_match_per_group_torch_std():
    # groups 7: [1, 0]; 3: [0, 2]; 42: [5] (alone); -4: [1, 2, 6] interleaved
    group_index = torch.tensor([7, 3, -4, 7, 3, 42, -4, -4])
    scores = torch.tensor([1.0, 0.0, 1.0, 0.0, 2.0, 5.0, 2.0, 6.0])
    adv = compute_grpo_advantages(scores, group_index)
    s = 1.0 / (math.sqrt(0.5) + 1e-6)  # group 7: (1 - 0.5) / sqrt(0.5) = 0.7071
    t = 1.0 / (math.sqrt(2.0) + 1e-6)  # group 3: (2 - 1) / sqrt(2) = 0.7071
    std_m4 = math.sqrt(((1 - 3) ** 2 + (2 - 3) ** 2 + (6 - 3) ** 2) / 2)  # mean 3, std sqrt(7)
    expected = torch.tensor(
        [
            0.5 * s,
            -t,
            (1 - 3) / (std_m4 + 1e-6),
            -0.5 * s,
            t,
            0.0,
            (2 - 3) / (std_m4 + 1e-6),
            3 / (std_m4 + 1e-6),
        ]
    )
    torch.testing.assert_close(adv, expected, rtol=0, atol=1e-6)
    for g in group_index.unique():
        members = scores[group_index == g]
        if members.numel() > 1:
            ref = (members - members.mean()) / (members.std() + 1e-6)
            torch.testing.assert_close(adv[group_index == g], ref)


def test_advantages_int_scores_and_errors():
    adv = compute_grpo_advantages(torch.tensor([1, 0]), torch.tensor([0, 0]))
    assert adv.dtype == torch.float32
    with pytest.raises(ValueError):
        compute_grpo_advantages(torch.zeros(3), torch.zeros(4, dtype=torch.long))
    with pytest.raises(ValueError):
        compute_grpo_advantages(torch.zeros(2, 2), torch.zeros(2, dtype=torch.long))
    with pytest.raises(ValueError):
        compute_grpo_advantages(torch.zeros(3), torch.zeros(3))  # float group ids


# ----------------------------------------------------------------------------------------------------------------
# compute_policy_loss (DAPO Eq. 10, dual-clip)
# ----------------------------------------------------------------------------------------------------------------

# (advantage, ratio, per-token loss, lower clip active, upper clip active, dual clip active, d loss / d log_prob)
# with clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=3.0.
POLICY_CASES = [
    (1.0, 1.1, -1.1, 0, 0, 0, -1.1),  # A>0 inside [0.8, 1.28]: -A r
    (1.0, 1.5, -1.28, 0, 1, 0, 0.0),  # A>0 above: clipped at -A (1 + 0.28), no gradient
    (1.0, 0.5, -0.5, 0, 0, 0, -0.5),  # A>0 below: max(-0.5, -0.8) = -0.5, unclipped
    (1.0, 4.0, -1.28, 0, 1, 0, 0.0),  # A>0 far above: dual-clip does not apply to A>0
    (2.0, 1.5, -2.56, 0, 1, 0, 0.0),  # -2 * 1.28
    (-1.0, 1.1, 1.1, 0, 0, 0, 1.1),  # A<0 inside
    (-1.0, 0.5, 0.8, 1, 0, 0, 0.0),  # A<0 below: clipped at -A (1 - 0.2)
    (-2.0, 0.5, 1.6, 1, 0, 0, 0.0),  # 2 * 0.8
    (-1.0, 1.5, 1.5, 0, 0, 0, 1.5),  # A<0 above: PPO keeps -A r (1.5 < c = 3)
    (-1.0, 4.0, 3.0, 0, 0, 1, 0.0),  # A<0, r = 4 > c = 3: dual-clip caps the loss at -A c = 3
    (0.0, 2.0, 0.0, 0, 0, 0, 0.0),  # A = 0
]


@pytest.mark.parametrize("adv, ratio, loss, lower, upper, dual, grad", POLICY_CASES)
def test_policy_loss_single_token(adv, ratio, loss, lower, upper, dual, grad):
    log_prob = torch.tensor([[math.log(ratio)]], dtype=torch.float64, requires_grad=True)
    old_log_prob = torch.zeros(1, 1, dtype=torch.float64)
    pg_loss, stats = compute_policy_loss(
        log_prob, old_log_prob, torch.tensor([adv], dtype=torch.float64), torch.ones(1, 1, dtype=torch.bool)
    )
    assert pg_loss.item() == pytest.approx(loss, abs=1e-12)
    assert stats["pg_clipfrac_lower"] == lower
    assert stats["pg_clipfrac_upper"] == upper
    assert stats["pg_clipfrac_dual"] == dual
    assert stats["pg_clipfrac"] == lower + upper
    assert stats["num_tokens"] == 1.0
    assert stats["ppo_kl"] == pytest.approx(-math.log(ratio), abs=1e-12)
    pg_loss.backward()
    # d(-A r)/d log_prob = -A r where unclipped; 0 where a clip is active
    assert log_prob.grad.item() == pytest.approx(grad, abs=1e-12)


def test_policy_loss_batch_token_mean_and_clip_fractions():
    advs = torch.tensor([c[0] for c in POLICY_CASES], dtype=torch.float64)
    log_prob = torch.tensor([[math.log(c[1])] for c in POLICY_CASES], dtype=torch.float64)
    mask = torch.ones_like(log_prob, dtype=torch.bool)
    pg_loss, stats = compute_policy_loss(log_prob, torch.zeros_like(log_prob), advs, mask)
    n = len(POLICY_CASES)  # 11 tokens: 3 upper, 2 lower, 1 dual
    assert pg_loss.item() == pytest.approx(sum(c[2] for c in POLICY_CASES) / n, abs=1e-12)
    assert stats["pg_clipfrac_upper"] == pytest.approx(3 / n)
    assert stats["pg_clipfrac_lower"] == pytest.approx(2 / n)
    assert stats["pg_clipfrac"] == pytest.approx(5 / n)
    assert stats["pg_clipfrac_dual"] == pytest.approx(1 / n)
    assert stats["num_tokens"] == float(n)
    assert all(isinstance(v, float) for v in stats.values())


def test_policy_loss_masked_tokens_and_per_token_advantages():
    # row 0: A=1, ratios [1.1, 1.5, <pad>]; row 1: A=-1, ratios [4.0, <pad>, <pad>]
    ratios = torch.tensor([[1.1, 1.5, 9.0], [4.0, 9.0, 9.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    adv_seq = torch.tensor([1.0, -1.0], dtype=torch.float64)
    loss_seq, stats_seq = compute_policy_loss(ratios.log(), torch.zeros_like(ratios), adv_seq, mask)
    # tokens: -1.1, -1.28, 3.0 -> token-mean = 0.62 / 3
    assert loss_seq.item() == pytest.approx((-1.1 - 1.28 + 3.0) / 3, abs=1e-12)
    assert stats_seq["pg_clipfrac_upper"] == pytest.approx(1 / 3)
    assert stats_seq["pg_clipfrac_dual"] == pytest.approx(1 / 3)
    assert stats_seq["num_tokens"] == 3.0
    # a (B, T) advantage equal to the broadcast one gives the same loss
    loss_tok, stats_tok = compute_policy_loss(
        ratios.log(), torch.zeros_like(ratios), adv_seq[:, None].expand(2, 3), mask
    )
    assert loss_tok.item() == loss_seq.item()
    assert stats_tok == stats_seq


def test_policy_loss_ppo_kl_is_masked_mean_of_old_minus_new():
    log_prob = torch.tensor([[-1.0, -2.0, -3.0]])
    old_log_prob = torch.tensor([[-1.5, -1.0, -100.0]])
    _, stats = compute_policy_loss(log_prob, old_log_prob, torch.tensor([1.0]), torch.tensor([[1, 1, 0]]))
    assert stats["ppo_kl"] == pytest.approx(((-1.5 + 1.0) + (-1.0 + 2.0)) / 2)


def test_policy_loss_log_ratio_clamped_no_overflow():
    log_prob = torch.tensor([[100.0, -100.0]], requires_grad=True)
    old_log_prob = torch.zeros(1, 2)
    mask = torch.ones(1, 2)
    loss_neg, stats = compute_policy_loss(log_prob, old_log_prob, torch.tensor([-1.0]), mask)
    # ratio exp(20) -> dual-clip 3; ratio exp(-20) -> lower clip 0.8
    assert loss_neg.item() == pytest.approx((3.0 + 0.8) / 2)
    assert stats["ppo_kl"] == pytest.approx(0.0)  # (-20 + 20) / 2
    loss_neg.backward()
    assert torch.isfinite(log_prob.grad).all()
    loss_pos, _ = compute_policy_loss(log_prob, old_log_prob, torch.tensor([1.0]), mask)
    # ratio exp(20) -> upper clip -1.28; ratio exp(-20) ~ 2e-9 -> -2e-9
    assert loss_pos.item() == pytest.approx((-1.28 - math.exp(-20.0)) / 2)


def test_policy_loss_dual_clip_disabled_with_inf():
    log_prob = torch.tensor([[math.log(4.0)], [math.log(2.0)]], dtype=torch.float64)
    loss, stats = compute_policy_loss(
        log_prob,
        torch.zeros_like(log_prob),
        torch.tensor([-1.0, 0.0], dtype=torch.float64),
        torch.ones(2, 1),
        clip_ratio_c=float("inf"),
    )
    assert loss.item() == pytest.approx((4.0 + 0.0) / 2, abs=1e-12)
    assert stats["pg_clipfrac_dual"] == 0.0


def test_policy_loss_custom_clip_ratios():
    log_prob = torch.tensor([[math.log(1.25)], [math.log(0.85)]], dtype=torch.float64)
    adv = torch.tensor([1.0, -1.0], dtype=torch.float64)
    # symmetric eps 0.1: 1.25 -> clipped at 1.1; 0.85 (A<0) -> clipped at 0.9
    loss, stats = compute_policy_loss(
        log_prob, torch.zeros_like(log_prob), adv, torch.ones(2, 1), clip_ratio_low=0.1, clip_ratio_high=0.1
    )
    assert loss.item() == pytest.approx((-1.1 + 0.9) / 2, abs=1e-12)
    assert stats["pg_clipfrac_upper"] == 0.5
    assert stats["pg_clipfrac_lower"] == 0.5


def test_policy_loss_errors():
    x = torch.zeros(2, 3)
    adv = torch.zeros(2)
    mask = torch.ones(2, 3)
    with pytest.raises(ValueError, match="clip_ratio_c"):
        compute_policy_loss(x, x, adv, mask, clip_ratio_c=1.0)
    with pytest.raises(ValueError, match="clip_ratio_low"):
        compute_policy_loss(x, x, adv, mask, clip_ratio_low=1.0)
    with pytest.raises(ValueError, match="clip_ratio_high"):
        compute_policy_loss(x, x, adv, mask, clip_ratio_high=-0.1)
    with pytest.raises(ValueError, match="token-mean, seq-mean-token-mean, seq-mean-token-sum"):
        compute_policy_loss(x, x, adv, mask, loss_agg_mode="seq-sum")
    with pytest.raises(ValueError, match="advantages"):
        compute_policy_loss(x, x, torch.zeros(3), mask)
    with pytest.raises(ValueError):
        compute_policy_loss(x, torch.zeros(2, 4), adv, mask)
    with pytest.raises(ValueError):
        compute_policy_loss(x, x, adv, torch.ones(2, 4))
    with pytest.raises(ValueError):
        compute_policy_loss(torch.zeros(2), torch.zeros(2), adv, torch.ones(2))


# ----------------------------------------------------------------------------------------------------------------
# agg_loss (DAPO Eq. 12 and the GRPO / Dr. GRPO-like modes)
# ----------------------------------------------------------------------------------------------------------------

# row 0: tokens 1, 2, 3 -> sum 6, mean 2; row 1: token 5 -> sum 5, mean 5; row 2: empty mask -> 0
LOSS_MAT = torch.tensor([[1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 7.0, 8.0], [9.0, 9.0, 9.0, 9.0]])
LOSS_MASK = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]], dtype=torch.bool)


@pytest.mark.parametrize(
    "mode, expected, expected_global",
    [
        ("token-mean", (6 + 5) / 4, (6 + 5) / 10),  # global_num_tokens=10
        ("seq-mean-token-mean", (2 + 5 + 0) / 3, (2 + 5 + 0) / 5),  # global_batch_size=5
        ("seq-mean-token-sum", (6 + 5 + 0) / 3, (6 + 5 + 0) / 5),
    ],
)
def test_agg_loss_modes_ragged(mode, expected, expected_global):
    assert agg_loss(LOSS_MAT, LOSS_MASK, mode).item() == pytest.approx(expected)
    got = agg_loss(LOSS_MAT, LOSS_MASK, mode, global_num_tokens=10, global_batch_size=5)
    assert got.item() == pytest.approx(expected_global)
    # NaN in masked-out positions does not leak
    loss_mat = LOSS_MAT.masked_fill(~LOSS_MASK, float("nan"))
    assert agg_loss(loss_mat, LOSS_MASK, mode).item() == pytest.approx(expected)
    # an all-empty mask gives 0, not NaN
    assert agg_loss(LOSS_MAT, torch.zeros_like(LOSS_MASK), mode).item() == 0.0


def test_agg_loss_errors():
    with pytest.raises(ValueError, match="valid modes"):
        agg_loss(LOSS_MAT, LOSS_MASK, "token-sum")
    with pytest.raises(ValueError):
        agg_loss(LOSS_MAT, LOSS_MASK[:, :3], "token-mean")
    with pytest.raises(ValueError):
        agg_loss(LOSS_MAT, LOSS_MASK, "token-mean", global_num_tokens=0)
    with pytest.raises(ValueError):
        agg_loss(LOSS_MAT, LOSS_MASK, "seq-mean-token-mean", global_batch_size=-1)
    assert LOSS_AGG_MODES == (
        "token-mean",
        "seq-mean-token-mean",
        "seq-mean-token-sum",
        "seq-mean-token-sum-norm",
    )


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_gradient_independent_of_micro_batch_split(mode):
    generator = torch.Generator().manual_seed(0)
    batch, seq = 8, 6
    lengths = torch.tensor([6, 1, 3, 0, 5, 2, 4, 6])  # ragged, one empty response
    mask = torch.arange(seq)[None, :] < lengths[:, None]
    old_log_prob = -torch.rand(batch, seq, generator=generator) * 2
    # log-ratios in [-0.6, 0.6] plus one token at ratio ~e^1.5 > c: all clip regimes are exercised
    log_ratio = (torch.rand(batch, seq, generator=generator) - 0.5) * 1.2
    log_ratio[0, 0] = 1.5
    advantages = torch.randn(batch, generator=generator)
    advantages[0] = -1.0

    def run(num_micro_batches: int) -> tuple[torch.Tensor, float]:
        log_prob = (old_log_prob + log_ratio).clone().requires_grad_(True)
        global_num_tokens = int(mask.sum().item())
        total = 0.0
        for idx in torch.arange(batch).chunk(num_micro_batches):
            loss, _ = compute_policy_loss(
                log_prob[idx],
                old_log_prob[idx],
                advantages[idx],
                mask[idx],
                loss_agg_mode=mode,
                global_num_tokens=global_num_tokens,
                global_batch_size=batch,
            )
            loss.backward()  # gradients accumulate into log_prob.grad
            total += loss.item()
        return log_prob.grad, total

    grad_full, loss_full = run(1)
    grad_micro, loss_micro = run(4)
    assert grad_full.abs().sum() > 0
    torch.testing.assert_close(grad_micro, grad_full, rtol=0, atol=1e-7)
    assert loss_micro == pytest.approx(loss_full, abs=1e-6)
    # the full batch with the global counts equals the plain (local) aggregation
    local, _ = compute_policy_loss(
        old_log_prob + log_ratio, old_log_prob, advantages, mask, loss_agg_mode=mode
    )
    assert loss_full == pytest.approx(local.item(), abs=1e-6)


# ----------------------------------------------------------------------------------------------------------------
# overlong_penalty (DAPO Eq. 13)
# ----------------------------------------------------------------------------------------------------------------


def test_overlong_penalty_values():
    # L_max = 20, L_cache = 4: free up to 16 tokens, then -(len - 16) / 4, -1 at 20 and beyond
    lengths = torch.tensor([0, 10, 16, 17, 18, 19, 20, 21, 100])
    got = overlong_penalty(lengths, max_response_length=20, buffer_len=4, penalty_factor=1.0)
    expected = torch.tensor([0.0, 0.0, 0.0, -0.25, -0.5, -0.75, -1.0, -1.0, -1.0])
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, expected, rtol=0, atol=0)


def test_overlong_penalty_factor_float_lengths_and_full_buffer():
    got = overlong_penalty(torch.tensor([18.0, 30.0]), 20, 4, 0.5)
    torch.testing.assert_close(got, torch.tensor([-0.25, -0.5]), rtol=0, atol=0)
    # buffer == L_max: the penalty starts at the first token
    got = overlong_penalty([0, 5, 10], max_response_length=10, buffer_len=10, penalty_factor=1.0)
    torch.testing.assert_close(got, torch.tensor([0.0, -0.5, -1.0]), rtol=0, atol=0)


def test_overlong_penalty_errors():
    with pytest.raises(ValueError):
        overlong_penalty(torch.tensor([1]), 20, 0, 1.0)
    with pytest.raises(ValueError):
        overlong_penalty(torch.tensor([1]), 20, 21, 1.0)
    with pytest.raises(ValueError):
        overlong_penalty(torch.tensor([1]), 20, 4, -1.0)


# ----------------------------------------------------------------------------------------------------------------
# filter_groups / kept_group_ids (DAPO Eq. 11)
# ----------------------------------------------------------------------------------------------------------------


def test_filter_groups_float_scores_with_tolerance():
    # group 5: 1.0 vs 1.0 + 1e-9 -> constant; group 2: varies; group 9: constant; group 11: alone -> kept
    metric = torch.tensor([1.0, 1.0 + 1e-9, 0.0, 1.0, 0.5, 0.5, 0.7], dtype=torch.float64)
    group_index = torch.tensor([5, 5, 2, 2, 9, 9, 11])
    keep = filter_groups(metric, group_index)
    assert keep.dtype == torch.bool
    assert keep.tolist() == [False, False, True, True, False, False, True]
    # with tol=0 the 1e-9 difference counts as variation
    assert filter_groups(metric, group_index, tol=0.0).tolist() == [
        True,
        True,
        True,
        True,
        False,
        False,
        True,
    ]


def test_filter_groups_interleaved_bool_acc():
    acc = torch.tensor([True, True, False, True, False, False])
    group_index = torch.tensor([0, 1, 0, 1, 2, 2])
    assert filter_groups(acc, group_index).tolist() == [True, False, True, False, False, False]


def test_kept_group_ids_first_appearance_order():
    metric = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 4.0])
    group_index = torch.tensor([9, 3, 9, 3, 7, 7, -1])
    ids = kept_group_ids(metric, group_index)
    assert ids.tolist() == [9, 7, -1]
    assert ids.dtype == group_index.dtype
    with pytest.raises(ValueError):
        filter_groups(metric, group_index[:3])
    with pytest.raises(ValueError):
        filter_groups(metric, group_index, tol=-1.0)


# ----------------------------------------------------------------------------------------------------------------
# masked statistics, entropy, log-probs
# ----------------------------------------------------------------------------------------------------------------


def test_masked_sum_and_mean():
    x = torch.tensor([[1.0, 2.0, float("nan")], [4.0, float("-inf"), 6.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 1]])
    assert masked_sum(x, mask).item() == 13.0
    assert masked_mean(x, mask).item() == pytest.approx(13.0 / 4)
    torch.testing.assert_close(masked_sum(x, mask, dim=-1), torch.tensor([3.0, 10.0]))
    torch.testing.assert_close(masked_mean(x, mask, dim=-1), torch.tensor([1.5, 5.0]))
    torch.testing.assert_close(masked_mean(x, mask, dim=0), torch.tensor([2.5, 2.0, 6.0]))
    # an empty row gives 0, not NaN
    empty_row = torch.tensor([[1, 0, 0], [0, 0, 0]])
    torch.testing.assert_close(masked_mean(x, empty_row, dim=-1), torch.tensor([1.0, 0.0]))
    assert masked_mean(x, torch.zeros_like(mask)).item() == 0.0
    # a (B, 1) mask broadcasts; a mask of incompatible shape raises
    assert masked_sum(torch.ones(2, 3), torch.tensor([[1], [0]])).item() == 3.0
    with pytest.raises(ValueError):
        masked_mean(x, torch.ones(3, 2))


def test_entropy_from_logits_uniform_and_reference():
    vocab = 7
    uniform = torch.full((2, 3, vocab), 5.0)
    torch.testing.assert_close(entropy_from_logits(uniform), torch.full((2, 3), math.log(vocab)))
    # two equally likely tokens among very negative ones: log 2, even at large magnitudes
    peaked = torch.tensor([[1000.0, 1000.0, -1000.0, -1000.0]])
    torch.testing.assert_close(entropy_from_logits(peaked), torch.tensor([math.log(2.0)]))
    logits = torch.randn(4, 5, 11, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    log_p = torch.log_softmax(logits, dim=-1)
    torch.testing.assert_close(entropy_from_logits(logits), -(log_p.exp() * log_p).sum(-1))


def test_logprobs_from_logits_matches_log_softmax():
    generator = torch.Generator().manual_seed(2)
    logits = torch.randn(3, 4, 13, generator=generator, dtype=torch.float64) * 30.0
    labels = torch.randint(0, 13, (3, 4), generator=generator)
    expected = torch.log_softmax(logits, dim=-1).gather(-1, labels[..., None]).squeeze(-1)
    torch.testing.assert_close(logprobs_from_logits(logits, labels), expected)
    with pytest.raises(ValueError):
        logprobs_from_logits(logits, labels[:, :3])
    with pytest.raises(ValueError):
        logprobs_from_logits(logits, labels.float())


def test_registries_select_estimators_and_losses_by_name():
    from dapo_rl.algo import ADV_ESTIMATORS, get_adv_estimator, get_policy_loss, register_adv_est
    from dapo_rl.config import ConfigError, load_config

    assert get_policy_loss("vanilla") is compute_policy_loss
    assert get_adv_estimator("grpo") is compute_grpo_advantages

    @register_adv_est("test_rloo")
    def rloo(scores, group_index, *, norm_adv_by_std_in_grpo=True):
        """Leave-one-out baseline (RLOO) for groups of equal size."""
        _, inv, counts = torch.unique(group_index, return_inverse=True, return_counts=True)
        sums = torch.zeros(len(counts)).index_add_(0, inv, scores)
        return scores - (sums[inv] - scores) / (counts[inv] - 1)

    try:
        assert load_config(None, ["algorithm.adv_estimator=test_rloo"]).algorithm.adv_estimator == "test_rloo"
        adv = get_adv_estimator("test_rloo")(torch.tensor([1.0, 0.0, 0.0]), torch.tensor([0, 0, 0]))
        assert adv.tolist() == [1.0, -0.5, -0.5]  # 1 - 0, 0 - 1/2, 0 - 1/2
        with pytest.raises(ValueError, match="advantage estimator 'test_rloo' is already registered"):
            register_adv_est("test_rloo")(rloo)
    finally:
        del ADV_ESTIMATORS["test_rloo"]
    with pytest.raises(
        ConfigError,
        match="algorithm.policy_loss.loss_mode='grpo_zero' is not one of cispo, clip_cov, dppo_kl, dppo_tv, geo_mean, gspo, kl_cov, sapo, vanilla",
    ):
        load_config(None, ["algorithm.policy_loss.loss_mode=grpo_zero"])
    with pytest.raises(
        ValueError,
        match="unknown policy loss 'grpo_zero'; registered: cispo, clip_cov, dppo_kl, dppo_tv, geo_mean, gspo, kl_cov, sapo, vanilla",
    ):
        get_policy_loss("grpo_zero")


def test_batch_std_advantages_by_hand_and_against_trls_scale_rewards_batch():
    """ScaleRL's batch-level normalisation (`grpo_batch_std`): the group's mean, the batch's std."""
    from dapo_rl.algo import get_adv_estimator

    est = get_adv_estimator("grpo_batch_std")
    # groups (1, 0) and (1, 1): centred (0.5, -0.5, 0, 0); batch std of (1, 0, 1, 1) = 0.5 -> (1, -1, 0, 0),
    # where GRPO's group std (0.7071) gives +-0.7071
    scores, groups = torch.tensor([1.0, 0.0, 1.0, 1.0]), torch.tensor([0, 0, 1, 1])
    assert est(scores, groups).tolist() == pytest.approx([1.0, -1.0, 0.0, 0.0], abs=1e-5)
    assert compute_grpo_advantages(scores, groups).tolist() == pytest.approx(
        [0.70710, -0.70710, 0, 0], abs=1e-5
    )
    assert est(scores, groups, norm_adv_by_std_in_grpo=False).tolist() == [0.5, -0.5, 0.0, 0.0]
    # a group that nearly agrees keeps its small spread instead of being scaled to unit std
    scores, groups = torch.tensor([0.9, 1.0, 0.0, 1.0]), torch.tensor([0, 0, 1, 1])
    batch = est(scores, groups)
    assert abs(batch[0].item()) < 0.15 and compute_grpo_advantages(scores, groups)[0].item() == pytest.approx(
        -0.7071, abs=1e-4
    )

    def trl(rewards, group_size, eps):  # TRL's scale_rewards="batch" (grpo_trainer.py), re-typed
        mean = rewards.view(-1, group_size).mean(dim=1).repeat_interleave(group_size)
        return (rewards - mean) / (rewards.std() + eps)

    g = torch.Generator().manual_seed(0)
    for _ in range(5):
        r = torch.randint(0, 3, (24,), generator=g).double() - 1.0
        ours = est(r, torch.arange(6).repeat_interleave(4), eps=1e-4)
        assert torch.allclose(ours, trl(r, 4, 1e-4), atol=1e-6)


def test_dr_grpo_centres_without_dividing_by_the_std():
    scores = torch.tensor([1.0, -1.0, -1.0, -1.0, 0.5, 0.5])
    gidx = torch.tensor([0, 0, 0, 0, 1, 1])
    adv = compute_grpo_advantages(scores, gidx, norm_adv_by_std_in_grpo=False)
    assert adv.tolist() == pytest.approx([1.5, -0.5, -0.5, -0.5, 0.0, 0.0])  # mean -0.5; group 1 constant
    assert compute_grpo_advantages(scores, gidx)[0] == pytest.approx(
        1.5 / (1.0 + 1e-6)
    )  # std of (1,-1,-1,-1) is 1


# ------------------------------------------------------------------------------- CISPO and GSPO, by hand
def _lp(*probs):
    return torch.tensor([[math.log(p) for p in probs]], dtype=torch.float64)


def test_cispo_by_hand():
    from dapo_rl.algo.policy_loss import compute_policy_loss_cispo

    # ratios 0.5/0.25 = 2 and 1; weights clip(., 0.8, 1.28) = 1.28 and 1; A = 1, token-mean over 2 tokens:
    # loss = -(1.28 ln 0.5 + ln 0.2) / 2 = 1.2483330; d loss / d log_prob = -(weight * A) / 2 = (-0.64, -0.5)
    log_prob = _lp(0.5, 0.2).requires_grad_()
    loss, stats = compute_policy_loss_cispo(log_prob, _lp(0.25, 0.2), torch.tensor([1.0]), torch.ones(1, 2))
    assert loss.item() == pytest.approx(-(1.28 * math.log(0.5) + math.log(0.2)) / 2)
    assert loss.item() == pytest.approx(1.248333, abs=1e-6)
    loss.backward()
    assert log_prob.grad.flatten().tolist() == pytest.approx(
        [-0.64, -0.5]
    )  # the clipped token keeps its gradient
    assert stats["pg_clipfrac_upper"] == 0.5 and stats["pg_clipfrac_lower"] == 0.0
    # a negative advantage flips the sign; a masked token adds nothing
    log_prob = _lp(0.5, 0.2).requires_grad_()
    loss, _ = compute_policy_loss_cispo(
        log_prob, _lp(0.25, 0.2), torch.tensor([-2.0]), torch.tensor([[1.0, 0.0]])
    )
    assert loss.item() == pytest.approx(2 * 1.28 * math.log(0.5))
    loss.backward()
    assert log_prob.grad.flatten().tolist() == pytest.approx([2.56, 0.0])


def test_gspo_by_hand():
    from dapo_rl.algo.policy_loss import compute_policy_loss_gspo

    # log-ratios ln 2 and 0: s = exp(ln 2 / 2) = sqrt 2
    old = _lp(0.25, 0.2)
    # A = +1: clipped at 1.28, loss -1.28 and no gradient
    log_prob = _lp(0.5, 0.2).requires_grad_()
    loss, stats = compute_policy_loss_gspo(log_prob, old, torch.tensor([1.0]), torch.ones(1, 2))
    assert loss.item() == pytest.approx(-1.28)
    loss.backward()
    assert log_prob.grad.abs().max().item() == 0.0
    assert stats["pg_clipfrac_upper"] == 1.0
    # A = -1: unclipped, loss = s = sqrt 2; the gradient of exp(mean log-ratio) is s / |o| per token
    log_prob = _lp(0.5, 0.2).requires_grad_()
    loss, stats = compute_policy_loss_gspo(log_prob, old, torch.tensor([-1.0]), torch.ones(1, 2))
    assert loss.item() == pytest.approx(math.sqrt(2))
    loss.backward()
    assert log_prob.grad.flatten().tolist() == pytest.approx([math.sqrt(2) / 2] * 2)
    assert stats["pg_clipfrac"] == 0.0
    # per sequence whatever loss_agg_mode says: a long and a short sequence weigh the same (GSPO's 1/G sum_i)
    two = torch.tensor(
        [[math.log(0.5), math.log(0.5), math.log(0.5)], [math.log(0.5), 0.0, 0.0]], dtype=torch.float64
    )
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    loss, _ = compute_policy_loss_gspo(two, two, torch.tensor([1.0, 3.0]), mask, loss_agg_mode="token-mean")
    assert loss.item() == pytest.approx(-(1.0 + 3.0) / 2)  # s = 1 for both: -(A_1 + A_2) / 2


def test_cispo_and_gspo_are_selectable_and_train_the_real_actor(tmp_path):
    from dapo_rl.actor import Actor, TrainBatch
    from dapo_rl.config import ActorConfig, AlgorithmConfig, PolicyLossConfig, load_config
    from dapo_rl.models.tiny import save_tiny_checkpoint

    save_tiny_checkpoint(tmp_path, seed=2)
    for name in ("cispo", "gspo"):
        cfg = load_config(None, [f"algorithm.policy_loss.loss_mode={name}"])
        assert cfg.algorithm.policy_loss.loss_mode == name
        actor = Actor(
            str(tmp_path),
            ActorConfig(ppo_micro_batch_size=2, ppo_mini_batch_size=2, lr=1e-3),
            AlgorithmConfig(policy_loss=PolicyLossConfig(loss_mode=name)),
        )
        batch = TrainBatch.build(
            [[1, 2, 3]] * 4,
            [[4, 5], [6], [7, 8, 9], [10]],
            torch.tensor([1.0, -1.0, 0.5, -0.5]),
            torch.ones(4),
            257,
        )
        metrics = actor.update(batch)
        assert math.isfinite(metrics["actor/pg_loss"]) and metrics["actor/grad_norm"] > 0


def test_dr_grpo_constant_normaliser_by_hand():
    """`seq-mean-token-sum-norm` (Dr. GRPO Eq. 3): (1/B) sum_i sum_t l / L with a constant L, whatever the lengths."""
    loss_mat = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    # (6 + 4) / 2 sequences / L = 10 -> 0.5
    assert agg_loss(loss_mat, mask, "seq-mean-token-sum-norm", loss_scale_factor=10).item() == pytest.approx(
        0.5
    )
    # micro-batches with the mini-batch's B sum to the whole: 6 / 2 / 10 + 4 / 2 / 10
    parts = [
        agg_loss(
            loss_mat[i : i + 1],
            mask[i : i + 1],
            "seq-mean-token-sum-norm",
            global_batch_size=2,
            loss_scale_factor=10,
        )
        for i in range(2)
    ]
    assert sum(p.item() for p in parts) == pytest.approx(0.5)
    # without the constant: the micro-batch's T (3): 10 / 2 / 3
    assert agg_loss(loss_mat, mask, "seq-mean-token-sum-norm").item() == pytest.approx(10 / 6)
    with pytest.raises(ValueError, match="loss_scale_factor must be > 0"):
        agg_loss(loss_mat, mask, "seq-mean-token-sum-norm", loss_scale_factor=0)


def test_dr_grpo_mode_reaches_the_loss_through_the_actor(tmp_path):
    from dapo_rl.actor import Actor, TrainBatch
    from dapo_rl.config import ActorConfig, AlgorithmConfig
    from dapo_rl.models.tiny import save_tiny_checkpoint

    save_tiny_checkpoint(tmp_path, seed=2)
    batch = TrainBatch.build([[1, 2, 3]] * 2, [[4, 5], [6]], torch.tensor([1.0, -1.0]), torch.ones(2), 257)
    losses = {}
    for factor in (1.0, 4.0):
        algo = AlgorithmConfig(loss_agg_mode="seq-mean-token-sum-norm", loss_scale_factor=factor)
        actor = Actor(str(tmp_path), ActorConfig(ppo_micro_batch_size=1, lr=0.0), algo)
        losses[factor] = actor.update(batch)["actor/pg_loss"]
    assert losses[1.0] != 0 and losses[4.0] == pytest.approx(losses[1.0] / 4, rel=1e-5)


def test_carried_rows_take_the_recorded_sampling_log_probs_as_pi_old(tmp_path):
    """Zero-waste dynamic sampling: a group carried from the previous step was sampled by the previous policy, so
    its importance ratio is pi_theta / mu with mu the engine's recorded log-probs; fresh rows keep the recompute."""
    from dapo_rl.actor import Actor, TrainBatch
    from dapo_rl.config import ActorConfig, AlgorithmConfig
    from dapo_rl.models.tiny import save_tiny_checkpoint

    save_tiny_checkpoint(tmp_path, seed=2)
    actor = Actor(
        str(tmp_path), ActorConfig(ppo_micro_batch_size=4, ppo_mini_batch_size=2), AlgorithmConfig()
    )
    recorded = [[-3.0, -2.0], [-1.5], [-0.5, -0.25, -4.0], [-2.5]]
    build = lambda stale: TrainBatch.build(  # noqa: E731
        [[1, 2, 3]] * 4,
        [[4, 5], [6], [7, 8, 9], [10]],
        torch.tensor([1.0, -1.0, 0.5, -0.5]),
        torch.ones(4),
        257,
        rollout_logprobs=recorded,
        minibatch=[0, 0, 1, 1],
        stale=stale,
    )
    current = actor.compute_log_prob(build(None))
    batch = build([True, False, True, False])
    assert batch.slice(torch.tensor([2, 3])).stale.tolist() == [True, False]
    actor.update(batch)
    old = batch.old_log_prob
    assert old[0, :2].tolist() == [-3.0, -2.0] and old[2].tolist() == [-0.5, -0.25, -4.0]
    assert torch.allclose(old[1, :1], current[1, :1]) and torch.allclose(old[3, :1], current[3, :1])
    # on-policy shape (one mini-batch, one epoch) still recomputes once carried rows are present
    one = TrainBatch.build(
        [[1, 2, 3]] * 2,
        [[4, 5], [6]],
        torch.tensor([1.0, -1.0]),
        torch.ones(2),
        257,
        rollout_logprobs=recorded[:2],
        stale=[False, True],
    )
    metrics = actor.update(one)
    assert metrics["time/old_log_prob_s"] > 0 and one.old_log_prob[1, 0].item() == -1.5
    with pytest.raises(ValueError, match="carried from an earlier step need the engine's sampling log-probs"):
        actor.update(TrainBatch.build([[1]], [[4]], torch.tensor([1.0]), torch.ones(1), 257, stale=[True]))


def test_stale_rows_under_rollout_correction_keep_the_recomputed_pi_old_and_get_its_weights(tmp_path):
    """Asynchronous rows sampled by an older policy, with `rollout_is=token`: pi_old is the current policy's
    recompute (AReaL's proximal policy) and each token's IS weight is min(pi_old / mu, threshold)."""
    from dapo_rl.actor import Actor, TrainBatch
    from dapo_rl.config import ActorConfig, AlgorithmConfig, RolloutCorrectionConfig
    from dapo_rl.models.tiny import save_tiny_checkpoint

    save_tiny_checkpoint(tmp_path, seed=2)
    algo = AlgorithmConfig(
        rollout_correction=RolloutCorrectionConfig(rollout_is="token", rollout_is_threshold=2.0)
    )
    actor = Actor(str(tmp_path), ActorConfig(ppo_micro_batch_size=4, lr=0.0), algo)
    recorded = [[-3.0, -2.0], [-1.5]]
    batch = TrainBatch.build(
        [[1, 2, 3]] * 2,
        [[4, 5], [6]],
        torch.tensor([1.0, -1.0]),
        torch.ones(2),
        257,
        rollout_logprobs=recorded,
        stale=[True, False],
    )
    current = actor.compute_log_prob(
        TrainBatch.build([[1, 2, 3]] * 2, [[4, 5], [6]], torch.zeros(2), torch.ones(2), 257)
    )
    actor.update(batch)
    assert torch.allclose(batch.old_log_prob[0, :2], current[0, :2])  # not the recorded -3, -2
    want = torch.clamp((current[0, :2] - torch.tensor([-3.0, -2.0])).exp(), max=2.0)
    assert torch.allclose(batch.rollout_is_weights[0, :2], want)
