"""Group-relative advantages (GRPO), as used by DAPO.

DAPO Eq. 9: for the G responses {o_i} sampled for one prompt with rewards {R_i},

    A_hat_{i,t} = (R_i - mean({R_i}_{i=1}^G)) / std({R_i}_{i=1}^G)

The same advantage is given to every token t of response i (``compute_policy_loss`` broadcasts a ``(B,)`` advantage
over the sequence dimension).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from dapo_rl.algo.registry import Registry

__all__ = [
    "ADV_ESTIMATORS",
    "compute_grpo_advantages",
    "compute_grpo_batch_std_advantages",
    "get_adv_estimator",
    "register_adv_est",
]

AdvEstimator = Callable[..., torch.Tensor]
ADV_ESTIMATORS: Registry[AdvEstimator] = Registry("advantage estimator")
"""Advantage estimators by name (`algorithm.adv_estimator`). Each takes `(scores (B,), group_index (B,), *,
norm_adv_by_std_in_grpo: bool)` and returns `(B,)` advantages (verl's `register_adv_est` idea)."""
register_adv_est = ADV_ESTIMATORS.register
"""Decorator: `@register_adv_est("name")` makes an estimator selectable as `algorithm.adv_estimator=name`."""
get_adv_estimator = ADV_ESTIMATORS.lookup
"""The estimator registered under a name (ValueError for an unknown one)."""


def _check_group_index(group_index: torch.Tensor, batch_size: int, what: str) -> None:
    """Raise ValueError unless ``group_index`` is a 1-D integer tensor of length ``batch_size``."""
    if group_index.dim() != 1 or group_index.shape[0] != batch_size:
        raise ValueError(
            f"group_index must have shape ({batch_size},) like {what}, got {tuple(group_index.shape)}"
        )
    if group_index.dtype.is_floating_point or group_index.dtype.is_complex or group_index.dtype == torch.bool:
        raise ValueError(f"group_index must be an integer tensor, got {group_index.dtype}")


@register_adv_est("grpo")
def compute_grpo_advantages(
    scores: torch.Tensor,
    group_index: torch.Tensor,
    eps: float = 1e-6,
    *,
    norm_adv_by_std_in_grpo: bool = True,
) -> torch.Tensor:
    """Outcome advantage of each response relative to its group (DAPO Eq. 9, the GRPO advantage).

    ``A_i = (R_i - mean_g) / (std_g + eps)`` where ``g`` is the group of sample ``i`` (the responses to one prompt),
    ``mean_g`` its mean score and ``std_g`` its unbiased standard deviation (``torch.std``, correction=1).

    - A group whose scores are all equal gets exactly 0 for every member, whatever the score value and group size
      (the zero-variance case is detected, not left to ``0 / (0 + eps)``, where a float residue of the mean would
      be blown up): no learning signal, which is why DAPO's dynamic sampling (``filter_groups``) drops such groups.
      The statistics are computed in float64.
    - A group of size one gets 0 (its std is undefined). Note: verl uses mean 0 and std 1 for a lone sample, i.e.
      ``A = R / (1 + eps)``; here a lone sample carries no relative information, so it gets none.

    - ``norm_adv_by_std_in_grpo=False`` gives Dr. GRPO's centring without the division (Liu et al. 2025,
      "Understanding R1-Zero-Like Training"): ``A_i = R_i - mean_g`` (a lone sample: 0 as well).

    Vectorised with ``torch.unique`` + ``index_add_``: no Python loop over samples or groups.

    Args:
        scores: ``(B,)`` sequence-level rewards R_i (float; integer/bool are cast to float32).
        group_index: ``(B,)`` integer group id of each sample (any integers; members of a group need not be
            contiguous).
        eps: added to the group std for numerical stability.
        norm_adv_by_std_in_grpo: divide by the group std (GRPO, DAPO); False: mean-centring only (Dr. GRPO).

    Returns:
        ``(B,)`` advantages, dtype of ``scores`` (float32 if ``scores`` is not floating).

    Raises:
        ValueError: ``scores`` is not 1-D, ``group_index`` is not 1-D of the same length, or ``group_index`` is not
            an integer tensor.
    """
    if scores.dim() != 1:
        raise ValueError(f"scores must have shape (B,), got {tuple(scores.shape)}")
    _check_group_index(group_index, scores.shape[0], "scores")
    out_dtype = scores.dtype if scores.dtype.is_floating_point else torch.float32
    scores = scores.to(torch.float64)  # the statistics in float64; the result in the input's dtype

    # group[i] in [0, num_groups): dense id of sample i's group; group_size[g]: number of samples in group g.
    _, group, group_size = torch.unique(group_index, return_inverse=True, return_counts=True)
    num_groups = group_size.shape[0]
    group_size = group_size.to(scores.dtype)
    empty = torch.zeros(num_groups, dtype=scores.dtype, device=scores.device)

    # mean_g = (1 / G) * sum_{i in g} R_i
    group_mean = empty.index_add(0, group, scores) / group_size

    # std_g = sqrt( sum_{i in g} (R_i - mean_g)^2 / (G - 1) )   (unbiased, as torch.std)
    deviation = scores - group_mean[group]
    group_std = torch.sqrt(empty.index_add(0, group, deviation**2) / (group_size - 1).clamp(min=1))

    advantages = deviation / (group_std[group] + eps) if norm_adv_by_std_in_grpo else deviation
    # A group whose scores are all equal (a group of one included) carries no relative information: exactly 0,
    # not the rounding residue of its mean divided by eps.
    group_max = empty.scatter_reduce(0, group, scores, reduce="amax", include_self=False)
    group_min = empty.scatter_reduce(0, group, scores, reduce="amin", include_self=False)
    constant = (group_max == group_min)[group]
    return torch.where(constant, torch.zeros_like(advantages), advantages).to(out_dtype)


@register_adv_est("grpo_batch_std")
def compute_grpo_batch_std_advantages(
    scores: torch.Tensor,
    group_index: torch.Tensor,
    eps: float = 1e-6,
    *,
    norm_adv_by_std_in_grpo: bool = True,
) -> torch.Tensor:
    """Group-centred, batch-scaled advantages: ScaleRL's batch-level advantage normalisation (Khatri et al. 2025,
    "The Art of Scaling Reinforcement Learning Compute for LLMs", arXiv 2510.13786, Sec. 3; TRL's
    `scale_rewards="batch"`):

        A_i = (R_i - mean_g) / (std(R over the batch) + eps)

    The baseline is still the group's mean (a constant group, and a group of one, get exactly 0, as in
    `compute_grpo_advantages`), but every advantage is divided by one number, the unbiased standard deviation of
    all the step's scores (the kept groups after dynamic sampling), so a group whose answers nearly agree is not
    blown up to unit scale. TRL takes eps = 1e-4 and the std of the generation batch (it has no dynamic sampling);
    `norm_adv_by_std_in_grpo=False` leaves the centred scores undivided, as for `grpo`.

    Args:
        scores: `(B,)` sequence-level rewards (float; integer/bool are cast to float32).
        group_index: `(B,)` integer group id of each sample.
        eps: added to the batch std.
        norm_adv_by_std_in_grpo: divide by the batch std.

    Returns:
        `(B,)` advantages, dtype of `scores` (float32 if not floating).

    Raises:
        ValueError: as `compute_grpo_advantages`.
    """
    centred = compute_grpo_advantages(scores, group_index, eps, norm_adv_by_std_in_grpo=False)
    if not norm_adv_by_std_in_grpo or scores.shape[0] < 2:
        return centred
    std = scores.to(torch.float64).std()
    return (centred.to(torch.float64) / (std + eps)).to(centred.dtype)
