"""The peers' policy losses (`dapo_rl.algo.policy_loss_variants`): hand-computed values and gradients on small
tensors, the peer's formula re-typed from its source and compared on random inputs, and each loss through the
real actor."""

from __future__ import annotations

import math

import pytest
import torch

from dapo_rl.algo import POLICY_LOSSES, get_policy_loss, loss_hyperparameters
from dapo_rl.config import ConfigError, PolicyLossConfig, load_config

NEW = ("clip_cov", "kl_cov", "geo_mean", "sapo", "dppo_tv", "dppo_kl")


def _lp(*rows) -> torch.Tensor:
    """log of a (B, T) table of probabilities, float64."""
    return torch.tensor([[math.log(p) for p in row] for row in rows], dtype=torch.float64)


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


# ------------------------------------------------------------------------------------------------ by hand
def test_sapo_by_hand_gate_value_and_gradient():
    sapo = get_policy_loss("sapo")
    # ratios 0.5/0.25 = 2 and 1; A = +1, tau_pos = 1: f(2) = 4 sigmoid(1) = 2.9242344, f(1) = 2
    log_prob = _lp([0.5, 0.2]).requires_grad_()
    loss, stats = sapo(log_prob, _lp([0.25, 0.2]), torch.tensor([1.0]), torch.ones(1, 2))
    assert loss.item() == pytest.approx(-(4 * _sigmoid(1.0) + 2.0) / 2, abs=1e-9)
    assert loss.item() == pytest.approx(-2.4621172, abs=1e-6)
    loss.backward()
    # d/d log_prob of -f(r) A / |o| = -A * 4 sigmoid (1 - sigmoid) * r / 2: the off-policy token's gradient fades
    # (0.786 instead of PPO's 2 before its clip, 0 after), the on-policy one is the policy gradient's
    g = 4 * _sigmoid(1.0) * (1 - _sigmoid(1.0))
    assert log_prob.grad.flatten().tolist() == pytest.approx([-g * 2 / 2, -0.5], abs=1e-9)
    assert stats["pg_clipfrac"] == 0.0
    # A = -1: tau_neg = 1.05
    loss, _ = sapo(_lp([0.5, 0.2]), _lp([0.25, 0.2]), torch.tensor([-1.0]), torch.ones(1, 2))
    assert loss.item() == pytest.approx((4 / 1.05 * _sigmoid(1.05) + 4 / 1.05 * 0.5) / 2, abs=1e-9)
    assert loss.item() == pytest.approx(2.3633806, abs=1e-6)
    # per sequence whatever loss_agg_mode says: a 1-token and a 3-token response weigh the same
    lp = torch.zeros(2, 3, dtype=torch.float64)
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    loss, _ = sapo(lp, lp, torch.tensor([1.0, 3.0]), mask, loss_agg_mode="token-mean")
    assert loss.item() == pytest.approx(-(2 * 1.0 + 2 * 3.0) / 2)


def test_geo_mean_by_hand_log_space_clip():
    gmpo = get_policy_loss("geo_mean")
    kw = dict(clip_ratio_low=0.4, clip_ratio_high=0.4)
    # log-ratios ln 2 (past e^0.4: clipped for A > 0) and 0.1: exp((0.4 + 0.1) / 2) = exp(0.25)
    old = torch.tensor([[math.log(0.25), math.log(0.2) - 0.1]], dtype=torch.float64)
    log_prob = _lp([0.5, 0.2]).requires_grad_()
    loss, stats = gmpo(log_prob, old, torch.tensor([1.0]), torch.ones(1, 2), **kw)
    assert loss.item() == pytest.approx(-math.exp(0.25), abs=1e-12)
    loss.backward()
    assert log_prob.grad.flatten().tolist() == pytest.approx([0.0, -math.exp(0.25) / 2], abs=1e-12)
    assert stats["pg_clipfrac_upper"] == 0.5 and stats["pg_clipfrac_lower"] == 0.0
    # A = -1: the clip binds only below (-0.4); ln 2 stays: exp((ln 2 + 0.1) / 2)
    log_prob = _lp([0.5, 0.2]).requires_grad_()
    loss, stats = gmpo(log_prob, old, torch.tensor([-1.0]), torch.ones(1, 2), **kw)
    s = math.exp((math.log(2) + 0.1) / 2)
    assert loss.item() == pytest.approx(s, abs=1e-12) and loss.item() == pytest.approx(1.4867218, abs=1e-6)
    loss.backward()
    assert log_prob.grad.flatten().tolist() == pytest.approx([s / 2, s / 2], abs=1e-12)
    assert stats["pg_clipfrac"] == 0.0  # the clamp moved ln 2, but the min took the unclipped value
    # A = -1 and a log-ratio of -1: clipped at -0.4, no gradient there
    log_prob = torch.tensor([[-1.0, 0.1]], dtype=torch.float64, requires_grad=True)
    loss, stats = gmpo(
        log_prob, torch.zeros(1, 2, dtype=torch.float64), torch.tensor([-1.0]), torch.ones(1, 2), **kw
    )
    assert loss.item() == pytest.approx(math.exp(-0.15), abs=1e-12)
    loss.backward()
    assert log_prob.grad.flatten().tolist() == pytest.approx([0.0, math.exp(-0.15) / 2], abs=1e-12)
    assert stats["pg_clipfrac_lower"] == 0.5
    # a masked token adds nothing; the mean is over rows (an empty row counts in B and adds 0)
    lp = torch.zeros(2, 2, dtype=torch.float64)
    loss, _ = gmpo(lp, lp, torch.tensor([3.0, 5.0]), torch.tensor([[1.0, 0.0], [0.0, 0.0]]), **kw)
    assert loss.item() == pytest.approx(-3.0 / 2)


