"""Policy losses with published results on DAPO-style math RL, beside DAPO's own (`policy_loss.py`).

Each is one registered function (`algorithm.policy_loss.loss_mode=<name>`), called as `compute_policy_loss` is; its
own hyperparameters are keyword arguments whose names are fields of `PolicyLossConfig` (verl's names), which the
actor passes (`loss_hyperparameters`).

| name       | paper                                              | what changes against DAPO's clipped ratio            |
|------------|----------------------------------------------------|------------------------------------------------------|
| `clip_cov` | Cui et al. 2025, arXiv 2505.22617, Clip-Cov        | a few high-covariance tokens drop out of the loss   |
| `kl_cov`   | the same paper, KL-Cov                             | no clip; a |log-ratio| penalty on the top-cov tokens |
| `geo_mean` | GMPO, Zhao et al. 2025, arXiv 2507.20673           | geometric mean of the token ratios, clipped in log   |
| `sapo`     | SAPO, Gao et al. 2025, arXiv 2511.20347            | a sigmoid gate on the ratio instead of the hard clip |
| `dppo_tv`  | DPPO, arXiv 2602.04879 (total-variation region)    | tokens leave when p - p_old leaves the trust region  |
| `dppo_kl`  | the same, binary-KL region                         | the same with the binary KL of p and p_old           |

Peer formulas these were checked against (tests/test_policy_loss_variants.py re-types them): verl
`verl/trainer/ppo/core_algos.py` (`compute_policy_loss_clip_cov`, `_kl_cov`, `_geo_mean`, `_sapo`, `_dppo_*`;
verl-project/verl@1dda039) and TRL `GRPOTrainer._compute_loss` (`loss_type="sapo"`; huggingface/trl@f2cd577). Where
they differ from verl: the log-ratio is clamped to [-20, 20] before `exp` in every loss here (verl does so in
`sapo` and `dppo_*` only), which changes nothing for log-ratios inside that range.
"""

from __future__ import annotations

import torch

from dapo_rl.algo.masked import masked_mean, masked_sum
from dapo_rl.algo.policy_loss import (
    LOG_RATIO_CLAMP,
    _check_shapes,
    agg_loss,
    policy_loss_stats,
    register_policy_loss,
)

__all__ = [
    "clip_bounds_warning",
    "compute_policy_loss_clip_cov",
    "compute_policy_loss_dppo_kl",
    "compute_policy_loss_dppo_tv",
    "compute_policy_loss_geo_mean",
    "compute_policy_loss_kl_cov",
    "compute_policy_loss_sapo",
]


PAPER_BOUNDS: dict[str, tuple[float, float, str]] = {
    "geo_mean": (0.4, 0.4, "log-ratio bounds (GMPO: e^-0.4, e^0.4)"),
    "dppo_tv": (0.15, 0.15, "bounds on p - p_old (DPPO's TV setting)"),
    "dppo_kl": (0.05, 0.05, "binary-KL bounds (DPPO's KL setting)"),
    "gspo": (3e-4, 4e-4, "bounds on the length-normalised sequence ratio"),
}
"""The losses that read `algorithm.clip_ratio_low|high` as bounds of another quantity (or, for GSPO, of a ratio
whose spread is far smaller than a token's), with their papers' values."""

TOKEN_RATIO_BOUNDS = {(0.2, 0.28): "DAPO's", (0.2, 0.2): "PPO's (verl's default)"}
"""Token-ratio clip bounds a `PAPER_BOUNDS` loss should not be left with: DAPO's defaults and PPO's/verl's."""


def clip_bounds_warning(loss_mode: str, clip_ratio_low: float, clip_ratio_high: float) -> str | None:
    """A warning when a loss of `PAPER_BOUNDS` runs with token-ratio bounds (`TOKEN_RATIO_BOUNDS`: DAPO's 0.2 / 0.28,
    the defaults, or PPO's 0.2 / 0.2), which it would read as something else; None otherwise."""
    whose = TOKEN_RATIO_BOUNDS.get((clip_ratio_low, clip_ratio_high))
    if loss_mode not in PAPER_BOUNDS or whose is None:
        return None
    low, high, what = PAPER_BOUNDS[loss_mode]
    return (
        f"algorithm.policy_loss.loss_mode={loss_mode} reads algorithm.clip_ratio_low|high as its {what}, and they "
        f"are {whose} token-ratio bounds {clip_ratio_low} / {clip_ratio_high}; the paper's are {low:g} / {high:g} "
        f"(set algorithm.clip_ratio_low={low:g} algorithm.clip_ratio_high={high:g})"
    )


