"""The KL term to a reference policy (`algorithm.use_kl_loss`) and ProRL's reference resets: the estimators by hand
and against verl's formulas, and the real actor (the reference, its resets, its checkpoint)."""

from __future__ import annotations

import math

import pytest
import torch

from dapo_rl.actor import Actor, TrainBatch
from dapo_rl.algo.kl import KL_ESTIMATORS, kl_penalty
from dapo_rl.config import ActorConfig, AlgorithmConfig, ConfigError, load_config
from dapo_rl.models.tiny import save_tiny_checkpoint

X = math.log(0.5)  # log pi_ref - log pi_theta with pi_theta = 0.5, pi_ref = 0.25


@pytest.mark.parametrize(
    "kind,value,grad",
    [
        ("k1", -X, 1.0),  # lp - ref; d/d lp = 1
        ("kl", -X, 1.0),
        ("abs", -X, 1.0),
        ("k2", 0.5 * X * X, -X),  # x^2 / 2; d/d lp = -x
        ("mse", 0.5 * X * X, -X),
        ("k3", 0.5 - X - 1.0, 1.0 - 0.5),  # e^x - x - 1 = 0.1931; d/d lp = 1 - e^x
        ("low_var_kl", 0.5 - X - 1.0, 0.5),
        ("k3+", 0.5 - X - 1.0, -X),  # k3's value, k2's gradient
        ("k1+", -X, -X),
    ],
)
def test_estimators_by_hand(kind, value, grad):
    lp = torch.tensor([[math.log(0.5)]], dtype=torch.float64, requires_grad=True)
    ref = torch.tensor([[math.log(0.25)]], dtype=torch.float64)
    out = kl_penalty(lp, ref, kind)
    out.sum().backward()
    assert out.item() == pytest.approx(value, abs=1e-12)
    assert lp.grad.item() == pytest.approx(grad, abs=1e-12)


def verl_kl_penalty(lp, ref, kind):
    """verl's `kl_penalty` (verl-project/verl@1dda039 core_algos.py), re-typed."""
    base = kind.rstrip("+")
    if base in ("kl", "k1"):
        fwd = lp - ref
    elif base == "abs":
        fwd = (lp - ref).abs()
    elif base in ("mse", "k2"):
        fwd = 0.5 * (lp - ref).square()
    else:
        kl = torch.clamp(ref - lp, min=-20, max=20)
        fwd = torch.clamp(torch.exp(kl) - kl - 1, min=-10, max=10)
    if not kind.endswith("+"):
        return fwd
    b = 0.5 * (lp - ref).square()
    return b - b.detach() + fwd.detach()


def test_every_estimator_equals_verls_and_the_clamps_bind():
    g = torch.Generator().manual_seed(0)
    lp0 = -torch.rand(5, 7, generator=g, dtype=torch.float64) * 4
    ref = lp0 + torch.randn(5, 7, generator=g, dtype=torch.float64) * 2
    ref[0, 0] = lp0[0, 0] + 30.0  # k3's exp clamp at 20 and its value clamp at 10
    for kind in KL_ESTIMATORS:
        ours_lp, peer_lp = lp0.clone().requires_grad_(), lp0.clone().requires_grad_()
        ours, theirs = kl_penalty(ours_lp, ref, kind), verl_kl_penalty(peer_lp, ref, kind)
        (ours * torch.arange(35.0, dtype=torch.float64).view(5, 7)).sum().backward()
        (theirs * torch.arange(35.0, dtype=torch.float64).view(5, 7)).sum().backward()
        assert torch.allclose(ours, theirs, atol=1e-9), kind
        assert torch.allclose(ours_lp.grad, peer_lp.grad, atol=1e-9), kind
    assert kl_penalty(lp0, ref, "k3")[0, 0].item() == 10.0
    with pytest.raises(ValueError, match="unknown kl_loss_type 'k4'"):
        kl_penalty(lp0, ref, "k4")


