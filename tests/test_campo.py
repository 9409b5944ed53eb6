"""CAMPO's staged length limits: the schedule by hand, its config errors, and a real `dapo train` through three
stages with a crash and a resume in the middle of one."""

import pytest
from e2e import FAULT, dapo, rows_of

from dapo_rl.campo import CampoSchedule
from dapo_rl.config import CampoConfig, CampoStageConfig, ConfigError, load_config


def _campo():
    return CampoConfig(
        enable=True,
        stages=[
            CampoStageConfig(max_response_length=8, steps=2, clip_ratio_high=0.3),
            CampoStageConfig(max_response_length=16, end_on_saturation=True),
            CampoStageConfig(max_response_length=24),
        ],
        saturation_window=2,
        saturation_clip_ratio=0.1,
        saturation_length_ratio=0.5,
    )


def test_stages_by_hand():
    cfg = load_config(None, ["data.max_response_length=24", "algorithm.overlong_buffer.len=4"])
    s = CampoSchedule(_campo())
    first = s.stage_config(cfg)
    assert first.data.max_response_length == 8 and first.algorithm.clip_ratio_high == 0.3
    assert first.algorithm.clip_ratio_low == cfg.algorithm.clip_ratio_low == 0.2  # null: the run's own
    assert cfg.data.max_response_length == 24  # the run's config is not changed
    assert s.observe(1, 1.0, 8.0) is None and s.metrics() == {
        "campo/stage": 1,
        "campo/max_response_length": 8,
    }
    assert (
        s.observe(2, 1.0, 8.0)
        == "campo: stage 1 ended at step 2 (after its 2 steps); stage 2: max_response_length 16"
    )
    assert (s.stage, s.stage_start, s.recent) == (1, 2, [])
    # stage 2 ends on saturation: the mean of its last 2 steps, truncated share >= 0.1 and length >= 0.5 x 16
    assert s.observe(3, 0.2, 9.0) is None  # one step: the window is not full yet
    assert s.observe(4, 0.05, 6.0) is None  # means 0.125 and 7.5 < 8
    note = s.observe(5, 0.1, 11.0)  # means 0.075 < 0.1
    assert note is None
    note = s.observe(6, 0.2, 12.0)  # means 0.15 and 11.5
    assert note == (
        "campo: stage 2 ended at step 6 (saturated: over the last 2 steps 15.0% truncated, mean length 11.5 of 16); "
        "stage 3: max_response_length 24"
    )
    assert (
        s.stage_config(cfg).data.max_response_length == 24
        and s.stage_config(cfg).algorithm.clip_ratio_high == 0.28
    )
    for step in range(7, 50):
        assert s.observe(step, 1.0, 24.0) is None  # the last stage never ends
    restored = CampoSchedule(_campo())
    restored.load_state_dict(s.state_dict())
    assert (restored.stage, restored.stage_start, restored.recent) == (2, 6, s.recent)
    with pytest.raises(ValueError, match="stage 4 but algorithm.campo.stages has 3"):
        restored.load_state_dict({"stage": 3})


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["algorithm.campo.enable=true"], "needs algorithm.campo.stages"),
        (
            [
                "algorithm.campo.enable=true",
                "algorithm.campo.stages=[{max_response_length: 8},{max_response_length: 16}]",
            ],
            r"stages\[0\] never ends",
        ),
        (
            ["algorithm.campo.enable=true", "algorithm.campo.stages=[{max_response_length: 64}]"],
            r"stages\[0\].max_response_length=64 must be in \(0, data.max_response_length=16\]",
        ),
        (
            ["algorithm.campo.enable=true", "algorithm.campo.stages=[{max_response_length: 3}]"],
            r"overlong_buffer.len=4 is longer than algorithm.campo.stages\[0\].max_response_length=3",
        ),
    ],
)
def test_bad_stages_name_the_setting(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, ["data.max_response_length=16", "algorithm.overlong_buffer.len=4", *overrides])


