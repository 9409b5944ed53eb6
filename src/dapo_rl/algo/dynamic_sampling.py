"""DAPO dynamic sampling: keep only the groups whose outcomes vary.

DAPO Eq. 11 adds to the objective the constraint

    0 < |{o_i | is_equivalent(a, o_i)}| < G

i.e. a prompt whose G responses are all correct (or all wrong) is dropped: its group-relative advantages are all 0
(``compute_grpo_advantages``), so it contributes no gradient but still dilutes the batch. The trainer over-samples
prompts and keeps filling the batch with the groups that pass.

Generalised as in verl's ``filter_groups``: a group is kept when its ``metric`` (``acc``, ``score``, ...) is not
constant. verl tests ``std > 0``; here ``max - min > tol`` so float scores that differ only by rounding
(``1.0`` vs ``1.0 + 1e-9``) count as constant. Groups of size one are kept, as in verl.
"""

from __future__ import annotations

import torch

from dapo_rl.algo.advantages import _check_group_index

__all__ = ["filter_groups", "kept_group_ids"]


def _group_keep(
    metric: torch.Tensor, group_index: torch.Tensor, tol: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Return ``(unique_ids, group, keep_group)``: the sorted group ids, each sample's dense group number, and
    whether each group is kept."""
    if metric.dim() != 1:
        raise ValueError(f"metric must have shape (B,), got {tuple(metric.shape)}")
    _check_group_index(group_index, metric.shape[0], "metric")
    if not tol >= 0:
        raise ValueError(f"tol must be >= 0, got {tol}")
    metric = metric.to(torch.float64)

    unique_ids, group, group_size = torch.unique(group_index, return_inverse=True, return_counts=True)
    num_groups = unique_ids.shape[0]
    empty = torch.zeros(num_groups, dtype=metric.dtype, device=metric.device)
    group_max = empty.scatter_reduce(0, group, metric, reduce="amax", include_self=False)
    group_min = empty.scatter_reduce(0, group, metric, reduce="amin", include_self=False)
    # Eq. 11: 0 < #correct < G  <=>  the metric varies within the group
    keep_group = (group_max - group_min > tol) | (group_size == 1)
    return unique_ids, group, keep_group


def filter_groups(metric: torch.Tensor, group_index: torch.Tensor, tol: float = 1e-6) -> torch.Tensor:
    """Per-sample keep mask of DAPO dynamic sampling (Eq. 11).

    Args:
        metric: ``(B,)`` per-response metric (``acc`` as bool/0-1, or float ``score``); compared in float64.
        group_index: ``(B,)`` integer group (prompt) id of each sample; groups need not be contiguous.
        tol: a group is kept when ``max(metric) - min(metric) > tol`` over its members.

    Returns:
        ``(B,)`` bool: True for the samples of kept groups (metric varies, or the group has one member). A group
        whose metric contains NaN is dropped.

    Raises:
        ValueError: ``metric`` not 1-D; ``group_index`` not a 1-D integer tensor of the same length; ``tol < 0``.
    """
    _, group, keep_group = _group_keep(metric, group_index, tol)
    return keep_group[group]


def kept_group_ids(metric: torch.Tensor, group_index: torch.Tensor, tol: float = 1e-6) -> torch.Tensor:
    """Ids of the groups ``filter_groups`` keeps, unique, in order of first appearance in ``group_index``.

    First-appearance order (not numeric order) lets a trainer take the first ``k`` kept prompts of a generation
    batch in the order they were sampled, as verl does.

    Args / Raises: as ``filter_groups``.

    Returns:
        ``(K,)`` tensor of group ids, dtype and device of ``group_index``.
    """
    unique_ids, group, keep_group = _group_keep(metric, group_index, tol)
    batch_size = group.shape[0]
    positions = torch.arange(batch_size, device=group.device)
    first_position = torch.full_like(unique_ids, batch_size, dtype=positions.dtype).scatter_reduce(
        0, group, positions, reduce="amin", include_self=False
    )
    order = torch.argsort(first_position)
    return unique_ids[order][keep_group[order]]