def _cov_batch():
    """Two responses of two tokens, A = (+2, -2), token means 0 and -1.575: covariances
    (0,0) 2 * 1.475 = 2.95, (0,1) -2.85, (1,0) -3.05, (1,1) 2.85."""
    log_prob = torch.tensor([[-0.1, -3.0], [-0.2, -3.0]], dtype=torch.float64)
    return log_prob, torch.tensor([2.0, -2.0]), torch.ones(2, 2)


def test_clip_cov_detaches_candidates_inside_the_bounds_and_never_clipped_ones():
    clip_cov = get_policy_loss("clip_cov")
    lp, A, mask = _cov_batch()
    # ratio 1 everywhere: candidates (0,0) and (1,1) (1 < cov < 5); clip_cov_ratio 0.5 -> 2 of 4 tokens
    log_prob = lp.clone().requires_grad_()
    loss, stats = clip_cov(log_prob, lp, A, mask, clip_cov_ratio=0.5)
    loss.backward()
    # token-mean of -A r with the detached tokens' terms 0 (verl multiplies the loss by 0): (0 - 2 + 2 + 0) / 4
    assert loss.item() == pytest.approx(0.0)
    assert log_prob.grad.flatten().tolist() == pytest.approx([0.0, -0.5, 0.5, 0.0])
    assert stats["pg_cov_clipfrac"] == 0.5
    # (0,0) with ratio 2 and A > 0 is clipped already: not a candidate, so only (1,1) is detached
    log_prob = lp.clone().requires_grad_()
    old = lp - torch.tensor([[math.log(2.0), 0.0], [0.0, 0.0]], dtype=torch.float64)
    loss, stats = clip_cov(log_prob, old, A, mask, clip_cov_ratio=0.5)
    loss.backward()
    assert log_prob.grad.flatten().tolist() == pytest.approx([0.0, -0.5, 0.5, 0.0])
    assert loss.item() == pytest.approx((-2 * 1.28 - 2 + 2 + 0) / 4)  # a detached token's term is 0
    assert stats["pg_cov_clipfrac"] == 0.25 and stats["pg_clipfrac_upper"] == 0.25
    # the default share (2e-4 of 4 tokens) still detaches one token, one of the two candidates at random
    picked = set()
    for seed in range(8):
        log_prob = lp.clone().requires_grad_()
        loss, stats = clip_cov(log_prob, lp, A, mask, generator=torch.Generator().manual_seed(seed))
        loss.backward()
        zero = [tuple(ix) for ix in torch.nonzero(log_prob.grad == 0).tolist()]
        assert len(zero) == 1 and zero[0] in {(0, 0), (1, 1)} and stats["pg_cov_clipfrac"] == 0.25
        picked.add(zero[0])
    assert picked == {(0, 0), (1, 1)}
    # bounds that take no token: plain PPO
    log_prob = lp.clone().requires_grad_()
    clip_cov(log_prob, lp, A, mask, clip_cov_lb=3.0)[0].backward()
    assert (log_prob.grad != 0).all()