def _log_ratio(log_prob: torch.Tensor, old_log_prob: torch.Tensor) -> torch.Tensor:
    """`clamp(log_prob - sg(old_log_prob), -20, 20)`, `(B, T)`, differentiable in `log_prob`."""
    return torch.clamp(log_prob - old_log_prob.detach(), -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)


def _weigh(pg_losses: torch.Tensor, rollout_is_weights: torch.Tensor | None) -> torch.Tensor:
    """Multiply by the rollout correction's `(B, T)` IS weights (constants), if any."""
    if rollout_is_weights is None:
        return pg_losses
    if rollout_is_weights.shape != pg_losses.shape:
        raise ValueError(
            f"rollout_is_weights must have shape {tuple(pg_losses.shape)}, got {tuple(rollout_is_weights.shape)}"
        )
    return pg_losses * rollout_is_weights.detach().to(pg_losses.dtype)


def _token_covariance(A: torch.Tensor, log_prob: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Cov(A, log pi) per token (Cui et al. 2025, Eq. 9's summand): `(A - mean A) * (log pi - mean log pi)`, the
    means over the batch's masked tokens; `(B, T)`, no gradient."""
    lp = log_prob.detach()
    return (A - masked_mean(A, mask)) * (lp - masked_mean(lp, mask))


@register_policy_loss("clip_cov")
def compute_policy_loss_clip_cov(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.28,
    clip_ratio_c: float = 3.0,
    loss_agg_mode: str = "token-mean",
    global_num_tokens: int | float | torch.Tensor | None = None,
    global_batch_size: int | float | torch.Tensor | None = None,
    rollout_is_weights: torch.Tensor | None = None,
    loss_scale_factor: float | None = None,
    clip_cov_ratio: float = 0.0002,
    clip_cov_lb: float = 1.0,
    clip_cov_ub: float = 5.0,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Clip-Cov (Cui et al. 2025, "The Entropy Mechanism of RL for Reasoning LMs", arXiv 2505.22617, Sec. 4.2):
    the PPO clipped surrogate, except that a few tokens whose covariance of advantage and log-probability is high
    (and positive) drop out of the loss (their term is multiplied by 0), the tokens that drive entropy down:

        Cov_{i,t} = (A_{i,t} - mean A) * (log pi(o_{i,t}) - mean log pi)      (means over the batch's tokens)
        I = a random ``max(floor(clip_cov_ratio * N), 1)`` of the unclipped tokens with lb < Cov < ub
        loss_{i,t} = max(-A r, -A clip(r, 1 - eps_low, 1 + eps_high)) * (0 if (i,t) in I else 1)

    aggregated by `loss_agg_mode`. No dual clip (`clip_ratio_c` unused), as verl's `clip_cov`. The random choice
    uses `generator` (None: torch's global generator, which the trainer seeds).

    Args:
        clip_cov_ratio: the share of the batch's tokens detached (the paper's r; verl's default 2e-4).
        clip_cov_lb: lower covariance bound omega_low (verl: 1.0).
        clip_cov_ub: upper covariance bound omega_high (verl: 5.0).
        (others as `compute_policy_loss`.)

    Returns:
        `(loss, stats)`: the stats of `compute_policy_loss` plus `pg_cov_clipfrac`, the masked share of detached
        tokens.

    Raises:
        ValueError: mismatched shapes, an unknown `loss_agg_mode`.
    """
    A = _check_shapes(log_prob, old_log_prob, advantages, response_mask)
    mask = response_mask.to(torch.bool)
    ratio = torch.exp(_log_ratio(log_prob, old_log_prob))
    pg_losses1 = -A * ratio
    pg_losses2 = -A * torch.clamp(ratio, 1.0 - clip_ratio_low, 1.0 + clip_ratio_high)
    with torch.no_grad():
        clipped = (pg_losses2 > pg_losses1) & mask  # the PPO clip already zeroes their gradient
        cov = _token_covariance(A, log_prob, mask)
        candidates = torch.nonzero(mask & ~clipped & (cov > clip_cov_lb) & (cov < clip_cov_ub))
        n_detach = max(int(clip_cov_ratio * float(mask.sum())), 1)
        pick = candidates[torch.randperm(len(candidates), generator=generator)[:n_detach]]
        keep = torch.ones_like(A)
        keep[pick[:, 0], pick[:, 1]] = 0.0
    pg_losses = _weigh(torch.maximum(pg_losses1, pg_losses2) * keep, rollout_is_weights)
    loss = agg_loss(pg_losses, mask, loss_agg_mode, global_num_tokens, global_batch_size, loss_scale_factor)
    with torch.no_grad():
        stats = policy_loss_stats(
            log_prob,
            old_log_prob,
            mask,
            (A < 0) & (ratio < 1 - clip_ratio_low),
            (A > 0) & (ratio > 1 + clip_ratio_high),
        )
        stats["pg_cov_clipfrac"] = masked_mean((keep == 0).to(log_prob.dtype), mask).item()
    return loss, stats


@register_policy_loss("kl_cov")
def compute_policy_loss_kl_cov(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.28,
    clip_ratio_c: float = 3.0,
    loss_agg_mode: str = "token-mean",
    global_num_tokens: int | float | torch.Tensor | None = None,
    global_batch_size: int | float | torch.Tensor | None = None,
    rollout_is_weights: torch.Tensor | None = None,
    loss_scale_factor: float | None = None,
    kl_cov_ratio: float = 0.0002,
    ppo_kl_coef: float = 0.1,
) -> tuple[torch.Tensor, dict[str, float]]:
    """KL-Cov (Cui et al. 2025, arXiv 2505.22617, Sec. 4.2): no clip at all; the tokens of the highest covariance
    of advantage and log-probability get a penalty on the size of their log-ratio:

        loss_{i,t} = -A r + ppo_kl_coef * |log r|   if (i,t) is among the top max(floor(kl_cov_ratio * N), 1)
                                                    tokens by Cov_{i,t} (see `compute_policy_loss_clip_cov`)
                   = -A r                            otherwise

    aggregated by `loss_agg_mode`. `clip_ratio_*` are unused (verl's `kl_cov` clips nothing); the clip-fraction
    stats count where DAPO's clip *would* bind, for comparison.

    Args:
        kl_cov_ratio: the share of tokens penalised (the paper's k; verl's default 2e-4), at least one token.
        ppo_kl_coef: the penalty's coefficient (verl's config default 0.1; the paper's recipes 1.0).
        (others as `compute_policy_loss`.)

    Returns:
        `(loss, stats)`: the stats of `compute_policy_loss` plus `pg_cov_klfrac`, the masked share of penalised
        tokens.

    Raises:
        ValueError: mismatched shapes, an unknown `loss_agg_mode`.
    """
    A = _check_shapes(log_prob, old_log_prob, advantages, response_mask)
    mask = response_mask.to(torch.bool)
    log_ratio = _log_ratio(log_prob, old_log_prob)
    ratio = torch.exp(log_ratio)
    pg_losses = -A * ratio
    with torch.no_grad():
        penalised = torch.zeros_like(mask)
        n_valid = int(mask.sum())
        if n_valid:
            cov = _token_covariance(A, log_prob, mask)[mask]  # (N,) in row-major order of the masked tokens
            k = max(int(n_valid * kl_cov_ratio), 1)
            top = torch.topk(cov, k, largest=True).indices
            flat = torch.zeros(n_valid, dtype=torch.bool, device=mask.device)
            flat[top] = True
            penalised[mask] = flat
    pg_losses = torch.where(penalised, pg_losses + ppo_kl_coef * log_ratio.abs(), pg_losses)
    pg_losses = _weigh(pg_losses, rollout_is_weights)
    loss = agg_loss(pg_losses, mask, loss_agg_mode, global_num_tokens, global_batch_size, loss_scale_factor)
    with torch.no_grad():
        stats = policy_loss_stats(
            log_prob,
            old_log_prob,
            mask,
            (A < 0) & (ratio < 1 - clip_ratio_low),
            (A > 0) & (ratio > 1 + clip_ratio_high),
        )
        stats["pg_cov_klfrac"] = masked_mean(penalised.to(log_prob.dtype), mask).item()
    return loss, stats


@register_policy_loss("geo_mean")
def compute_policy_loss_geo_mean(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    clip_ratio_low: float = 0.4,
    clip_ratio_high: float = 0.4,
    clip_ratio_c: float = 3.0,
    loss_agg_mode: str = "token-mean",
    global_num_tokens: int | float | torch.Tensor | None = None,
    global_batch_size: int | float | torch.Tensor | None = None,
    rollout_is_weights: torch.Tensor | None = None,
    loss_scale_factor: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """GMPO (Zhao et al. 2025, "Geometric-Mean Policy Optimization", arXiv 2507.20673, Eq. 4): the geometric mean of
    the token ratios of a response, each clipped in log space to [-eps_low, eps_high] (the paper: (e^-0.4, e^0.4),
    so `algorithm.clip_ratio_low=0.4`, `clip_ratio_high=0.4` -- log-space bounds here, as verl's `geo_mean`):

        l_{i,t} = sgn(A_i) * min( sgn(A_i) log r_{i,t}, sgn(A_i) clip(log r_{i,t}, -eps_low, eps_high) )
        loss_i  = -A_i * exp( (1/|o_i|) sum_t l_{i,t} ),         loss = (1/B) sum_i loss_i

    The sequence mean is over all B rows whatever `loss_agg_mode` says (`global_batch_size` for micro-batches);
    a per-token advantage enters as its mean over the response. With `rollout_is_weights` the loss of a response is
    multiplied by their geometric mean (verl's form). `clip_ratio_c` and `loss_scale_factor` are unused.

    Returns:
        `(loss, stats)` as `compute_policy_loss`: `pg_clipfrac_upper|lower` count tokens whose clipped log-ratio is
        the one taken, log r > eps_high with A > 0 | log r < -eps_low with A < 0 (verl's `geo_mean` counts every
        token the clamp moved, also where the min takes the unclipped one).

    Raises:
        ValueError: mismatched shapes.
    """
    A = _check_shapes(log_prob, old_log_prob, advantages, response_mask)
    mask = response_mask.to(torch.bool)
    log_ratio = _log_ratio(log_prob, old_log_prob)
    sign = torch.sign(A)
    clipped_log_ratio = torch.clamp(log_ratio, -clip_ratio_low, clip_ratio_high)
    kept_log_ratio = sign * torch.minimum(sign * log_ratio, sign * clipped_log_ratio)
    lengths = mask.sum(-1).clamp(min=1).to(log_prob.dtype)
    seq_ratio = torch.exp(masked_sum(kept_log_ratio, mask, dim=-1) / lengths)  # (B,)
    seq_adv = masked_sum(A, mask, dim=-1) / lengths  # (B,)
    seq_losses = -seq_adv * seq_ratio
    if rollout_is_weights is not None:
        if rollout_is_weights.shape != log_prob.shape:
            raise ValueError(
                f"rollout_is_weights must have shape {tuple(log_prob.shape)}, got {tuple(rollout_is_weights.shape)}"
            )
        w = rollout_is_weights.detach().to(log_prob.dtype)
        seq_losses = seq_losses * torch.exp(masked_sum(torch.log(w + 1e-10), mask, dim=-1) / lengths)
    num_seqs = max(log_prob.shape[0], 1) if global_batch_size is None else global_batch_size
    loss = seq_losses.sum() / num_seqs
    with torch.no_grad():
        # where the clipped log-ratio is the one taken (verl counts every moved one, binding or not)
        lr = log_ratio.detach()
        stats = policy_loss_stats(
            log_prob, old_log_prob, mask, (A < 0) & (lr < -clip_ratio_low), (A > 0) & (lr > clip_ratio_high)
        )
    return loss, stats


@register_policy_loss("sapo")
def compute_policy_loss_sapo(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.28,
    clip_ratio_c: float = 3.0,
    loss_agg_mode: str = "token-mean",
    global_num_tokens: int | float | torch.Tensor | None = None,
    global_batch_size: int | float | torch.Tensor | None = None,
    rollout_is_weights: torch.Tensor | None = None,
    loss_scale_factor: float | None = None,
    tau_pos: float = 1.0,
    tau_neg: float = 1.05,
) -> tuple[torch.Tensor, dict[str, float]]:
    """SAPO (Gao et al. 2025, "Soft Adaptive Policy Optimization", arXiv 2511.20347): a smooth gate of the ratio in
    place of the hard clip, steeper for negative advantages:

        f(r) = sigmoid(tau (r - 1)) * 4 / tau,  tau = tau_pos if A > 0 else tau_neg
        loss_{i,t} = -f(r_{i,t}) A_{i,t},       loss = (1/B) sum_i (1/|o_i|) sum_t loss_{i,t}

    f(1) = 2 / tau and f'(r) = 4 sigmoid (1 - sigmoid), which is 1 at r = 1 (on-policy the gradient is the policy
    gradient) and decays as r leaves 1, so far-off tokens fade instead of being cut. Aggregated per sequence
    (`seq-mean-token-mean`, the paper's objective; verl and TRL force it too) whatever `loss_agg_mode` says;
    `clip_ratio_*` and `loss_scale_factor` are unused (the clip-fraction stats are 0).

    Args:
        tau_pos: the gate's temperature for A > 0 (the paper, verl and TRL: 1.0).
        tau_neg: for A <= 0 (1.05).
        (others as `compute_policy_loss`.)

    Raises:
        ValueError: mismatched shapes; a temperature that is not > 0.
    """
    if not (tau_pos > 0 and tau_neg > 0):
        raise ValueError(f"tau_pos and tau_neg must be > 0, got {tau_pos} and {tau_neg}")
    A = _check_shapes(log_prob, old_log_prob, advantages, response_mask)
    mask = response_mask.to(torch.bool)
    ratio = torch.exp(_log_ratio(log_prob, old_log_prob))
    tau = torch.full_like(A, tau_neg).masked_fill(
        A > 0, tau_pos
    )  # in A's dtype (a float32 1.05 is off by 3e-8)
    gate = torch.sigmoid(tau * (ratio - 1.0)) * (4.0 / tau)
    pg_losses = _weigh(-gate * A, rollout_is_weights)
    loss = agg_loss(pg_losses, mask, "seq-mean-token-mean", global_batch_size=global_batch_size)
    with torch.no_grad():
        never = torch.zeros_like(mask)
        stats = policy_loss_stats(log_prob, old_log_prob, mask, never, never)
    return loss, stats


def _dppo(
    divergence: str,
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    clip_ratio_low: float,
    clip_ratio_high: float,
    clip_ratio_c: float,
    loss_agg_mode: str,
    global_num_tokens,
    global_batch_size,
    rollout_is_weights,
    loss_scale_factor,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The DPPO loss with a `tv` or `kl` trust region (see `compute_policy_loss_dppo_tv`), called with the
    registered function's arguments by name (`**locals()`)."""
    A = _check_shapes(log_prob, old_log_prob, advantages, response_mask)
    if not clip_ratio_c > 1.0:
        raise ValueError(f"clip_ratio_c must be > 1, got {clip_ratio_c}")
    mask = response_mask.to(torch.bool)
    old = old_log_prob.detach()
    ratio = torch.exp(_log_ratio(log_prob, old))
    with torch.no_grad():
        p, p_old = torch.exp(log_prob.detach()), torch.exp(old)
        if divergence == "tv":
            inside = torch.where(A > 0, p - p_old <= clip_ratio_high, p - p_old >= -clip_ratio_low)
        else:  # the binary KL of Bernoulli(p_old) and Bernoulli(p): the sampled token against all the others
            bkl = p_old * (old - log_prob.detach()) + (1 - p_old) * torch.log(
                (1 - p_old + 1e-8) / (1 - p + 1e-8)
            )
            inside = torch.where(
                A > 0, (bkl <= clip_ratio_high) | (p <= p_old), (bkl <= clip_ratio_low) | (p >= p_old)
            )
        weight = torch.clamp(ratio.detach(), max=clip_ratio_c)
    pg_losses = -A * weight * log_prob * inside.to(log_prob.dtype)
    pg_losses = _weigh(pg_losses, rollout_is_weights)
    loss = agg_loss(pg_losses, mask, loss_agg_mode, global_num_tokens, global_batch_size, loss_scale_factor)
    with torch.no_grad():
        outside = ~inside
        stats = policy_loss_stats(log_prob, old, mask, outside & (A <= 0), outside & (A > 0))
        stats["pg_clipfrac_ratio_c"] = masked_mean(
            ((ratio > clip_ratio_c) & inside).to(log_prob.dtype), mask
        ).item()
    return loss, stats


@register_policy_loss("dppo_tv")
def compute_policy_loss_dppo_tv(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    clip_ratio_low: float = 0.15,
    clip_ratio_high: float = 0.15,
    clip_ratio_c: float = 3.0,
    loss_agg_mode: str = "token-mean",
    global_num_tokens: int | float | torch.Tensor | None = None,
    global_batch_size: int | float | torch.Tensor | None = None,
    rollout_is_weights: torch.Tensor | None = None,
    loss_scale_factor: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """DPPO (arXiv 2602.04879, "Divergence PPO"): a trust region on a direct estimate of the divergence between
    pi_theta and pi_old, not on the ratio. A token stays in the loss while moving the sampled token's probability
    p = pi_theta(o_t) away from p_old = pi_old(o_t) keeps the divergence inside the region in the direction its
    advantage pushes (total variation of the two distributions' sampled-token mass, |p - p_old|):

        inside_{i,t} = (p - p_old <= eps_high)  if A > 0  else  (p - p_old >= -eps_low)
        loss_{i,t}  = -A * sg(min(r, c)) * log pi_theta(o_t) * inside_{i,t}

    (gradient: -A min(r, c) grad log pi = the PPO surrogate's, truncated at c). Aggregated by `loss_agg_mode`.
    The bounds are `algorithm.clip_ratio_low|high`, here *probability* differences (verl's `dppo_tv` reuses them
    the same way; its example and the paper's TV setting: 0.15 both), and c is `algorithm.clip_ratio_c` (verl's
    default 3.0 applies there too, and binds rarely; verl's DPPO example and the paper's Sec. 5.4 take a large c,
    10000: set `algorithm.clip_ratio_c` for that). prime-rl's default loss uses the TV region (0.2 / 0.2) against
    the sampler's log-probs without truncation and adds 1e-3 (log r)^2; `bypass_mode=true` gives its pi_old here.

    Returns:
        `(loss, stats)` as `compute_policy_loss`: `pg_clipfrac_upper|lower` count tokens outside the region with
        A > 0 | A <= 0; `pg_clipfrac_ratio_c` those inside whose ratio exceeded c.

    Raises:
        ValueError: mismatched shapes, `clip_ratio_c <= 1`, an unknown `loss_agg_mode`.
    """
    return _dppo("tv", **locals())


@register_policy_loss("dppo_kl")
def compute_policy_loss_dppo_kl(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    clip_ratio_low: float = 0.05,
    clip_ratio_high: float = 0.05,
    clip_ratio_c: float = 3.0,
    loss_agg_mode: str = "token-mean",
    global_num_tokens: int | float | torch.Tensor | None = None,
    global_batch_size: int | float | torch.Tensor | None = None,
    rollout_is_weights: torch.Tensor | None = None,
    loss_scale_factor: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """DPPO with a binary-KL trust region (arXiv 2602.04879): as `compute_policy_loss_dppo_tv`, with the KL of the
    Bernoulli distributions "the sampled token or another" under pi_old and pi_theta,

        bkl = p_old log(p_old / p) + (1 - p_old) log((1 - p_old) / (1 - p))
        inside_{i,t} = (bkl <= eps_high or p <= p_old)  if A > 0  else  (bkl <= eps_low or p >= p_old)

    (a token moving against its advantage's push always stays in). `algorithm.clip_ratio_low|high` are the KL
    bounds (verl's example and the paper's KL setting: 0.05 both).

    Raises:
        ValueError: mismatched shapes, `clip_ratio_c <= 1`, an unknown `loss_agg_mode`.
    """
    return _dppo("kl", **locals())