@pytest.mark.parametrize(
    "overrides,message",
    [
        (["algorithm.ref_reset_freq=5"], "algorithm.ref_reset_freq=5 resets the KL term's reference"),
        (
            ["algorithm.use_kl_loss=true", "algorithm.kl_loss_type=k4"],
            "algorithm.kl_loss_type='k4' is not one of",
        ),
        (["algorithm.use_kl_loss=true", "algorithm.kl_loss_coef=-1"], "algorithm.kl_loss_coef=-1.0 must be"),
        (
            ["algorithm.use_kl_loss=true", "algorithm.ref_reset_freq=-1"],
            "algorithm.ref_reset_freq=-1 must be >= 0",
        ),
        # refused when the config is read: `dapo plan` / `dapo train` stop before any model loads
        (["algorithm.use_kl_loss=true", "actor.lora.rank=4"], "algorithm.use_kl_loss=true with LoRA"),
    ],
)
def test_bad_settings_are_config_errors(overrides, message):
    with pytest.raises(ConfigError, match=message.replace(".", r"\.").replace("'", ".")):
        load_config(None, overrides)


# ------------------------------------------------------------------------------------------ the real actor
def _batch():
    return TrainBatch.build(
        [[1, 2, 3], [1, 2, 3], [4, 5], [4, 5]],
        [[6, 7, 8], [9, 10], [11, 12, 13], [14]],
        torch.tensor([1.0, -1.0, 0.5, -0.5]),
        torch.ones(4),
        257,
    )


def _actor(path, **algo) -> Actor:
    return Actor(
        str(path), ActorConfig(ppo_micro_batch_size=4, lr=1e-2, grad_clip=1e9), AlgorithmConfig(**algo)
    )


def _params(actor):
    return {k: v.detach().clone() for k, v in actor.model.state_dict().items()}


def test_the_first_update_against_the_initial_reference_is_the_plain_one(tmp_path):
    """The policy is the reference at the start: k3's value and gradient are 0 there, so the first update equals
    the update without the KL term; the second sees the policy moved (KL > 0) and differs."""
    save_tiny_checkpoint(tmp_path, seed=4)
    plain, kl = _actor(tmp_path), _actor(tmp_path, use_kl_loss=True, kl_loss_coef=1.0)
    m_plain, m_kl = plain.update(_batch()), kl.update(_batch())
    assert m_kl["actor/kl_loss"] == pytest.approx(0.0, abs=1e-9) and "actor/kl_loss" not in m_plain
    p_plain, p_kl = _params(plain), _params(kl)
    assert all(torch.allclose(p_plain[k], p_kl[k], atol=1e-7) for k in p_plain)
    m_plain, m_kl = plain.update(_batch()), kl.update(_batch())
    assert m_kl["actor/kl_loss"] > 1e-6 and m_kl["actor/ref_reset"] == 0.0 and m_kl["actor/kl_coef"] == 1.0
    p_plain, p_kl = _params(plain), _params(kl)
    assert any(not torch.allclose(p_plain[k], p_kl[k], atol=1e-6) for k in p_plain)
    # the reference stayed the initial model
    ref = kl.reference.model.state_dict()
    init = _actor(tmp_path).model.state_dict()
    assert all(torch.equal(ref[k], init[k]) for k in init)


def test_a_reset_makes_the_reference_the_current_policy_and_clears_adams_state(tmp_path):
    save_tiny_checkpoint(tmp_path, seed=4)
    actor = _actor(tmp_path, use_kl_loss=True, kl_loss_coef=1.0, ref_reset_freq=2)
    steps = []
    for _ in range(4):
        m = actor.update(_batch())
        state = next(iter(actor.optimizer.state.values()))
        steps.append((m["actor/ref_reset"], round(m["actor/kl_loss"], 9) == 0.0, int(state["step"])))
    # updates 1 and 3 start from a reference equal to the policy (the initial one, then the reset): KL 0; Adam's
    # step count starts again at the reset
    assert steps == [(0.0, True, 1), (0.0, False, 2), (1.0, True, 1), (0.0, False, 2)]
    assert m["time/ref_log_prob_s"] > 0
    # a save while the state is empty (right after a reset) leaves it empty: torch's get_state_dict fills it with a
    # zero-lr step, which would shrink the next real step
    actor.optimizer.state.clear()
    actor.save(tmp_path / "ckpt")
    assert not actor.optimizer.state


