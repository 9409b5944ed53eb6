"""Rollout correction (`algorithm.rollout_correction`): hand-computed weights, masks, metrics, and the real actor."""

import math

import pytest
import torch

from dapo_rl.actor import Actor, TrainBatch
from dapo_rl.algo import compute_policy_loss
from dapo_rl.algo.rollout_correction import (
    MismatchStats,
    compute_rollout_correction,
    off_policy_sequence_mask,
)
from dapo_rl.config import (
    ActorConfig,
    AlgorithmConfig,
    ConfigError,
    RolloutCorrectionConfig,
    load_config,
    validate_config,
)
from dapo_rl.models.tiny import save_tiny_checkpoint

L = math.log
# Row 0: pi_old = (0.5, 0.3), mu = (0.25, 0.6) -> token ratios (2, 0.5), product 1, geometric mean 1.
# Row 1: pi_old = (0.4, 0.2, 0.9), mu = (0.2, 0.1, 0.9) -> ratios (2, 2, 1), product 4, geometric mean 4^(1/3).
OLD = torch.tensor([[L(0.5), L(0.3), 0.0], [L(0.4), L(0.2), L(0.9)]])
MU = torch.tensor([[L(0.25), L(0.6), -7.0], [L(0.2), L(0.1), L(0.9)]])  # -7 sits on padding: ignored
MASK = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])


def _close(a, b):
    assert torch.allclose(a, torch.tensor(b, dtype=a.dtype), atol=1e-6), (a, b)


def test_token_is_weights_are_truncated_ratios():
    w, mask = compute_rollout_correction(OLD, MU, MASK, rollout_is="token", rollout_is_threshold=1.5)
    _close(w, [[1.5, 0.5, 0.0], [1.5, 1.5, 1.0]])
    _close(mask, MASK.tolist())  # no rejection without rollout_rs


def test_sequence_is_weights_are_the_truncated_product():
    w, _ = compute_rollout_correction(OLD, MU, MASK, rollout_is="sequence", rollout_is_threshold=3.0)
    _close(w, [[1.0, 1.0, 0.0], [3.0, 3.0, 3.0]])  # products 1 and 4 -> 4 truncated at 3


def test_rejection_at_each_level():
    # token: bounds [1/1.5, 1.5] reject every ratio of 2 and 0.5, keep the 1
    w, mask = compute_rollout_correction(OLD, MU, MASK, rollout_rs="token", rollout_rs_threshold=1.5)
    assert w is None
    _close(mask, [[0, 0, 0], [0, 0, 1]])
    # sequence: product 1 kept, product 4 rejected by the upper bound 3 (lower 1/3)
    _, mask = compute_rollout_correction(OLD, MU, MASK, rollout_rs="sequence", rollout_rs_threshold=3.0)
    _close(mask, [[1, 1, 0], [0, 0, 0]])
    # geometric: 1 and 4^(1/3) = 1.587 against [0.5, 1.6] keeps both, against [0.5, 1.5] rejects row 1
    _, mask = compute_rollout_correction(
        OLD, MU, MASK, rollout_rs="geometric", rollout_rs_threshold=1.6, rollout_rs_threshold_lower=0.5
    )
    _close(mask, MASK.tolist())
    _, mask = compute_rollout_correction(
        OLD, MU, MASK, rollout_rs="geometric", rollout_rs_threshold=1.5, rollout_rs_threshold_lower=0.5
    )
    _close(mask, [[1, 1, 0], [0, 0, 0]])
    # IS and RS together: the weights are zero where the mask rejects
    w, mask = compute_rollout_correction(
        OLD,
        MU,
        MASK,
        rollout_is="token",
        rollout_is_threshold=2.0,
        rollout_rs="sequence",
        rollout_rs_threshold=3.0,
    )
    _close(w, [[2.0, 0.5, 0.0], [0.0, 0.0, 0.0]])


def test_bad_arguments_raise():
    with pytest.raises(ValueError, match="rollout_is"):
        compute_rollout_correction(OLD, MU, MASK, rollout_is="geometric")
    with pytest.raises(ValueError, match="rollout_rs"):
        compute_rollout_correction(OLD, MU, MASK, rollout_rs="tok")
    with pytest.raises(ValueError, match="lower <= upper"):
        compute_rollout_correction(
            OLD, MU, MASK, rollout_rs="token", rollout_rs_threshold=1.5, rollout_rs_threshold_lower=2
        )
    with pytest.raises(ValueError, match="same"):
        compute_rollout_correction(OLD, MU[:, :2], MASK)