def test_kl_cov_penalises_the_top_covariance_token_and_clips_nothing():
    kl_cov = get_policy_loss("kl_cov")
    lp, A, mask = _cov_batch()
    log_prob = lp.clone().requires_grad_()
    # log-ratio 0.5 everywhere (ratio 1.6487, past DAPO's 1.28: kl_cov clips nothing); k = 1: the top token (0,0)
    loss, stats = kl_cov(log_prob, lp - 0.5, A, mask, kl_cov_ratio=0.25, ppo_kl_coef=0.1)
    r = math.exp(0.5)
    # -A r sums to 0 over the four tokens; the penalty 0.1 * |0.5| on (0,0): 0.05 / 4
    assert loss.item() == pytest.approx(0.0125, abs=1e-12)
    loss.backward()
    assert log_prob.grad.flatten().tolist() == pytest.approx(
        [(-2 * r + 0.1) / 4, -2 * r / 4, 2 * r / 4, 2 * r / 4], abs=1e-12
    )
    assert log_prob.grad[0, 0].item() == pytest.approx(-0.7993607, abs=1e-6)
    assert (
        stats["pg_cov_klfrac"] == 0.25 and stats["pg_clipfrac_upper"] == 0.5
    )  # where DAPO's clip would bind
    # a masked token is never chosen: with (0,0) masked the top one is (1,1)
    log_prob = lp.clone().requires_grad_()
    m = torch.tensor([[0.0, 1.0], [1.0, 1.0]])
    _, stats = kl_cov(log_prob, lp - 0.5, A, m, kl_cov_ratio=0.25)
    assert stats["pg_cov_klfrac"] == pytest.approx(1 / 3)


def test_dppo_tv_trust_region_on_the_probability_difference():
    tv = get_policy_loss("dppo_tv")
    kw = dict(clip_ratio_low=0.15, clip_ratio_high=0.15, clip_ratio_c=3.0)
    # A = +1: p 0.7 vs 0.5 (+0.2, outside: no loss, no gradient); p 0.6 vs 0.5 (+0.1, inside: -A r log p)
    log_prob = _lp([0.7, 0.6]).requires_grad_()
    loss, stats = tv(log_prob, _lp([0.5, 0.5]), torch.tensor([1.0]), torch.ones(1, 2), **kw)
    assert loss.item() == pytest.approx(-1.2 * math.log(0.6) / 2, abs=1e-12)
    assert loss.item() == pytest.approx(0.3064954, abs=1e-6)
    loss.backward()
    assert log_prob.grad.flatten().tolist() == pytest.approx([0.0, -1.2 / 2], abs=1e-12)
    assert stats["pg_clipfrac_upper"] == 0.5 and stats["pg_clipfrac_lower"] == 0.0
    # A = -1: p 0.3 vs 0.5 (-0.2, outside); p 0.9 vs 0.2 (up, against the push: inside) with r = 4.5 cut at c = 3
    log_prob = _lp([0.3, 0.9]).requires_grad_()
    loss, stats = tv(log_prob, _lp([0.5, 0.2]), torch.tensor([-1.0]), torch.ones(1, 2), **kw)
    assert loss.item() == pytest.approx(3.0 * math.log(0.9) / 2, abs=1e-12)
    loss.backward()
    assert log_prob.grad.flatten().tolist() == pytest.approx([0.0, 3.0 / 2], abs=1e-12)
    assert stats["pg_clipfrac_lower"] == 0.5 and stats["pg_clipfrac_ratio_c"] == 0.5


def test_dppo_kl_trust_region_on_the_binary_kl():
    kl = get_policy_loss("dppo_kl")
    kw = dict(clip_ratio_low=0.05, clip_ratio_high=0.05)
    # A = +1, p_old 0.5: p 0.7 has binary KL 0.5 ln(5/7) + 0.5 ln(5/3) = 0.0871767 > 0.05 (out), p 0.55 0.0050252 (in)
    assert 0.5 * math.log(0.5 / 0.7) + 0.5 * math.log(0.5 / 0.3) == pytest.approx(0.0871767, abs=1e-7)
    log_prob = _lp([0.7, 0.55]).requires_grad_()
    loss, stats = kl(log_prob, _lp([0.5, 0.5]), torch.tensor([1.0]), torch.ones(1, 2), **kw)
    assert loss.item() == pytest.approx(-1.1 * math.log(0.55) / 2, abs=1e-12)
    loss.backward()
    assert log_prob.grad.flatten().tolist() == pytest.approx([0.0, -1.1 / 2], abs=1e-12)
    assert stats["pg_clipfrac_upper"] == 0.5
    # A = +1 and p falling (0.2 vs 0.5, KL 0.19): against the push, so inside
    loss, stats = kl(_lp([0.2]), _lp([0.5]), torch.tensor([1.0]), torch.ones(1, 1), **kw)
    assert loss.item() == pytest.approx(-0.4 * math.log(0.2)) and stats["pg_clipfrac"] == 0.0


