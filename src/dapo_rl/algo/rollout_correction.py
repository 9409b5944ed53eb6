"""Rollout correction: importance weights and rejection masks for the sampler/trainer mismatch.

The rollout engine samples response tokens from mu (vLLM's kernels, its dtype, its sampler), the trainer
scores them with pi_old (its own forward). Even with identical weights the two differ, and PPO's ratio
pi_theta / pi_old then silently assumes samples that came from mu. Following verl's `algorithm.rollout_correction`
(Liu, Li et al. 2025, "When Speed Kills Stability: Demystifying RL Collapse from the Training-Inference
Mismatch"; the same correction as TRL's `vllm_importance_sampling_correction`), with rho = pi_old / mu per token:

- ``rollout_is="token"``: each token's loss is multiplied by ``min(rho_t, rollout_is_threshold)`` (truncated IS,
  TIS);
- ``rollout_is="sequence"``: by ``min(prod_t rho_t, rollout_is_threshold)``, the same for every token of a
  response;
- ``rollout_rs`` (``token`` / ``sequence`` / ``geometric``: rho_t, prod_t rho_t, or the geometric mean
  ``exp(mean_t log rho_t)``) masks out tokens or whole responses whose ratio falls outside
  ``[rollout_rs_threshold_lower, rollout_rs_threshold]`` (lower default: the reciprocal of the upper); masked
  tokens leave the loss *and* its token count;
- ``off_policy_mask_threshold`` (DeepSeek-V3.2's off-policy sequence masking, ``off_policy_sequence_mask``): every
  token of a negative-advantage response whose mean log(mu / pi_theta) exceeds the threshold leaves the loss (not
  its normaliser), at each update step against the current pi_theta;
- ``bypass_mode``: pi_old := mu, the engine's log-probs, so the recompute forward is skipped and PPO's own clipped
  ratio pi_theta / mu does the correcting (two policies instead of three).

All log-ratios are clamped to [-20, 20] before ``exp`` (verl's safety bound). mu must be the distribution the
engine actually sampled from after temperature (TRL#4159): both engines report log-probs of the
temperature-scaled distribution and the actor divides its logits by the same temperature. Top-p / top-k make the
sampler's distribution a truncated, renormalised one that the trainer never computes (TRL#6789): the transformers
engine reports log-probs before that truncation, vLLM's ``processed_logprobs`` after it, so with top-p/top-k < 1
on vLLM rho carries a systematic bias of log(kept mass) per token; DAPO samples with top_p=1 and top_k=-1, where
there is none.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from dapo_rl.algo.masked import masked_sum

__all__ = [
    "IS_LEVELS",
    "LOG_RATIO_BOUND",
    "RS_LEVELS",
    "MismatchStats",
    "compute_rollout_correction",
    "off_policy_sequence_mask",
]

IS_LEVELS: tuple[str, ...] = ("token", "sequence")
"""Values of `algorithm.rollout_correction.rollout_is` besides null."""
RS_LEVELS: tuple[str, ...] = ("token", "sequence", "geometric")
"""Values of `algorithm.rollout_correction.rollout_rs` besides null."""
LOG_RATIO_BOUND = 20.0
"""Log-ratios are clamped to ``[-20, 20]`` before ``exp``: weights stay in ``[2e-9, 5e8]``."""


def _log_ratios(old_log_prob: torch.Tensor, rollout_log_prob: torch.Tensor, mask: torch.Tensor) -> tuple:
    """Token, sequence and geometric-mean log-ratios (0 at masked positions / empty rows)."""
    log_ratio = torch.where(
        mask, old_log_prob.float() - rollout_log_prob.float(), torch.zeros((), device=mask.device)
    )
    seq = log_ratio.sum(-1)
    geo = seq / mask.sum(-1).clamp(min=1)
    bound = LOG_RATIO_BOUND
    return log_ratio.clamp(-bound, bound), seq.clamp(-bound, bound), geo.clamp(-bound, bound)


def compute_rollout_correction(
    old_log_prob: torch.Tensor,
    rollout_log_prob: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    rollout_is: str | None = None,
    rollout_is_threshold: float = 2.0,
    rollout_rs: str | None = None,
    rollout_rs_threshold: float | None = None,
    rollout_rs_threshold_lower: float | None = None,
) -> tuple[torch.Tensor | None, torch.Tensor]:
    """Importance weights and the rejection-masked response mask (see the module docstring).

    Args:
        old_log_prob: ``(B, T)`` float, log pi_old of the response tokens (the trainer's).
        rollout_log_prob: ``(B, T)`` float, log mu, the engine's sampling log-probs of the same tokens.
        response_mask: ``(B, T)`` bool or 0/1, the tokens that count.
        rollout_is: ``None``, ``"token"`` or ``"sequence"``.
        rollout_is_threshold: upper truncation of the IS weights (> 0; verl's default 2.0).
        rollout_rs: ``None``, ``"token"``, ``"sequence"`` or ``"geometric"``.
        rollout_rs_threshold: upper bound of the accepted ratio (default: ``rollout_is_threshold``).
        rollout_rs_threshold_lower: lower bound (default: the reciprocal of the upper bound).

    Returns:
        ``(weights, mask)``: ``weights`` ``(B, T)`` float32 (0 where the returned mask is 0) or ``None`` without
        ``rollout_is``; ``mask`` ``(B, T)`` float32, ``response_mask`` with rejected tokens set to 0.

    Raises:
        ValueError: unknown level, shapes that differ, a threshold that is not > 0, a lower bound above the upper.
    """
    if rollout_is is not None and rollout_is not in IS_LEVELS:
        raise ValueError(f"rollout_is must be null or one of {', '.join(IS_LEVELS)}, got {rollout_is!r}")
    if rollout_rs is not None and rollout_rs not in RS_LEVELS:
        raise ValueError(f"rollout_rs must be null or one of {', '.join(RS_LEVELS)}, got {rollout_rs!r}")
    if not (old_log_prob.shape == rollout_log_prob.shape == response_mask.shape) or old_log_prob.dim() != 2:
        raise ValueError(
            f"old_log_prob {tuple(old_log_prob.shape)}, rollout_log_prob {tuple(rollout_log_prob.shape)} and "
            f"response_mask {tuple(response_mask.shape)} must be the same (B, T) shape"
        )
    if not rollout_is_threshold > 0:
        raise ValueError(f"rollout_is_threshold must be > 0, got {rollout_is_threshold}")
    mask = response_mask.to(torch.bool)
    tok, seq, geo = _log_ratios(old_log_prob, rollout_log_prob, mask)
    keep = mask
    if rollout_rs is not None:
        upper = rollout_is_threshold if rollout_rs_threshold is None else rollout_rs_threshold
        lower = 1.0 / upper if rollout_rs_threshold_lower is None else rollout_rs_threshold_lower
        if not 0 < lower <= upper:
            raise ValueError(f"rollout_rs bounds must satisfy 0 < lower <= upper, got [{lower}, {upper}]")
        ratio = {"token": tok, "sequence": seq.unsqueeze(-1), "geometric": geo.unsqueeze(-1)}[
            rollout_rs
        ].exp()
        keep = mask & (ratio >= lower) & (ratio <= upper)
    weights = None
    if rollout_is is not None:
        log_w = tok if rollout_is == "token" else seq.unsqueeze(-1).expand_as(tok)
        weights = log_w.exp().clamp(max=rollout_is_threshold) * keep
    return weights, keep.float()


def off_policy_sequence_mask(
    log_prob: torch.Tensor,
    sampling_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    threshold: float,
) -> torch.Tensor:
    """DeepSeek-V3.2's off-policy sequence masking (DeepSeek-AI 2025, arXiv 2512.02556, Sec. 3.1, "Keep the
    policy on-policy"; TRL's `off_policy_mask_threshold`, slime's `--use-opsm`): a response that the current policy
    has drifted away from, and whose advantage is negative, teaches by pushing down tokens the policy no longer
    samples, which destabilises training; such responses leave the loss:

        M_{i,t} = 0  if  A_{i,t} < 0  and  (1/|o_i|) sum_t log( mu(o_{i,t}) / pi_theta(o_{i,t}) ) > delta
                = 1  otherwise

    where mu is the sampling policy (the engine's log-probs, or pi_old where the batch has none). Applied to the
    loss mask of each micro-batch at each update step (pi_theta moves between mini-batches); the loss keeps its
    normaliser, as TRL and slime do (the masked tokens count as zeros).

    Args:
        log_prob: `(B, T)` log pi_theta of the response tokens (used without gradient).
        sampling_log_prob: `(B, T)` log mu of the same tokens.
        advantages: `(B,)` or `(B, T)`.
        response_mask: `(B, T)` bool or 0/1.
        threshold: delta, in nats per token (slime's default 1e-4).

    Returns:
        `(B, T)` float mask, 1 where the token stays (multiply the loss mask by it).

    Raises:
        ValueError: shapes that differ.
    """
    if not (log_prob.shape == sampling_log_prob.shape == response_mask.shape) or log_prob.dim() != 2:
        raise ValueError(
            f"log_prob {tuple(log_prob.shape)}, sampling_log_prob {tuple(sampling_log_prob.shape)} and "
            f"response_mask {tuple(response_mask.shape)} must be the same (B, T) shape"
        )
    with torch.no_grad():
        mask = response_mask.to(torch.bool)
        drift = masked_sum(sampling_log_prob.float() - log_prob.detach().float(), mask, dim=-1)
        drift = drift / mask.sum(-1).clamp(min=1)  # (B,) mean log(mu / pi_theta)
        A = advantages.detach()
        A = A.unsqueeze(-1) if A.dim() == 1 else A
        drop = (A < 0) & (drift > threshold).unsqueeze(-1)
        return (~drop).expand_as(log_prob).to(torch.float32)


@dataclass
class MismatchStats:
    """Sampler/trainer mismatch metrics, accumulated over micro-batches and reduced over ranks.

    Per token, with ``lr = log pi_train - log mu`` (pi_train: pi_old, or pi_theta where the update takes its old
    log-probs from the engine or from itself):

    - ``rollout_corr/rollout_is_mean``, ``rollout_corr/rollout_is_max``: the IS weights in use (after truncation,
      masked tokens counted as 0) or, without ``rollout_is``, the raw token ratio ``exp(lr)``;
    - ``rollout_corr/rollout_rs_masked_fraction``: share of response tokens the rejection mask removed;
    - ``rollout_corr/log_ppl_diff``: mean over responses of ``log_ppl(mu) - log_ppl(pi_train)``, where
      ``log_ppl = -mean_t log p`` (positive: the engine was less sure than the trainer);
    - ``rollout_corr/kl``: token mean of ``log mu - log pi_train`` (the plain k1 estimator of KL(mu || pi_train):
      unbiased but noisy, so a batch can give a small negative value);
    - ``rollout_corr/k3_kl``: token mean of ``exp(lr) - lr - 1`` (Schulman's k3 estimator, >= 0).
    """

    sums: dict[str, float] = field(default_factory=dict)
    max_weight: float = 0.0

    def add(
        self,
        train_log_prob: torch.Tensor,
        rollout_log_prob: torch.Tensor,
        response_mask: torch.Tensor,
        weights: torch.Tensor | None = None,
        kept_mask: torch.Tensor | None = None,
    ) -> None:
        """Accumulate one micro-batch (all ``(b, T)``; ``weights`` / ``kept_mask`` from
        :func:`compute_rollout_correction`, or ``None``)."""
        with torch.no_grad():
            mask = response_mask.to(torch.bool)
            tok, _seq, _geo = _log_ratios(train_log_prob, rollout_log_prob, mask)
            w = tok.exp() * mask if weights is None else weights
            n_tok = mask.sum(-1)
            rows = n_tok > 0
            ppl_diff = (masked_sum(tok, mask, dim=-1) / n_tok.clamp(min=1))[
                rows
            ]  # log_ppl(mu) - log_ppl(train)
            kept = float(mask.sum()) if kept_mask is None else float((kept_mask.bool() & mask).sum())
            add = {
                "tokens": float(mask.sum()),
                "seqs": float(rows.sum()),
                "is_sum": float(masked_sum(w, mask)),
                "rejected": float(mask.sum()) - kept,
                "ppl_diff": float(ppl_diff.sum()),
                "kl": float(masked_sum(-tok, mask)),
                "k3": float(masked_sum(tok.exp() - tok - 1.0, mask)),
            }
            for k, v in add.items():
                self.sums[k] = self.sums.get(k, 0.0) + v
            if bool(mask.any()):
                self.max_weight = max(self.max_weight, float(w[mask].max()))

    def result(self, reduce_sum=None, reduce_max=None) -> dict[str, float]:
        """The metrics (empty when nothing was added); ``reduce_sum`` / ``reduce_max`` combine lists of floats
        over ranks (identity in one process)."""
        keys = ["tokens", "seqs", "is_sum", "rejected", "ppl_diff", "kl", "k3"]
        values = [self.sums.get(k, 0.0) for k in keys]
        if reduce_sum is not None:
            values = reduce_sum(values)
        top = reduce_max([self.max_weight])[0] if reduce_max is not None else self.max_weight
        s = dict(zip(keys, values))
        if s["tokens"] <= 0:
            return {}
        return {
            "rollout_corr/rollout_is_mean": s["is_sum"] / s["tokens"],
            "rollout_corr/rollout_is_max": top,
            "rollout_corr/rollout_rs_masked_fraction": s["rejected"] / s["tokens"],
            "rollout_corr/log_ppl_diff": s["ppl_diff"] / max(s["seqs"], 1.0),
            "rollout_corr/kl": s["kl"] / s["tokens"],
            "rollout_corr/k3_kl": s["k3"] / s["tokens"],
        }


def truncated_sampling_bias(
    engine: str, top_p: float, top_k: int, *, engine_logprobs_stand_in: bool
) -> str | None:
    """Why the engine's log-probs mu misstate the sampling distribution, when they stand in for pi_old or weigh the
    loss (stale asynchronous rows, `bypass_mode`, `rollout_is` / `rollout_rs`), or None.

    With nucleus or top-k sampling the engine samples from the truncated, renormalised distribution. vLLM reports
    that distribution's log-probs (`logprobs_mode="processed_logprobs"`, `dapo_rl.rollout.vllm`); the transformers
    engine reports the untruncated softmax's, so mu is too small for every sampled token and the ratio
    pi_theta / mu, and the IS weights pi_old / mu, are biased upwards (vllm-project/vllm #42259,
    huggingface/trl #6789).

    Args:
        engine: `rollout.name`.
        top_p: `rollout.top_p` (1: off).
        top_k: `rollout.top_k` (<= 0: off).
        engine_logprobs_stand_in: whether the run uses mu at all (otherwise pi_old is recomputed and mu only feeds
            the `rollout_corr/*` metrics).

    Returns:
        A one-line warning naming the bias and the settings that remove it, or None.
    """
    if not engine_logprobs_stand_in or (top_p >= 1.0 and top_k <= 0) or engine == "vllm":
        return None
    return (
        f"rollout.top_p={top_p:g} / rollout.top_k={top_k}: the {engine} engine reports log-probs of the untruncated "
        "distribution while it samples from the truncated one, so pi_theta / mu (and pi_old / mu) is biased "
        "upwards on the rows where the engine's log-probs are used; use rollout.name=vllm (its processed "
        "log-probs) or rollout.top_p=1 and rollout.top_k=-1"
    )
