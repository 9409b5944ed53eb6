"""DAPO policy loss: decoupled clip (Clip-Higher), dual-clip, and token-level aggregation.

DAPO Eq. 8-10 (with Eq. 12's token-level normalisation), for response i of a group and its token t:

    r_{i,t}(theta) = pi_theta(o_{i,t} | q, o_{i,<t}) / pi_theta_old(o_{i,t} | q, o_{i,<t})                  (Eq. 9)

    J(theta) = 1 / (sum_i |o_i|) * sum_i sum_t min( r_{i,t} A_{i,t},
                                                    clip(r_{i,t}, 1 - eps_low, 1 + eps_high) A_{i,t} )      (Eq. 10, 12)

We minimise the negated objective, so per token (names as in verl / CleanRL):

    pg_losses1 = -A * ratio
    pg_losses2 = -A * clip(ratio, 1 - clip_ratio_low, 1 + clip_ratio_high)
    clipped    = max(pg_losses1, pg_losses2)                  # = -min(r A, clip(r) A)

Dual-clip (Ye et al. 2020, "Mastering Complex Control in MOBA Games with Deep RL") bounds the loss of a token with a
negative advantage whose ratio has grown far above 1 (the PPO clip does not bound it: ``max`` picks ``-A * ratio``):

    pg_losses3 = -A * clip_ratio_c
    pg_losses  = min(clipped, pg_losses3)  if A < 0  else  clipped
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

import torch

from dapo_rl.algo.masked import masked_mean, masked_sum
from dapo_rl.algo.registry import Registry

__all__ = [
    "LOSS_AGG_MODES",
    "POLICY_LOSSES",
    "agg_loss",
    "compute_policy_loss",
    "compute_policy_loss_cispo",
    "compute_policy_loss_gspo",
    "get_policy_loss",
    "loss_hyperparameters",
    "policy_loss_stats",
    "register_policy_loss",
]

PolicyLoss = Callable[..., tuple[torch.Tensor, dict[str, float]]]
POLICY_LOSSES: Registry[PolicyLoss] = Registry("policy loss")
"""Policy losses by name (`algorithm.policy_loss.loss_mode`), called as ``compute_policy_loss`` is and returning
``(loss, stats)`` with its stats keys (verl's `register_policy_loss` idea)."""
register_policy_loss = POLICY_LOSSES.register
"""Decorator: `@register_policy_loss("name")` makes a loss selectable as `algorithm.policy_loss.loss_mode=name`."""
get_policy_loss = POLICY_LOSSES.lookup
"""The loss registered under a name (ValueError for an unknown one)."""


def loss_hyperparameters(loss: PolicyLoss, values: object) -> dict:
    """The keyword arguments a registered loss takes beyond `compute_policy_loss`'s, read from `values` (the run's
    `PolicyLossConfig`): every parameter of `loss` that `values` has an attribute of the same name for
    (`clip_cov_ratio`, `tau_pos`, ...). A loss declares a hyperparameter by naming it as a keyword argument with
    its paper's default; the config field of that name sets it.
    """
    names = inspect.signature(loss).parameters
    return {k: getattr(values, k) for k in names if k != "loss_mode" and hasattr(values, k)}


LOSS_AGG_MODES: tuple[str, ...] = (
    "token-mean",
    "seq-mean-token-mean",
    "seq-mean-token-sum",
    "seq-mean-token-sum-norm",
)
"""Valid ``loss_agg_mode`` values; ``token-mean`` is DAPO's token-level loss (Eq. 12)."""

LOG_RATIO_CLAMP: float = 20.0
"""``log_prob - old_log_prob`` is clamped to ``[-20, 20]`` before ``exp`` so the ratio never overflows."""


def _check_positive(name: str, value: float | torch.Tensor | None) -> None:
    """Raise ValueError if a python-number ``value`` is not > 0 (tensors are not checked: no device sync)."""
    if value is not None and not isinstance(value, torch.Tensor) and not value > 0:
        raise ValueError(f"{name} must be > 0, got {value}")


def agg_loss(
    loss_mat: torch.Tensor,
    loss_mask: torch.Tensor,
    loss_agg_mode: str,
    global_num_tokens: int | float | torch.Tensor | None = None,
    global_batch_size: int | float | torch.Tensor | None = None,
    loss_scale_factor: float | None = None,
) -> torch.Tensor:
    """Aggregate a ``(B, T)`` matrix of per-token losses into a scalar.

    Modes (``m_{i,t}`` is the mask, ``|o_i| = sum_t m_{i,t}``, ``l_{i,t}`` the token loss):

    - ``token-mean`` (DAPO Eq. 12): ``sum_{i,t} m l / N`` with ``N = sum_{i,t} m`` -- every token weighs the same,
      so long responses are not down-weighted.
    - ``seq-mean-token-mean`` (GRPO): ``(1/B) sum_i [ sum_t m l / |o_i| ]`` -- each sequence weighs the same.
    - ``seq-mean-token-sum`` (Dr. GRPO-like): ``(1/B) sum_i sum_t m l``.
    - ``seq-mean-token-sum-norm`` (Dr. GRPO, Liu et al. 2025, arXiv 2503.20783, Eq. 3; verl's name):
      ``(1/B) sum_i sum_t m l / L`` with a constant ``L = loss_scale_factor`` (the generation budget, the trainer's
      `data.max_response_length`) in place of GRPO's per-response ``1/|o_i|``: no length bias either way. Without
      ``loss_scale_factor`` the micro-batch's ``T`` is used (then the normaliser depends on the split).

    A sequence with an empty mask contributes 0 (never NaN); in the ``seq-mean-*`` modes it still counts in ``B``.
    An all-empty batch gives 0 in every mode.

    Micro-batching: a mini-batch split into micro-batches for gradient accumulation should pass the *mini-batch*
    totals: ``global_num_tokens`` (``N`` of the whole mini-batch, used by ``token-mean``) and ``global_batch_size``
    (``B`` of the whole mini-batch, used by the ``seq-mean-*`` modes). The sum of the micro-batch losses then equals
    the mini-batch loss, and the accumulated gradient does not depend on how the mini-batch was split (no extra
    ``micro / mini`` scaling is needed). Each mode ignores the argument it does not use, so a caller may always pass
    both. Without them the local ``N`` / ``B`` are used.

    Args:
        loss_mat: ``(B, T)`` per-token losses, floating.
        loss_mask: ``(B, T)`` bool or 0/1; 1 on tokens that count.
        loss_agg_mode: one of ``LOSS_AGG_MODES``.
        global_num_tokens: number of masked tokens in the whole mini-batch (python number or 0-d tensor).
        global_batch_size: number of sequences in the whole mini-batch (python number or 0-d tensor).
        loss_scale_factor: the constant ``L`` of ``seq-mean-token-sum-norm`` (ignored by the other modes).

    Returns:
        0-d tensor, dtype of ``loss_mat``.

    Raises:
        ValueError: unknown ``loss_agg_mode``; ``loss_mat`` not 2-D or ``loss_mask`` of another shape; a python-number
            ``global_num_tokens`` / ``global_batch_size`` that is not > 0.
    """
    if loss_agg_mode not in LOSS_AGG_MODES:
        raise ValueError(f"unknown loss_agg_mode {loss_agg_mode!r}; valid modes: {', '.join(LOSS_AGG_MODES)}")
    if loss_mat.dim() != 2 or loss_mask.shape != loss_mat.shape:
        raise ValueError(
            f"loss_mat must be (B, T) and loss_mask the same shape, got {tuple(loss_mat.shape)} and "
            f"{tuple(loss_mask.shape)}"
        )
    _check_positive("global_num_tokens", global_num_tokens)
    _check_positive("global_batch_size", global_batch_size)
    mask = loss_mask.to(torch.bool)

    if loss_agg_mode == "token-mean":
        # DAPO Eq. 12: 1 / (sum_i |o_i|) * sum_i sum_t l_{i,t}
        num_tokens = mask.sum().clamp(min=1) if global_num_tokens is None else global_num_tokens
        return masked_sum(loss_mat, mask) / num_tokens

    num_seqs = max(loss_mat.shape[0], 1) if global_batch_size is None else global_batch_size
    seq_token_sum = masked_sum(loss_mat, mask, dim=-1)  # (B,) sum_t l_{i,t}
    if loss_agg_mode == "seq-mean-token-mean":
        seq_num_tokens = mask.sum(dim=-1).clamp(min=1)  # (B,) |o_i|, 1 for an empty sequence (its sum is 0)
        seq_losses = seq_token_sum / seq_num_tokens
    elif loss_agg_mode == "seq-mean-token-sum-norm":
        _check_positive("loss_scale_factor", loss_scale_factor)
        seq_losses = seq_token_sum / (loss_scale_factor or loss_mat.shape[-1])
    else:  # "seq-mean-token-sum"
        seq_losses = seq_token_sum
    return seq_losses.sum() / num_seqs


@register_policy_loss("vanilla")
def compute_policy_loss(
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
) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO clipped surrogate with DAPO's decoupled clip range and dual-clip, aggregated by ``loss_agg_mode``.

    See the module docstring for the equations (DAPO Eq. 9, 10, 12; dual-clip of Ye et al. 2020).
    ``ratio = exp(clamp(log_prob - old_log_prob, -20, 20))``. ``old_log_prob`` and ``advantages`` are treated as
    constants (detached).

    Args:
        log_prob: ``(B, T)`` log pi_theta of the response tokens (requires grad for training), floating.
        old_log_prob: ``(B, T)`` log pi_theta_old of the same tokens (the policy that sampled them).
        advantages: ``(B,)`` one advantage per response, broadcast over tokens, or ``(B, T)`` per token.
        response_mask: ``(B, T)`` bool or 0/1; 1 on response tokens that count in the loss.
        clip_ratio_low: eps_low, the ratio is clipped below at ``1 - clip_ratio_low`` (DAPO: 0.2). In ``[0, 1)``.
        clip_ratio_high: eps_high, the ratio is clipped above at ``1 + clip_ratio_high`` (DAPO: 0.28). ``>= 0``.
        clip_ratio_c: dual-clip constant c > 1 (verl default 3.0); ``float("inf")`` disables dual-clip.
        loss_agg_mode: ``token-mean`` (DAPO), ``seq-mean-token-mean`` (GRPO) or ``seq-mean-token-sum``.
        global_num_tokens: masked-token count of the whole mini-batch, for micro-batching (see ``agg_loss``).
        global_batch_size: sequence count of the whole mini-batch, for micro-batching (see ``agg_loss``).
        loss_scale_factor: the constant normaliser of ``seq-mean-token-sum-norm`` (see ``agg_loss``).
        rollout_is_weights: ``(B, T)`` importance weights pi_old / mu of the rollout correction
            (:func:`dapo_rl.algo.rollout_correction.compute_rollout_correction`), multiplying each token's clipped
            loss (constants); ``None`` for none.

    Returns:
        ``(loss, stats)``: ``loss`` a 0-d tensor (dtype of ``log_prob``) to minimise; ``stats`` a dict of python
        floats, each a masked token mean over this (micro-)batch:

        - ``pg_clipfrac_lower``: fraction of tokens where the lower clip bound is active (A < 0 and
          ratio < 1 - clip_ratio_low). NB: verl's ``pg_clipfrac_lower`` is the dual-clip fraction; ours is the
          lower PPO bound, and verl's meaning is ``pg_clipfrac_dual``.
        - ``pg_clipfrac_upper``: the upper bound is active (A > 0 and ratio > 1 + clip_ratio_high).
        - ``pg_clipfrac``: ``pg_clipfrac_lower + pg_clipfrac_upper`` (tokens whose PPO clip zeroes the gradient).
        - ``pg_clipfrac_dual``: A < 0 and the dual clip is active (``pg_losses3 < clipped``, i.e. ratio > c).
        - ``ppo_kl``: approximate KL(pi_old || pi_theta), the masked mean of ``old_log_prob - log_prob`` (with the
          same [-20, 20] clamp as the ratio).
        - ``num_tokens``: number of masked tokens (float).

    Raises:
        ValueError: shapes that do not match the above; ``clip_ratio_low`` outside ``[0, 1)``; negative
            ``clip_ratio_high``; ``clip_ratio_c <= 1``; unknown ``loss_agg_mode`` (and the errors of ``agg_loss``).
    """
    A = _check_shapes(log_prob, old_log_prob, advantages, response_mask)  # (B, T): Eq. 9's A_i on every token
    if not 0.0 <= clip_ratio_low < 1.0:
        raise ValueError(f"clip_ratio_low must be in [0, 1), got {clip_ratio_low}")
    if not clip_ratio_high >= 0.0:
        raise ValueError(f"clip_ratio_high must be >= 0, got {clip_ratio_high}")
    if not clip_ratio_c > 1.0:
        raise ValueError(f"clip_ratio_c (dual-clip constant) must be > 1, got {clip_ratio_c}")
    if loss_agg_mode not in LOSS_AGG_MODES:
        raise ValueError(f"unknown loss_agg_mode {loss_agg_mode!r}; valid modes: {', '.join(LOSS_AGG_MODES)}")

    mask = response_mask.to(torch.bool)
    old_log_prob = old_log_prob.detach()

    # r_{i,t}(theta) = exp(log pi_theta - log pi_theta_old)   (Eq. 9)
    negative_approx_kl = torch.clamp(log_prob - old_log_prob, min=-LOG_RATIO_CLAMP, max=LOG_RATIO_CLAMP)
    ratio = torch.exp(negative_approx_kl)

    # Clip-Higher: decoupled bounds 1 - eps_low and 1 + eps_high   (Eq. 10)
    pg_losses1 = -A * ratio
    pg_losses2 = -A * torch.clamp(ratio, 1.0 - clip_ratio_low, 1.0 + clip_ratio_high)
    clip_pg_losses1 = torch.maximum(pg_losses1, pg_losses2)

    # Dual-clip for A < 0: the loss is at most -A * c however large the ratio grows
    pg_losses3 = -A * clip_ratio_c
    clip_pg_losses2 = torch.minimum(pg_losses3, clip_pg_losses1)
    pg_losses = torch.where(A < 0, clip_pg_losses2, clip_pg_losses1)
    if rollout_is_weights is not None:
        if rollout_is_weights.shape != log_prob.shape:
            raise ValueError(
                f"rollout_is_weights must have shape {tuple(log_prob.shape)}, got {tuple(rollout_is_weights.shape)}"
            )
        pg_losses = pg_losses * rollout_is_weights.detach().to(pg_losses.dtype)

    # Token-level aggregation   (Eq. 12 for token-mean)
    pg_loss = agg_loss(
        pg_losses,
        mask,
        loss_agg_mode,
        global_num_tokens=global_num_tokens,
        global_batch_size=global_batch_size,
        loss_scale_factor=loss_scale_factor,
    )

    with torch.no_grad():
        ratio = ratio.detach()
        is_lower_clipped = (A < 0) & (ratio < 1.0 - clip_ratio_low)
        is_upper_clipped = (A > 0) & (ratio > 1.0 + clip_ratio_high)
        is_dual_clipped = (A < 0) & (pg_losses3 < clip_pg_losses1.detach())
        stats = policy_loss_stats(
            log_prob, old_log_prob, mask, is_lower_clipped, is_upper_clipped, is_dual_clipped
        )
    return pg_loss, stats


def policy_loss_stats(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    mask: torch.Tensor,
    lower: torch.Tensor,
    upper: torch.Tensor,
    dual: torch.Tensor | None = None,
) -> dict[str, float]:
    """The stats keys every policy loss returns (see `compute_policy_loss`; the trainer logs them as `train/*`), from
    its clip masks `(B, T)` bool (`dual` None: a loss without dual clip; all False: a loss that never clips)."""
    f = log_prob.dtype
    kl = torch.clamp(old_log_prob - log_prob.detach(), min=-LOG_RATIO_CLAMP, max=LOG_RATIO_CLAMP)
    return {
        "pg_clipfrac_lower": masked_mean(lower.to(f), mask).item(),
        "pg_clipfrac_upper": masked_mean(upper.to(f), mask).item(),
        "pg_clipfrac": masked_mean((lower | upper).to(f), mask).item(),
        "pg_clipfrac_dual": 0.0 if dual is None else masked_mean(dual.to(f), mask).item(),
        "ppo_kl": masked_mean(kl, mask).item(),
        "num_tokens": float(mask.sum().item()),
    }


def _check_shapes(log_prob, old_log_prob, advantages, response_mask) -> torch.Tensor:
    """Validate `(B, T)` inputs as `compute_policy_loss` does; returns the advantages as a detached `(B, T)`."""
    if log_prob.dim() != 2 or old_log_prob.shape != log_prob.shape or response_mask.shape != log_prob.shape:
        raise ValueError(
            f"log_prob {tuple(log_prob.shape)}, old_log_prob {tuple(old_log_prob.shape)} and response_mask "
            f"{tuple(response_mask.shape)} must have the same (B, T) shape"
        )
    if advantages.shape not in (torch.Size([log_prob.shape[0]]), log_prob.shape):
        raise ValueError(
            f"advantages must have shape ({log_prob.shape[0]},) or {tuple(log_prob.shape)}, "
            f"got {tuple(advantages.shape)}"
        )
    A = advantages.detach()
    return (A.unsqueeze(-1) if A.dim() == 1 else A).expand_as(log_prob).to(log_prob.dtype)


@register_policy_loss("cispo")
def compute_policy_loss_cispo(
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
) -> tuple[torch.Tensor, dict[str, float]]:
    """CISPO (MiniMax-M1, arXiv 2506.13585, Eq. 4-5): a REINFORCE term weighted by the clipped importance ratio,
    which is a constant (stop-gradient), so no token ever loses its gradient to clipping as in PPO:

        loss_{i,t} = - sg( clip(r_{i,t}, 1 - clip_ratio_low, 1 + clip_ratio_high) ) * A_i * log pi_theta(o_{i,t})

    aggregated by `loss_agg_mode` (the paper: token-level, as DAPO). Same arguments, shapes and stats keys as
    `compute_policy_loss`; `clip_ratio_c` is unused (no dual clip). `pg_clipfrac_lower|upper` count tokens whose
    weight was clipped (either sign of A).

    Raises:
        ValueError: mismatched shapes, or an unknown `loss_agg_mode`.
    """
    A = _check_shapes(log_prob, old_log_prob, advantages, response_mask)
    mask = response_mask.to(torch.bool)
    log_ratio = torch.clamp(log_prob.detach() - old_log_prob.detach(), -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio = torch.exp(log_ratio)
    weight = torch.clamp(ratio, 1.0 - clip_ratio_low, 1.0 + clip_ratio_high)
    pg_losses = -weight * A * log_prob
    if rollout_is_weights is not None:
        pg_losses = pg_losses * rollout_is_weights.detach().to(pg_losses.dtype)
    loss = agg_loss(pg_losses, mask, loss_agg_mode, global_num_tokens, global_batch_size, loss_scale_factor)
    with torch.no_grad():
        stats = policy_loss_stats(
            log_prob, old_log_prob, mask, ratio < 1.0 - clip_ratio_low, ratio > 1.0 + clip_ratio_high
        )
    return loss, stats


@register_policy_loss("gspo")
def compute_policy_loss_gspo(
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
) -> tuple[torch.Tensor, dict[str, float]]:
    """GSPO (Zheng et al. 2025, arXiv 2507.18071, Eq. 5-7 and GSPO-token Eq. 13): the importance ratio and its clip
    are per sequence, the length-normalised likelihood ratio

        s_i = exp( (1/|o_i|) sum_t log(pi_theta(o_{i,t}) / pi_old(o_{i,t})) ),
        loss_i = - min( s_i A_i, clip(s_i, 1 - clip_ratio_low, 1 + clip_ratio_high) A_i ),

    computed in the token form s_{i,t} = sg(s_i) * pi_theta(o_{i,t}) / sg(pi_theta(o_{i,t})), whose value is s_i
    and whose gradient is the sequence objective's. Aggregated per sequence (`seq-mean-token-mean`, the paper's
    1/G sum_i) whatever `loss_agg_mode` says; the paper's clip ranges are 3e-4 / 4e-4, far below DAPO's 0.2 / 0.28,
    so set `algorithm.clip_ratio_low|high` with it. Same arguments and stats keys as `compute_policy_loss`;
    `clip_ratio_c` is unused; `global_batch_size` is the mini-batch's sequence count for micro-batching.

    Raises:
        ValueError: mismatched shapes.
    """
    A = _check_shapes(log_prob, old_log_prob, advantages, response_mask)
    mask = response_mask.to(torch.bool)
    lengths = mask.sum(-1).clamp(min=1)
    seq_log_ratio = masked_sum(log_prob.detach() - old_log_prob.detach(), mask, dim=-1) / lengths  # (B,)
    log_s = log_prob - log_prob.detach() + seq_log_ratio.unsqueeze(-1)
    s = torch.exp(torch.clamp(log_s, max=LOG_RATIO_CLAMP))
    pg_losses = torch.maximum(-A * s, -A * torch.clamp(s, 1.0 - clip_ratio_low, 1.0 + clip_ratio_high))
    if rollout_is_weights is not None:
        pg_losses = pg_losses * rollout_is_weights.detach().to(pg_losses.dtype)
    loss = agg_loss(pg_losses, mask, "seq-mean-token-mean", global_batch_size=global_batch_size)
    with torch.no_grad():
        s = s.detach()
        stats = policy_loss_stats(
            log_prob,
            old_log_prob,
            mask,
            (A < 0) & (s < 1 - clip_ratio_low),
            (A > 0) & (s > 1 + clip_ratio_high),
        )
    return loss, stats