def test_policy_loss_multiplies_each_token_by_its_weight():
    logp = OLD.clone().requires_grad_(True)
    adv = torch.tensor([1.0, -1.0])
    w, _ = compute_rollout_correction(OLD, MU, MASK, rollout_is="token", rollout_is_threshold=1.5)
    loss, _ = compute_policy_loss(logp, OLD, adv, MASK, rollout_is_weights=w)
    # ratio 1 everywhere: token losses -A * w = (-1.5, -0.5) and (1.5, 1.5, 1.0); token-mean over 5 tokens
    assert loss.item() == pytest.approx((-1.5 - 0.5 + 1.5 + 1.5 + 1.0) / 5)
    loss.backward()
    # d loss / d logp = -A * w * ratio / N
    _close(logp.grad, [[-1.5 / 5, -0.5 / 5, 0.0], [1.5 / 5, 1.5 / 5, 1.0 / 5]])


def test_mismatch_metrics_by_hand():
    stats = MismatchStats()
    stats.add(OLD, MU, MASK)
    m = stats.result()
    lr = [L(2), L(0.5), L(2), L(2), 0.0]  # log pi_train - log mu of the 5 tokens
    assert m["rollout_corr/rollout_is_mean"] == pytest.approx((2 + 0.5 + 2 + 2 + 1) / 5)
    assert m["rollout_corr/rollout_is_max"] == pytest.approx(2.0)
    assert m["rollout_corr/rollout_rs_masked_fraction"] == 0.0
    assert m["rollout_corr/kl"] == pytest.approx(-sum(lr) / 5)
    assert m["rollout_corr/k3_kl"] == pytest.approx(sum(math.exp(x) - x - 1 for x in lr) / 5)
    # per response: mean log-ratio (0 for row 0, 2 ln 2 / 3 for row 1), then the mean over responses
    assert m["rollout_corr/log_ppl_diff"] == pytest.approx((0 + 2 * L(2) / 3) / 2)
    # with IS and RS: the weights in use and the rejected share
    w, kept = compute_rollout_correction(
        OLD, MU, MASK, rollout_is="token", rollout_rs="sequence", rollout_rs_threshold=3.0
    )
    stats = MismatchStats()
    stats.add(OLD, MU, MASK, w, kept)
    m = stats.result()
    assert m["rollout_corr/rollout_rs_masked_fraction"] == pytest.approx(3 / 5)
    assert m["rollout_corr/rollout_is_mean"] == pytest.approx((2 + 0.5) / 5)
    assert MismatchStats().result() == {}


def test_config_validation():
    def check(*overrides):
        validate_config(load_config(None, list(overrides)))

    check(
        "algorithm.rollout_correction.rollout_is=token", "algorithm.rollout_correction.rollout_rs=geometric"
    )
    with pytest.raises(ConfigError, match="rollout_is"):
        check("algorithm.rollout_correction.rollout_is=geo")
    with pytest.raises(ConfigError, match="bypass_mode=true takes pi_old from the engine"):
        check(
            "algorithm.rollout_correction.bypass_mode=true", "algorithm.rollout_correction.rollout_is=token"
        )
    with pytest.raises(ConfigError, match="lower <= upper"):
        check(
            "algorithm.rollout_correction.rollout_rs=token",
            "algorithm.rollout_correction.rollout_rs_threshold=1.5",
            "algorithm.rollout_correction.rollout_rs_threshold_lower=2",
        )


