"""Masked statistics and per-token quantities computed from logits.

These are the small building blocks the loss and the actor share:

- ``masked_sum`` / ``masked_mean``: sums and means over the response tokens only (``response_mask`` is 1 on tokens
  the policy generated, 0 on prompt and padding).
- ``logprobs_from_logits``: ``log pi_theta(o_t | q, o_<t)`` for the sampled tokens, the numerator of the ratio
  ``r_{i,t}(theta)`` in DAPO Eq. 9.
- ``entropy_from_logits``: the token entropy DAPO monitors to detect entropy collapse (Section 3.1, Clip-Higher).
"""

from __future__ import annotations

import torch

__all__ = ["entropy_from_logits", "logprobs_from_logits", "masked_mean", "masked_sum"]


def _broadcast_mask(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Return ``mask`` as a bool tensor with the shape of ``x``; raise ValueError when it cannot broadcast."""
    try:
        return torch.broadcast_to(mask.to(torch.bool), x.shape)
    except RuntimeError as err:
        raise ValueError(
            f"mask of shape {tuple(mask.shape)} does not broadcast to x of shape {tuple(x.shape)}"
        ) from err


def masked_sum(x: torch.Tensor, mask: torch.Tensor, dim: int | tuple[int, ...] | None = None) -> torch.Tensor:
    """Sum of ``x`` over the positions where ``mask`` is set.

    Args:
        x: values, any shape, floating dtype.
        mask: bool or 0/1 tensor broadcastable to ``x.shape`` (a nonzero entry counts as 1).
        dim: dimension(s) to reduce; ``None`` reduces over all elements to a 0-d tensor.

    Returns:
        ``x`` summed over masked positions, dtype of ``x``; shape of ``x`` with ``dim`` removed.

    Masked-out positions are replaced by 0 with ``torch.where`` (not multiplied by 0), so ``inf``/``NaN`` in padding
    (e.g. ``-inf`` log-probs of pad tokens) never leak into the result or its gradient.

    Raises:
        ValueError: ``mask`` does not broadcast to ``x``.
    """
    mask = _broadcast_mask(x, mask)
    x_masked = torch.where(mask, x, torch.zeros((), dtype=x.dtype, device=x.device))
    if dim is None:
        return x_masked.sum()
    return x_masked.sum(dim=dim)


def masked_mean(
    x: torch.Tensor, mask: torch.Tensor, dim: int | tuple[int, ...] | None = None
) -> torch.Tensor:
    """Mean of ``x`` over the positions where ``mask`` is set.

    ``masked_sum(x, mask, dim) / max(count, 1)`` where ``count`` is the number of masked positions: a slice with an
    empty mask gives 0, never NaN.

    Args:
        x: values, any shape, floating dtype.
        mask: bool or 0/1 tensor broadcastable to ``x.shape``.
        dim: dimension(s) to reduce; ``None`` reduces over all elements to a 0-d tensor.

    Returns:
        the masked mean, dtype of ``x``; shape of ``x`` with ``dim`` removed.

    Raises:
        ValueError: ``mask`` does not broadcast to ``x``.
    """
    mask = _broadcast_mask(x, mask)
    total = masked_sum(x, mask, dim)
    count = mask.sum() if dim is None else mask.sum(dim=dim)
    return total / count.clamp(min=1).to(x.dtype)


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of ``softmax(logits)`` over the last (vocabulary) dimension.

    ``H = -sum_v p_v log p_v`` with ``log p = log_softmax(z) = (z - max z) - logsumexp(z - max z)``: the shift by
    the max keeps every term exact even for logits of magnitude ~1e3, where the shorter form
    ``logsumexp(z) - sum_v p_v z_v`` loses digits to cancellation.

    Args:
        logits: ``(..., V)`` floating tensor of finite values (a ``-inf`` logit gives ``0 * -inf = NaN``). Computed
            in the dtype of ``logits``: pass float32 when precision matters.

    Returns:
        ``(...)`` entropy in nats, dtype of ``logits``.
    """
    log_probs = torch.log_softmax(logits, dim=-1)
    return -(log_probs.exp() * log_probs).sum(dim=-1)


def logprobs_from_logits(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Log-probability of ``labels`` under ``softmax(logits)``: ``log_softmax(logits)[..., labels]``.

    Computed as ``z_label - logsumexp(z)``, which is as stable as ``torch.log_softmax`` and never materialises the
    full ``(..., V)`` log-softmax tensor.

    Args:
        logits: ``(..., V)`` floating tensor. Computed in its dtype: pass float32 when precision matters.
        labels: ``(...)`` integer token ids in ``[0, V)``.

    Returns:
        ``(...)`` log-probabilities, dtype of ``logits``.

    Raises:
        ValueError: ``labels.shape != logits.shape[:-1]`` or ``labels`` is not an integer tensor.
    """
    if labels.shape != logits.shape[:-1]:
        raise ValueError(
            f"labels shape {tuple(labels.shape)} must equal logits shape without the vocab dim "
            f"{tuple(logits.shape[:-1])}"
        )
    if labels.dtype.is_floating_point or labels.dtype.is_complex or labels.dtype == torch.bool:
        raise ValueError(f"labels must be an integer tensor, got {labels.dtype}")
    label_logits = torch.gather(logits, dim=-1, index=labels.long().unsqueeze(-1)).squeeze(-1)
    return label_logits - torch.logsumexp(logits, dim=-1)
