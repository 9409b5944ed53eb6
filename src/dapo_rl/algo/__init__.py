"""Pure tensor functions of the DAPO algorithm (arXiv 2503.14476); depends on torch only.

| paper                                   | function                                     | file                 |
|-----------------------------------------|----------------------------------------------|----------------------|
| Eq. 9  group-relative advantage         | ``compute_grpo_advantages``                  | advantages.py        |
| Eq. 9-10 ratio, Clip-Higher, dual-clip  | ``compute_policy_loss``                      | policy_loss.py       |
| Eq. 12 token-level loss aggregation     | ``agg_loss``                                 | policy_loss.py       |
| Eq. 11 dynamic sampling                 | ``filter_groups``, ``kept_group_ids``        | dynamic_sampling.py  |
| Eq. 13 soft overlong punishment         | ``overlong_penalty``                         | overlong.py          |
| peers' losses (clip_cov, kl_cov, geo_mean, sapo, dppo_tv, dppo_kl) | ``compute_policy_loss_<name>`` | policy_loss_variants.py |
| registries (`algorithm.adv_estimator`, `algorithm.policy_loss.loss_mode`) | ``register_adv_est``, ``register_policy_loss`` | advantages.py, policy_loss.py |
| log-probs, entropy, masked statistics   | ``logprobs_from_logits``, ``entropy_from_logits``, ``masked_mean``, ``masked_sum`` | masked.py |
"""

from dapo_rl.algo import policy_loss_variants  # noqa: F401 - registers the peers' losses
from dapo_rl.algo.advantages import (
    ADV_ESTIMATORS,
    compute_grpo_advantages,
    get_adv_estimator,
    register_adv_est,
)
from dapo_rl.algo.dynamic_sampling import filter_groups, kept_group_ids
from dapo_rl.algo.masked import entropy_from_logits, logprobs_from_logits, masked_mean, masked_sum
from dapo_rl.algo.overlong import overlong_penalty
from dapo_rl.algo.policy_loss import (
    LOSS_AGG_MODES,
    POLICY_LOSSES,
    agg_loss,
    compute_policy_loss,
    get_policy_loss,
    loss_hyperparameters,
    register_policy_loss,
)

__all__ = [
    "ADV_ESTIMATORS",
    "LOSS_AGG_MODES",
    "POLICY_LOSSES",
    "get_adv_estimator",
    "get_policy_loss",
    "loss_hyperparameters",
    "register_adv_est",
    "register_policy_loss",
    "agg_loss",
    "compute_grpo_advantages",
    "compute_policy_loss",
    "entropy_from_logits",
    "filter_groups",
    "kept_group_ids",
    "logprobs_from_logits",
    "masked_mean",
    "masked_sum",
    "overlong_penalty",
]