# ------------------------------------------------------------------------------ off-policy sequence masking
def test_off_policy_sequence_mask_by_hand():
    # row 0: mean log(mu / pi) = (ln 2 + 0) / 2 = 0.3466 (the padding's -7 ignored); row 1: (ln 2 + ln 2 + 0) / 3
    # = 0.4621; row 2 the same as row 0 with a positive advantage
    pi = torch.tensor([[L(0.25), L(0.6), 0.0], [L(0.2), L(0.1), L(0.9)], [L(0.25), L(0.6), 0.0]])
    mu = torch.tensor([[L(0.5), L(0.6), -7.0], [L(0.4), L(0.2), L(0.9)], [L(0.5), L(0.6), -7.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    A = torch.tensor([-1.0, -1.0, 1.0])
    # delta 0.4: only row 1 drifted far enough; row 2 is far but its advantage is positive
    keep = off_policy_sequence_mask(pi, mu, A, mask, 0.4)
    assert keep.tolist() == [[1, 1, 1], [0, 0, 0], [1, 1, 1]]
    # delta 0.3: row 0 too (0.3466 > 0.3)
    assert off_policy_sequence_mask(pi, mu, A, mask, 0.3)[:, 0].tolist() == [0, 0, 1]
    # pi above mu (negative drift) never masks, whatever the advantage
    assert off_policy_sequence_mask(mu, pi, A, mask, 0.0).min().item() == 1.0
    # per-token advantages: only the negative tokens of a drifted response leave
    A_tok = torch.tensor([[-1.0, 1.0, 0.0], [-1.0, -1.0, 2.0], [1.0, 1.0, 0.0]])
    assert off_policy_sequence_mask(pi, mu, A_tok, mask, 0.3).tolist() == [[0, 1, 1], [0, 0, 1], [1, 1, 1]]
    with pytest.raises(ValueError, match="must be the same"):
        off_policy_sequence_mask(pi, mu[:, :2], A, mask, 0.3)


def trl_off_policy_mask(logp, sampling, A, mask, threshold):
    """TRL's `get_off_policy_mask` (huggingface/trl@f2cd577 grpo_trainer.py), re-typed."""
    kl = sampling - logp.detach()
    avg = (kl * mask).sum(1, keepdim=True) / mask.sum(1, keepdim=True).clamp(min=1)
    return ((A.unsqueeze(1) >= 0) | (avg <= threshold)).float()


def test_off_policy_sequence_mask_equals_trls():
    g = torch.Generator().manual_seed(0)
    kept = []
    for _ in range(5):
        logp = -torch.rand(8, 6, generator=g) * 3
        sampling = logp + torch.randn(8, 6, generator=g) * 0.2
        A = torch.randn(8, generator=g)
        mask = (torch.arange(6) < torch.randint(1, 7, (8,), generator=g)[:, None]).float()
        ours = off_policy_sequence_mask(logp, sampling, A, mask, 0.05)
        assert torch.equal(ours, trl_off_policy_mask(logp, sampling, A, mask, 0.05).expand_as(ours))
        kept += ours[:, 0].tolist()
    assert 0 < sum(kept) < len(kept)  # both outcomes occur


# ------------------------------------------------------------------------------------------ the real actor
def _tiny(path):
    return save_tiny_checkpoint(path, seed=3)


def _batch(tok, minibatches=1):
    prompts = [tok(p)["input_ids"] for p in ["1 + 2 =\n", "30 - 4 =\n", "7 =\n", "2 + 2 + 2 =\n"]]
    responses = [tok(r)["input_ids"] + [tok.eos_token_id] for r in ["Answer: 3", "26", "Answer: 8", "6"]]
    mb = [i % minibatches for i in range(4)]
    return TrainBatch.build(
        prompts,
        responses,
        torch.tensor([1.0, -1.0, 0.5, -0.5]),
        torch.ones(4),
        tok.pad_token_id,
        minibatch=mb,
    )


def _update(path, batch, rc: RolloutCorrectionConfig, mu_shift=None, epochs=1):
    actor = Actor(
        str(path),
        ActorConfig(ppo_micro_batch_size=3, lr=1e-2, grad_clip=1e9, ppo_epochs=epochs),
        AlgorithmConfig(rollout_correction=rc),
        temperature=0.8,
    )
    mu = actor.compute_log_prob(batch)  # the engine agreeing exactly with the trainer
    if mu_shift is not None:
        mu = mu + mu_shift * batch.response_mask
    batch.rollout_log_prob = mu
    metrics = actor.update(batch)
    return metrics, {k: v.clone() for k, v in actor.model.state_dict().items()}


def _same_params(a, b):
    assert all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)


def test_actor_is_weights_of_one_change_nothing(tmp_path):
    tok = _tiny(tmp_path)
    m0, p0 = _update(tmp_path, _batch(tok), RolloutCorrectionConfig())
    m1, p1 = _update(tmp_path, _batch(tok), RolloutCorrectionConfig(rollout_is="token"))
    _same_params(p0, p1)
    assert m1["rollout_corr/rollout_is_mean"] == pytest.approx(1.0, abs=1e-5)
    assert m1["rollout_corr/k3_kl"] == pytest.approx(0.0, abs=1e-6)
    assert m0["rollout_corr/rollout_is_max"] == pytest.approx(
        1.0, abs=1e-5
    )  # metrics without a correction too
    assert m1["time/old_log_prob_s"] > 0 and m0["time/old_log_prob_s"] == 0.0  # on-policy: no recompute


def test_actor_rejection_equals_masking_the_rejected_row(tmp_path):
    tok = _tiny(tmp_path)
    batch = _batch(tok)
    shift = torch.zeros(4, 1)
    shift[1] = math.log(3.0)  # mu three times pi_old on every token of row 1: its token ratio is 1/3
    rc = RolloutCorrectionConfig(rollout_rs="token", rollout_rs_threshold=2.0)
    m, p = _update(tmp_path, batch, rc, mu_shift=shift)
    masked = _batch(tok)
    masked.response_mask[1] = 0.0
    _, p_ref = _update(tmp_path, masked, RolloutCorrectionConfig())
    _same_params(p, p_ref)
    n_row1 = float(_batch(tok).response_mask[1].sum())
    assert m["rollout_corr/rollout_rs_masked_fraction"] == pytest.approx(
        n_row1 / float(_batch(tok).response_mask.sum())
    )


def test_actor_bypass_mode_skips_the_recompute_and_matches_it(tmp_path):
    tok = _tiny(tmp_path)
    # two mini-batches: the decoupled path recomputes pi_old; bypass takes mu (here equal to it) instead
    m_re, p_re = _update(tmp_path, _batch(tok, 2), RolloutCorrectionConfig())
    m_by, p_by = _update(tmp_path, _batch(tok, 2), RolloutCorrectionConfig(bypass_mode=True))
    _same_params(p_re, p_by)
    assert m_re["time/old_log_prob_s"] > 0 and m_by["time/old_log_prob_s"] == 0.0
    with pytest.raises(ValueError, match="sampling log-probs"):
        actor = Actor(
            str(tmp_path),
            ActorConfig(),
            AlgorithmConfig(rollout_correction=RolloutCorrectionConfig(bypass_mode=True)),
        )
        actor.update(_batch(tok))


def test_actor_off_policy_mask_equals_zeroing_the_drifted_negative_rows_loss(tmp_path):
    tok = _tiny(tmp_path)
    shift = torch.zeros(4, 1)
    shift[1] = 0.5  # the engine gave row 1 (A = -1) e^0.5 times the trainer's probability on every token
    rc = RolloutCorrectionConfig(off_policy_mask_threshold=0.1)
    m, p = _update(tmp_path, _batch(tok), rc, mu_shift=shift)
    # the same update with row 1's loss zeroed but its tokens still in the token-mean's normaliser: its
    # advantage 0 does exactly that
    ref = _batch(tok)
    ref.advantages[1] = 0.0
    _, p_ref = _update(tmp_path, ref, RolloutCorrectionConfig(), mu_shift=shift)
    _same_params(p, p_ref)
    n_row1 = float(_batch(tok).response_mask[1].sum())
    assert m["actor/opsm_masked_fraction"] == pytest.approx(n_row1 / float(_batch(tok).response_mask.sum()))
    # the same drift on a positive row (row 0) masks nothing: the update is the unmasked one
    shift = torch.zeros(4, 1)
    shift[0] = 0.5
    m, p = _update(tmp_path, _batch(tok), rc, mu_shift=shift)
    _, p_ref = _update(tmp_path, _batch(tok), RolloutCorrectionConfig(), mu_shift=shift)
    _same_params(p, p_ref)
    assert m["actor/opsm_masked_fraction"] == 0.0
    for bad in ("nan", "-1"):  # a negative threshold would mask every negative response on-policy
        with pytest.raises(
            ConfigError, match=f"off_policy_mask_threshold={bad}.* must be a finite number >= 0"
        ):
            load_config(None, [f"algorithm.rollout_correction.off_policy_mask_threshold={bad}"])


def test_truncated_sampling_bias_is_named_where_the_engines_logprobs_are_used():
    """Issue 42 item 4: with top-p/top-k and engine log-probs standing in (async, bypass, IS), the transformers
    engine's untruncated log-probs bias the ratio: one warning naming it; vLLM reports processed log-probs (none);
    untruncated sampling, or a run that recomputes pi_old and uses mu nowhere, gets none either."""
    from dapo_rl.algo.rollout_correction import truncated_sampling_bias

    msg = truncated_sampling_bias("hf", 0.9, -1, engine_logprobs_stand_in=True)
    assert msg.startswith(
        "rollout.top_p=0.9 / rollout.top_k=-1: the hf engine reports log-probs of the untruncated"
    )
    assert truncated_sampling_bias("hf", 1.0, 20, engine_logprobs_stand_in=True) is not None
    assert truncated_sampling_bias("vllm", 0.9, 20, engine_logprobs_stand_in=True) is None
    assert truncated_sampling_bias("hf", 1.0, -1, engine_logprobs_stand_in=True) is None
    assert truncated_sampling_bias("hf", 1.0, 0, engine_logprobs_stand_in=True) is None
    assert truncated_sampling_bias("hf", 0.7, 5, engine_logprobs_stand_in=False) is None