# --------------------------------------------------------------------------------------- peers' formulas
# Re-typed from verl-project/verl@1dda039 verl/trainer/ppo/core_algos.py and huggingface/trl@f2cd577
# trl/trainer/grpo_trainer.py (`_compute_loss`, loss_type="sapo"); float64, token-mean where the peer aggregates
# by `loss_agg_mode`.
def _mm(x, m):
    return (x * m).sum() / m.sum()


def _verl_token_mean(L, M):
    return (L * M).sum() / M.sum()


def verl_clip_cov(old, lp, A, M, lo, hi, ratio_, lb, ub):
    lr = lp - old
    r = torch.exp(lr)
    pg1, pg2 = -A * r, -A * torch.clamp(r, 1 - lo, 1 + hi)
    clip_by_origin = (pg2 > pg1) & (M > 0)
    cov = (A - _mm(A, M)) * (lp - _mm(lp.detach(), M))
    cov[M == 0] = -torch.inf
    cov[clip_by_origin] = -torch.inf
    clip_num = max(int(ratio_ * M.sum().item()), 1)
    idx = torch.nonzero((cov < ub) & (cov > lb) & (M > 0))
    if len(idx) > 0:
        perm = torch.randperm(len(idx))
        idx = idx[perm[: min(clip_num, len(idx))]]
    corr = torch.ones_like(A)
    corr[idx[:, 0], idx[:, 1]] = 0
    return _verl_token_mean(torch.maximum(pg1, pg2) * corr, M)


