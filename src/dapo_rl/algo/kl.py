"""KL penalty estimators: a per-token estimate of KL(pi_theta || pi_ref) from the log-probabilities of the sampled
tokens, for the KL term to a reference policy (`algorithm.use_kl_loss`). DAPO drops it (paper Sec. 2.3: the policy
is meant to move far from the initial model in long-CoT RL); ProRL (Liu et al. 2025, arXiv 2505.24864, Sec. 3.2)
keeps it and periodically resets the reference to the current policy.

With ``x = log pi_ref(o_t) - log pi_theta(o_t)`` (Schulman 2020, "Approximating KL divergence"):

| name (verl's)        | value                  | as an estimator of KL(pi_theta || pi_ref)           |
|----------------------|------------------------|------------------------------------------------------|
| `kl`, `k1`           | ``-x``                 | unbiased, high variance, can be negative             |
| `abs`                | ``abs(x)``             | biased                                               |
| `mse`, `k2`          | ``x^2 / 2``            | biased, low variance; its gradient is KL's gradient  |
| `low_var_kl`, `k3`   | ``exp(x) - x - 1``     | unbiased, >= 0, low variance (GRPO's, verl's default) |

``x`` is clamped to [-20, 20] before ``exp`` and `k3` to [-10, 10], as verl does. A ``+`` suffix (``k1+``,
``k3+``, ...) keeps the estimator's value and takes `k2`'s gradient (straight-through: ``k2 - sg(k2) + sg(k)``),
which is the unbiased gradient of the KL as a loss (verl; Tang & Munos 2025, arXiv 2506.09477).
"""

from __future__ import annotations

import torch

__all__ = ["KL_ESTIMATORS", "kl_penalty"]

_BASE = {"kl": "k1", "k1": "k1", "abs": "abs", "mse": "k2", "k2": "k2", "low_var_kl": "k3", "k3": "k3"}
KL_ESTIMATORS: tuple[str, ...] = tuple(_BASE) + tuple(f"{k}+" for k in _BASE)
"""Valid `algorithm.kl_loss_type` values."""


def kl_penalty(
    log_prob: torch.Tensor, ref_log_prob: torch.Tensor, kl_type: str = "low_var_kl"
) -> torch.Tensor:
    """Per-token KL estimate of pi_theta against pi_ref (see the module docstring for the estimators).

    Args:
        log_prob: `(B, T)` log pi_theta of the sampled tokens (differentiable).
        ref_log_prob: `(B, T)` log pi_ref of the same tokens (a constant).
        kl_type: one of `KL_ESTIMATORS`.

    Returns:
        `(B, T)`, dtype of `log_prob`; aggregate it with the loss mask (`agg_loss`).

    Raises:
        ValueError: an unknown `kl_type`, shapes that differ.
    """
    if kl_type not in KL_ESTIMATORS:
        raise ValueError(f"unknown kl_loss_type {kl_type!r}; valid: {', '.join(KL_ESTIMATORS)}")
    if log_prob.shape != ref_log_prob.shape:
        raise ValueError(
            f"log_prob {tuple(log_prob.shape)} and ref_log_prob {tuple(ref_log_prob.shape)} differ"
        )
    straight_through = kl_type.endswith("+")
    base = _BASE[kl_type.rstrip("+")]
    x0 = ref_log_prob.detach().to(log_prob.dtype) - log_prob
    x = x0
    if base == "k1":
        value = -x
    elif base == "abs":
        value = x.abs()
    elif base == "k2":
        value = 0.5 * x.square()
    else:
        x = torch.clamp(x, -20.0, 20.0)
        value = torch.clamp(torch.exp(x) - x - 1.0, -10.0, 10.0)
    if not straight_through:
        return value
    k2 = 0.5 * x0.square()
    return k2 - k2.detach() + value.detach()