@pytest.mark.slow
def test_three_stages_with_a_crash_and_resume_mid_stage(base_model, tmp_path):
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
        "actor.ppo_mini_batch_size=8",
        "data.max_response_length=16",
        "algorithm.overlong_buffer.len=4",
        "algorithm.filter_groups.enable=false",
        "reward.repetition_penalty.enable=true",
        "algorithm.campo.enable=true",
        "algorithm.campo.stages=[{max_response_length: 8, steps: 2},"
        "{max_response_length: 12, steps: 3, clip_ratio_high: 0.2},{max_response_length: 16}]",
        "trainer.total_training_steps=6",
        "trainer.save_freq=2",
        "trainer.test_freq=-1",
        "trainer.progress_bar=false",
    ]
    # killed in step 5 (stage 2's last), after its update, before anything was written: resumed from step 4
    r = dapo(*args, env_extra={FAULT: "update:5"})
    assert r.returncode == -9, r.stderr[-3000:]
    assert "campo: stage 1 ended at step 2 (after its 2 steps); stage 2: max_response_length 12" in r.stdout
    r = dapo(*args, "--resume")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "resumed from" in r.stdout + r.stderr and "at step 4" in r.stdout + r.stderr
    assert "campo: stage 2 ended at step 5 (after its 3 steps); stage 3: max_response_length 16" in r.stdout
    rows = [x for x in rows_of(run) if x["step"] > 0]
    assert [x["step"] for x in rows] == [1, 2, 3, 4, 5, 6]
    assert [x["campo/stage"] for x in rows] == [1, 1, 2, 2, 2, 3]
    assert [x["campo/max_response_length"] for x in rows] == [8, 8, 12, 12, 12, 16]
    # the stage's clip bounds reached each update (stage 2 sets clip_ratio_high 0.2; the others keep the run's)
    assert [x["campo/clip_ratio_high"] for x in rows] == [0.28, 0.28, 0.2, 0.2, 0.2, 0.28]
    assert {x["campo/clip_ratio_low"] for x in rows} == {0.2}
    for x in rows:  # sampling obeyed each stage's limit
        assert x["train/response_length_max"] <= x["campo/max_response_length"]
    assert rows[0]["train/response_clip_ratio"] == 1.0  # "Answer: N" does not fit in 8 tokens
    assert (run / "training_dynamics.png").stat().st_size > 10_000


def test_the_stages_clip_bounds_reach_the_loss_through_the_update(tmp_path):
    """`Actor.update(clip_ratio=...)` (what the trainer passes from the CAMPO stage): two mini-batches, so the second
    step's ratio moves away from 1; with epsilon_high 0 every positive-advantage token whose ratio rose is clipped,
    with the run's own bounds (None) the update equals one given them explicitly."""
    import torch

    from dapo_rl.actor import Actor, TrainBatch
    from dapo_rl.config import ActorConfig, AlgorithmConfig
    from dapo_rl.models.tiny import save_tiny_checkpoint

    tok = save_tiny_checkpoint(tmp_path, seed=5)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 250, (6,), generator=g).tolist() for _ in range(8)]
    responses = [torch.randint(0, 250, (12,), generator=g).tolist() for _ in range(8)]
    batch = TrainBatch.build(
        prompts,
        responses,
        torch.linspace(-1, 1, 8),
        torch.ones(8),
        tok.pad_token_id,
        minibatch=[0] * 4 + [1] * 4,
    )
    batch.num_minibatches = 2

    def update(clip_ratio):
        torch.manual_seed(0)
        actor = Actor(str(tmp_path), ActorConfig(lr=1e-2, ppo_micro_batch_size=8), AlgorithmConfig())
        return actor.update(batch, clip_ratio=clip_ratio)

    default, explicit = update(None), update((0.2, 0.28))
    assert {k: v for k, v in default.items() if not k.startswith("time/")} == {
        k: v for k, v in explicit.items() if not k.startswith("time/")
    }
    tight, loose = update((0.2, 0.0)), update((0.2, 1e6))
    assert tight["actor/pg_clipfrac_upper"] > 0 and loose["actor/pg_clipfrac_upper"] == 0
    assert tight["actor/pg_loss"] != loose["actor/pg_loss"]