def verl_kl_cov(old, lp, A, M, ratio_, coef):
    lr = lp - old
    r = torch.exp(lr)
    pg = -A * r
    pg_kl = -A * r + coef * lr.abs()
    valid_idx = torch.nonzero((M > 0).reshape(-1), as_tuple=True)[0]
    a = A[M > 0].detach().reshape(-1)
    lps = lp[M > 0].detach().reshape(-1)
    cov = (a - a.mean()) * (lps - lps.mean())
    k = max(1, int(len(cov) * ratio_))
    top = valid_idx[torch.topk(cov, k, largest=True).indices]
    pg = pg.clone()
    pg[top // A.shape[-1], top % A.shape[-1]] = pg_kl[top // A.shape[-1], top % A.shape[-1]]
    return _verl_token_mean(pg, M)


def verl_geo_mean(old, lp, A, M, lo, hi):
    lr = lp - old
    s = torch.sign(A)
    lrc = torch.clamp(lr, -lo, hi)
    lr_min = s * torch.minimum(s * lr, s * lrc)
    n = M.sum(-1)
    ratio = torch.exp((lr_min * M).sum(-1) / (n + 1e-8))
    adv = (A * M).sum(-1) / (n + 1e-8)
    return torch.mean(-adv * ratio)


def trl_sapo(old, lp, A, M, t_pos, t_neg):
    coef_1 = torch.exp(lp - old)
    T = torch.where(A > 0, t_pos, t_neg)
    L = -(torch.sigmoid(T * (coef_1 - 1)) * 4 / T) * A
    return ((L * M).sum(-1) / M.sum(-1).clamp(min=1)).mean()


def verl_dppo(old, lp, A, M, lo, hi, C, kind):
    r = torch.exp(torch.clamp(lp - old, -20, 20))
    tr = torch.clamp(r, max=C).detach()
    p, p0 = torch.exp(lp), torch.exp(old)
    if kind == "tv":
        valid = torch.where(A > 0, (p - p0) <= hi, (p - p0) >= -lo)
    else:
        bkl = p0 * (old - lp) + (1 - p0) * torch.log((1 - p0 + 1e-8) / (1 - p + 1e-8))
        valid = torch.where(A > 0, (bkl <= hi) | (p <= p0), (bkl <= lo) | (p >= p0))
    valid = valid.float().detach()
    return _verl_token_mean(-A * tr * lp * valid, M)


def _random_batch(seed: int):
    g = torch.Generator().manual_seed(seed)
    B, T = 6, 7
    old = -torch.rand(B, T, generator=g, dtype=torch.float64) * 3
    lp = old + torch.randn(B, T, generator=g, dtype=torch.float64) * 0.3
    lp = lp.clamp(max=-1e-3)  # probabilities below 1
    A = torch.randn(B, generator=g, dtype=torch.float64)
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    M = (torch.arange(T) < lengths[:, None]).to(torch.float64)
    return old, lp, A, M


@pytest.mark.parametrize("seed", range(5))
def test_each_loss_equals_its_peers_formula(seed):
    """Value and gradient equal to 1e-6 on the same random inputs (ragged masks, both signs of A)."""
    old, lp, A, M = _random_batch(seed)
    A2 = A[:, None].expand_as(lp)
    cases = {
        "clip_cov": (
            dict(
                clip_ratio_low=0.2, clip_ratio_high=0.28, clip_cov_ratio=0.1, clip_cov_lb=0.0, clip_cov_ub=5.0
            ),
            lambda x: verl_clip_cov(old, x, A2, M, 0.2, 0.28, 0.1, 0.0, 5.0),
        ),
        "kl_cov": (
            dict(kl_cov_ratio=0.1, ppo_kl_coef=0.1),
            lambda x: verl_kl_cov(old, x, A2, M, 0.1, 0.1),
        ),
        "geo_mean": (
            dict(clip_ratio_low=0.4, clip_ratio_high=0.4),
            lambda x: verl_geo_mean(old, x, A2, M, 0.4, 0.4),
        ),
        "sapo": (dict(tau_pos=1.0, tau_neg=1.05), lambda x: trl_sapo(old, x, A2, M, 1.0, 1.05)),
        "dppo_tv": (
            dict(clip_ratio_low=0.15, clip_ratio_high=0.15, clip_ratio_c=3.0),
            lambda x: verl_dppo(old, x, A2, M, 0.15, 0.15, 3.0, "tv"),
        ),
        "dppo_kl": (
            dict(clip_ratio_low=0.05, clip_ratio_high=0.05, clip_ratio_c=3.0),
            lambda x: verl_dppo(old, x, A2, M, 0.05, 0.05, 3.0, "kl"),
        ),
    }
    for name, (kw, peer) in cases.items():
        ours_lp = lp.clone().requires_grad_()
        torch.manual_seed(seed)  # clip_cov's random choice: the same draw from torch's global generator
        ours, _ = get_policy_loss(name)(ours_lp, old, A, M, **kw)
        ours.backward()
        peer_lp = lp.clone().requires_grad_()
        torch.manual_seed(seed)
        theirs = peer(peer_lp)
        theirs.backward()
        assert ours.item() == pytest.approx(theirs.item(), abs=1e-6), name
        assert torch.allclose(ours_lp.grad, peer_lp.grad, atol=1e-6), name
        assert ours_lp.grad.abs().sum() > 0, name  # the inputs exercise the loss


def test_the_random_inputs_reach_every_branch():
    """The peer comparison above is not vacuous: its inputs clip, detach, penalise and leave the trust region."""
    hits = {"clip": 0, "cov": 0, "kl": 0, "tv_out": 0, "bkl_out": 0}
    for seed in range(5):
        old, lp, A, M = _random_batch(seed)
        torch.manual_seed(seed)
        _, s = get_policy_loss("clip_cov")(lp, old, A, M, clip_cov_ratio=0.1, clip_cov_lb=0.0)
        hits["clip"] += s["pg_clipfrac"] > 0
        hits["cov"] += s["pg_cov_clipfrac"] > 0
        _, s = get_policy_loss("kl_cov")(lp, old, A, M, kl_cov_ratio=0.1)
        hits["kl"] += s["pg_cov_klfrac"] > 0
        _, s = get_policy_loss("dppo_tv")(lp, old, A, M, clip_ratio_low=0.15, clip_ratio_high=0.15)
        hits["tv_out"] += s["pg_clipfrac"] > 0
        _, s = get_policy_loss("dppo_kl")(lp, old, A, M, clip_ratio_low=0.05, clip_ratio_high=0.05)
        hits["bkl_out"] += s["pg_clipfrac"] > 0
    assert all(v > 0 for v in hits.values()), hits


# --------------------------------------------------------------------------------- config and the actor
def test_hyperparameters_come_from_the_config_by_name():
    cfg = load_config(
        None,
        [
            "algorithm.policy_loss.loss_mode=sapo",
            "algorithm.policy_loss.tau_neg=2.0",
            "algorithm.policy_loss.clip_cov_ratio=0.01",
        ],
    ).algorithm.policy_loss
    assert loss_hyperparameters(get_policy_loss("sapo"), cfg) == {"tau_pos": 1.0, "tau_neg": 2.0}
    assert loss_hyperparameters(get_policy_loss("clip_cov"), cfg) == {
        "clip_cov_ratio": 0.01,
        "clip_cov_lb": 1.0,
        "clip_cov_ub": 5.0,
    }
    assert loss_hyperparameters(get_policy_loss("vanilla"), cfg) == {}
    assert set(NEW) <= set(POLICY_LOSSES)


@pytest.mark.parametrize(
    "override,message",
    [
        ("algorithm.policy_loss.tau_neg=0", "algorithm.policy_loss.tau_neg=0.0 must be a finite number > 0"),
        ("algorithm.policy_loss.clip_cov_ratio=2", "clip_cov_ratio=2.0 must be a finite number > 0 and <= 1"),
        ("algorithm.policy_loss.clip_cov_lb=6", "clip_cov_lb=6.0 must be below clip_cov_ub=5.0"),
        ("algorithm.policy_loss.ppo_kl_coef=-1", "ppo_kl_coef=-1.0 must be a finite number >= 0"),
    ],
)
def test_bad_hyperparameters_are_config_errors(override, message):
    with pytest.raises(ConfigError, match=message.replace(".", r"\.").replace("+", r"\+")):
        load_config(None, [override])


@pytest.mark.parametrize("name", NEW)
def test_each_loss_trains_the_real_actor(tmp_path, name):
    from dapo_rl.actor import Actor, TrainBatch
    from dapo_rl.config import ActorConfig, AlgorithmConfig
    from dapo_rl.models.tiny import save_tiny_checkpoint

    save_tiny_checkpoint(tmp_path, seed=2)
    actor = Actor(
        str(tmp_path),
        ActorConfig(ppo_micro_batch_size=2, ppo_mini_batch_size=2, lr=1e-3),
        AlgorithmConfig(
            policy_loss=PolicyLossConfig(
                loss_mode=name, clip_cov_ratio=0.5, clip_cov_lb=0.0, kl_cov_ratio=0.5
            )
        ),
    )
    assert actor.policy_loss_params == loss_hyperparameters(POLICY_LOSSES[name], actor.algo.policy_loss)
    batch = TrainBatch.build(
        [[1, 2, 3]] * 4,
        [[4, 5], [6], [7, 8, 9], [10]],
        torch.tensor([1.0, -1.0, 0.5, -0.5]),
        torch.ones(4),
        257,
    )
    before = [p.detach().clone() for p in actor.model.parameters()]
    metrics = actor.update(batch)
    assert math.isfinite(metrics["actor/pg_loss"]) and metrics["actor/grad_norm"] > 0
    assert any(not torch.equal(a, b.detach()) for a, b in zip(before, actor.model.parameters()))
    if name == "clip_cov":
        assert metrics["actor/pg_cov_clipfrac"] > 0
    if name == "kl_cov":
        assert metrics["actor/pg_cov_klfrac"] > 0


def test_losses_that_read_the_clip_bounds_as_other_bounds_warn_on_dapos_values():
    from dapo_rl.algo.policy_loss_variants import clip_bounds_warning

    msg = clip_bounds_warning("dppo_kl", 0.2, 0.28)
    assert "binary-KL bounds" in msg and "algorithm.clip_ratio_low=0.05 algorithm.clip_ratio_high=0.05" in msg
    assert "e^-0.4" in clip_bounds_warning("geo_mean", 0.2, 0.28)
    assert clip_bounds_warning("geo_mean", 0.4, 0.4) is None
    # verl's default 0.2 / 0.2 and GSPO (its paper's bounds are three orders of magnitude smaller)
    assert "PPO's (verl's default) token-ratio bounds 0.2 / 0.2" in clip_bounds_warning("dppo_tv", 0.2, 0.2)
    msg = clip_bounds_warning("gspo", 0.2, 0.28)
    assert "algorithm.clip_ratio_low=0.0003 algorithm.clip_ratio_high=0.0004" in msg
    assert clip_bounds_warning("gspo", 3e-4, 4e-4) is None
    assert (
        clip_bounds_warning("vanilla", 0.2, 0.28) is None and clip_bounds_warning("sapo", 0.2, 0.28) is None
    )