def test_the_reference_is_saved_and_restored_with_the_checkpoint(tmp_path):
    model_dir = tmp_path / "model"
    save_tiny_checkpoint(model_dir, seed=4)
    actor = _actor(model_dir, use_kl_loss=True, ref_reset_freq=1)
    for _ in range(3):
        actor.update(_batch())
    actor.save(tmp_path / "ckpt")
    saved_ref = {k: v.clone() for k, v in actor.reference.model.state_dict().items()}
    init = _actor(model_dir).model.state_dict()
    assert any(not torch.equal(saved_ref[k], init[k]) for k in init)  # reset away from the initial model
    back = _actor(model_dir, use_kl_loss=True, ref_reset_freq=1)
    back.load(tmp_path / "ckpt")
    assert all(torch.equal(back.reference.model.state_dict()[k], saved_ref[k]) for k in saved_ref)
    assert back.scheduler.last_epoch == 3
    # a checkpoint without a reference cannot resume a run with the KL term
    _actor(model_dir).save(tmp_path / "plain")
    with pytest.raises(ConfigError, match="written without a reference policy"):
        _actor(model_dir, use_kl_loss=True).load(tmp_path / "plain")


def test_lora_with_the_kl_term_is_refused(tmp_path):
    from dapo_rl.config import LoraConfig

    save_tiny_checkpoint(tmp_path, seed=4)
    with pytest.raises(ConfigError, match="use_kl_loss=true with LoRA"):
        Actor(
            str(tmp_path),
            ActorConfig(lora=LoraConfig(rank=4, target_modules=["q_proj"])),
            AlgorithmConfig(use_kl_loss=True),
        )


@pytest.mark.slow
def test_dapo_train_with_the_kl_term_resets_and_resumes(base_model, tmp_path):
    """`dapo train` with the KL term, a reset every 2 steps, SAPO, off-policy masking and batch-std advantages (this
    issue's wiring in one run; `actor.lm_head_fp32` rides along, a no-op in this fp32 run), killed in step 4 and
    resumed from step 2's checkpoint: the reference comes back from the checkpoint and the reset still falls on
    step 3."""
    from e2e import FAULT, dapo, rows_of

    run = tmp_path / "run"
    args = [
        "train",
        f"model.path={base_model}",
        f"trainer.output_dir={run}",
        "data.train_reasoning_gym.size=500",
        "data.val_reasoning_gym.size=16",
        "data.train_batch_size=8",
        "data.gen_batch_size=8",
        "rollout.n=4",
        "actor.ppo_mini_batch_size=4",
        "data.max_response_length=16",
        "algorithm.overlong_buffer.len=4",
        "algorithm.filter_groups.enable=false",
        "algorithm.use_kl_loss=true",
        "algorithm.kl_loss_coef=0.01",
        "algorithm.ref_reset_freq=2",
        "algorithm.policy_loss.loss_mode=sapo",
        "algorithm.rollout_correction.off_policy_mask_threshold=0.0001",
        "algorithm.adv_estimator=grpo_batch_std",
        "actor.lm_head_fp32=true",
        "trainer.total_training_steps=4",
        "trainer.save_freq=2",
        "trainer.test_freq=-1",
        "trainer.progress_bar=false",
    ]
    r = dapo(*args, env_extra={FAULT: "update:4"})
    assert r.returncode == -9, r.stderr[-3000:]
    r = dapo(*args, "--resume")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "at step 2" in r.stdout + r.stderr
    rows = {x["step"]: x for x in rows_of(run) if x["step"] > 0}
    assert sorted(rows) == [1, 2, 3, 4]
    assert [rows[s]["train/ref_reset"] for s in (1, 2, 3, 4)] == [0.0, 0.0, 1.0, 0.0]
    # two mini-batches a step: the first starts at the reference on steps 1 and 3 (KL 0), the second has moved;
    # on steps 2 and 4 both have moved away from it
    assert all(rows[s]["train/kl_loss"] >= 0 for s in rows) and rows[2]["train/kl_loss"] > 0
    assert (
        rows[1]["train/kl_loss"]
        < rows[2]["train/kl_loss"]
        > rows[3]["train/kl_loss"]
        < rows[4]["train/kl_loss"]
    )
    assert all(0 <= rows[s]["train/opsm_masked_fraction"] <= 1 for s in rows)
