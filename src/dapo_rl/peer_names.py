"""What a setting of TRL's `GRPOConfig` or slime is called here: the hint an unknown config key gets when its last
part is a peer's name (`algorithm.beta=0.04` -> `algorithm.kl_loss_coef`). verl's names are dapo-rl's own where the
two share a setting, so they need no entry.

Sources: TRL's `GRPOConfig` fields (huggingface/trl `trl/trainer/grpo_config.py`) and slime's command-line flags
(THUDM/slime `slime/utils/arguments.py`), as documented by each.
"""

from __future__ import annotations

__all__ = ["PEER_NAMES", "peer_hint"]

PEER_NAMES: dict[str, str] = {
    # TRL GRPOConfig
    "beta": "TRL's `beta` is algorithm.kl_loss_coef, with algorithm.use_kl_loss=true (off by default, as in DAPO)",
    "epsilon": "TRL's `epsilon` is algorithm.clip_ratio_low",
    "epsilon_high": "TRL's `epsilon_high` is algorithm.clip_ratio_high",
    "delta": "TRL's `delta` (two-sided clip) is algorithm.clip_ratio_c (the dual clip, on negative advantages)",
    "num_generations": "TRL's `num_generations` is rollout.n",
    "num_iterations": "TRL's `num_iterations` is actor.ppo_epochs",
    "learning_rate": "TRL's `learning_rate` is actor.lr",
    "max_completion_length": "TRL's `max_completion_length` is data.max_response_length",
    "loss_type": (
        "TRL's `loss_type` is two settings here: the aggregation algorithm.loss_agg_mode (dapo: token-mean, grpo: "
        "seq-mean-token-mean, dr_grpo: seq-mean-token-sum-norm) and the loss algorithm.policy_loss.loss_mode "
        "(cispo, sapo, ...)"
    ),
    "scale_rewards": (
        "TRL's `scale_rewards` is algorithm.adv_estimator=grpo (group) or grpo_batch_std (batch); none is "
        "algorithm.norm_adv_by_std_in_grpo=false"
    ),
    "importance_sampling_level": "TRL's `importance_sampling_level=sequence` is algorithm.policy_loss.loss_mode=gspo",
    "mask_truncated_completions": "TRL's `mask_truncated_completions` is algorithm.overlong_filtering",
    "sapo_temperature_pos": "TRL's `sapo_temperature_pos` is algorithm.policy_loss.tau_pos",
    "sapo_temperature_neg": "TRL's `sapo_temperature_neg` is algorithm.policy_loss.tau_neg",
    "sync_ref_model": "TRL's `sync_ref_model` is algorithm.ref_reset_freq > 0 (ProRL's hard reset)",
    "ref_model_sync_steps": "TRL's `ref_model_sync_steps` is algorithm.ref_reset_freq",
    "cast_lm_head_to_fp32": "TRL's `cast_lm_head_to_fp32` is actor.lm_head_fp32",
    "vllm_importance_sampling_correction": "TRL's vLLM IS correction is algorithm.rollout_correction.rollout_is",
    "vllm_importance_sampling_cap": "TRL's `vllm_importance_sampling_cap` is algorithm.rollout_correction.rollout_is_threshold",
    # slime
    "use_opsm": "slime's `--use-opsm` is algorithm.rollout_correction.off_policy_mask_threshold (> 0 turns it on)",
    "opsm_delta": "slime's `--opsm-delta` is algorithm.rollout_correction.off_policy_mask_threshold",
    "eps_clip": "slime's `--eps-clip` is algorithm.clip_ratio_low",
    "eps_clip_high": "slime's `--eps-clip-high` is algorithm.clip_ratio_high",
    "eps_clip_c": "slime's `--eps-clip-c` is algorithm.clip_ratio_c",
    "kl_coef": (
        "slime's `--kl-coef` (a KL penalty in the reward) has no counterpart here; the KL loss term is "
        "algorithm.kl_loss_coef with algorithm.use_kl_loss=true"
    ),
}
"""Last part of a peer's setting name -> what it is here."""


def peer_hint(key: str) -> str | None:
    """The `PEER_NAMES` hint for a dotted or bare key (its last part, `-` read as `_`), else None."""
    return PEER_NAMES.get(key.rsplit(".", 1)[-1].lstrip("-").replace("-", "_"))
