"""Config: recipes, dotted overrides, unknown keys with suggestions, validation."""

import re
from pathlib import Path

import pytest

from dapo_rl.config import Config, ConfigError, load_config, to_yaml

REPO = Path(__file__).resolve().parents[1]


def test_embedded_default_recipe_loads():
    cfg = load_config()
    assert cfg.model.path == "embedded"
    assert cfg.data.train_reasoning_gym.task == "chain_sum"
    assert cfg.data.val_reasoning_gym.size >= 500
    # reasoning-gym generates item i from seed + i: validation's seed range overlaps neither training's nor the
    # warm-up's (those two do overlap: the warm-up saw the RL problems 1,000-19,999 with their answers)
    val = cfg.data.val_reasoning_gym
    for t in (cfg.data.train_reasoning_gym, cfg.sft.task):
        assert t.seed + t.size <= val.seed or val.seed + val.size <= t.seed
    assert cfg.data.val_exclude_train_prompts
    assert cfg.algorithm.clip_ratio_low == 0.2 and cfg.algorithm.clip_ratio_high == 0.28


def test_configs_dir_at_repo_root_holds_the_shipped_recipes():
    assert (REPO / "configs" / "tiny_chain_sum.yaml").is_file()
    cfg = load_config(str(REPO / "configs" / "tiny_chain_sum.yaml"))
    assert cfg == load_config("tiny_chain_sum")


def test_dotted_overrides_are_typed():
    cfg = load_config(
        None, ["algorithm.clip_ratio_high=0.3", "rollout.n=4", "data.val_files=[a.parquet,b.jsonl]"]
    )
    assert cfg.algorithm.clip_ratio_high == 0.3
    assert cfg.rollout.n == 4
    assert cfg.data.val_files == ["a.parquet", "b.jsonl"]


def test_unknown_key_suggests_close_match():
    with pytest.raises(
        ConfigError, match=r"unknown config key 'algorithm.clip_ratio_hgh'.*algorithm.clip_ratio_high"
    ):
        load_config(None, ["algorithm.clip_ratio_hgh=0.3"])


def test_key_in_wrong_section_suggests_right_section():
    with pytest.raises(ConfigError, match=r"actor.clip_ratio_high.*did you mean algorithm.clip_ratio_high"):
        load_config(None, ["actor.clip_ratio_high=0.3"])


def test_unknown_key_in_recipe_file_names_the_file(tmp_path):
    p = tmp_path / "r.yaml"
    p.write_text("trainer:\n  total_steps: 3\n")
    with pytest.raises(ConfigError, match=r"trainer.total_steps.*r.yaml.*trainer.total_training_steps"):
        load_config(str(p))


def test_wrong_type_is_a_config_error():
    with pytest.raises(ConfigError, match="rollout.n"):
        load_config(None, ["rollout.n=many"])


@pytest.mark.parametrize(
    "override, message",
    [
        ("algorithm.loss_agg_mode=seq-mean", "loss_agg_mode"),
        ("data.train_batch_size=33", "multiple of actor.ppo_mini_batch_size"),
        ("algorithm.clip_ratio_c=1.0", "clip_ratio_c"),
        ("algorithm.filter_groups.on_exhausted=ignore", "on_exhausted"),
        ("algorithm.filter_groups.skip_solved=-1", "skip_solved=-1 must be >= 0"),
        ("rollout.temperature=0", "greedy"),
        ("data.gen_batch_size=16", r"data.gen_batch_size=16 must be >= data.train_batch_size=32"),
        ("trainer.max_consecutive_bad_steps=-1", "trainer.max_consecutive_bad_steps=-1 must be >= 0"),
        # NaN passes a refusal written `<= 0`; inf overflows the per-answer timer
        ("reward.timeout_s=nan", r"^reward.timeout_s=nan must be a finite number > 0 and <= 86400$"),
        ("reward.timeout_s=inf", r"^reward.timeout_s=inf must be a finite number > 0 and <= 86400$"),
        ("reward.timeout_s=0", r"^reward.timeout_s=0.0 must be a finite number > 0 and <= 86400$"),
        # the pool's waits overflow the OS timer near 2.1e6 s; 100000 workers would start for hours
        ("reward.timeout_s=3e6", r"^reward.timeout_s=3000000.0 must be a finite number > 0 and <= 86400$"),
        (
            "reward.num_workers=100000",
            r"^reward.num_workers=100000 must be >= 0 \(0: score in this process\) and <= 512$",
        ),
        (
            "episode.name=tool_loop",
            r"^episode.name='tool_loop' is not one of single_turn, tool, or module:Class \(your own episode type\)$",
        ),
        # a zero threshold divided by zero here (ZeroDivisionError) before it was refused
        (
            "algorithm.rollout_correction.rollout_is_threshold=0",
            r"^algorithm.rollout_correction: thresholds must be > 0",
        ),
        ("rollout.temperature=nan", r"^rollout.temperature=nan must be a finite number >= 0$"),
        ("rollout.val_kwargs.temperature=nan", r"^rollout.val_kwargs.temperature=nan must be"),
        ("algorithm.clip_ratio_c=nan", r"^algorithm.clip_ratio_c=nan must be a number > 1$"),
        ("algorithm.clip_ratio_high=nan", r"^algorithm.clip_ratio_high=nan must be a number >= 0$"),
        ("algorithm.loss_scale_factor=nan", r"^algorithm.loss_scale_factor=nan must be a finite number > 0$"),
        ("actor.lr=nan", r"^actor.lr=nan must be a finite number >= 0$"),
        ("trainer.save_freq=-5", r"^trainer.save_freq=-5 must be >= 1, or -1 \(only the last step\)$"),
        ("trainer.test_freq=-2", r"^trainer.test_freq=-2 must be >= 1, or -1 \(off\)$"),
        ("sft.save_freq=-1", r"^sft.save_freq=-1 must be >= 0 \(0: no checkpoints\)$"),
    ],
)
def test_invalid_values_name_the_setting(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, [override])


def test_a_removed_option_says_it_was_removed():
    with pytest.raises(
        ConfigError,
        match="'algorithm.filter_groups.prioritize' in command-line overrides: removed "
        r"from dapo-rl on 2026-12-03; docs/zero-waste.md keeps its figures and `git checkout e4b2aa5`",
    ):
        load_config(None, ["algorithm.filter_groups.prioritize=true"])


def test_override_without_equals_sign():
    with pytest.raises(ConfigError, match="key=value"):
        load_config(None, ["rollout.n"])


def test_resolved_yaml_round_trips(tmp_path):
    cfg = load_config(None, ["actor.lr=3e-5"])
    p = tmp_path / "config.yaml"
    p.write_text(to_yaml(cfg))
    assert load_config(str(p)) == cfg
    assert isinstance(cfg, Config)


def test_a_name_from_another_section_is_suggested_first():
    with pytest.raises(ConfigError, match=r"'rollout.lr'.*did you mean actor.lr"):
        load_config(None, ["rollout.lr=1e-5"])


def test_a_setting_given_without_equals_sign_as_first_argument():
    with pytest.raises(ConfigError, match=r"write it as key=value"):
        load_config("trainer.total_training_steps", ["1"])


def test_a_list_setting_given_without_brackets_says_how_to_write_it():
    with pytest.raises(ConfigError, match=r"data.train_files.*key=\[a,b\]") as e:
        load_config(None, ["data.train_files=/x.jsonl"])
    assert "\n" not in str(e.value)


def test_a_single_setting_given_a_list_says_it_takes_one_value():
    with pytest.raises(
        ConfigError, match=r"rollout.n: Value '\[8\]' is a list; this setting takes one value"
    ):
        load_config(None, ["rollout.n=[8]"])


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            ["async_training=1"],
            r"async_training is a section of settings, not a setting: .*async_training.max_st",
        ),
        (["trainer={}"], "trainer is a section of settings"),
        (["trainer.output_dir=x", "trainer=1"], "trainer is a section of settings"),
        (
            ["trainer=1", "trainer.output_dir=x"],
            r"trainer is given a value and also keys below it \(trainer.outp",
        ),
    ],
)
def test_a_section_given_a_value_is_refused_with_its_name(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, overrides)


def test_a_misspelt_recipe_name_suggests_the_close_one():
    with pytest.raises(ConfigError) as e:
        load_config("dapo_qwen2.5_32bb", [])
    msg = str(e.value)
    assert msg.startswith(
        "no recipe named 'dapo_qwen2.5_32bb' (did you mean dapo_qwen2.5_32b?); shipped recipes:"
    )
    assert "key=value" not in msg
    with pytest.raises(ConfigError, match=r"no recipe named 'rollout.n'; shipped .* write it as key=value"):
        load_config("rollout.n", [])


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            ["actor.shared_prefix=true", "actor.use_remove_padding=true"],
            "actor.shared_prefix=true needs the padded",
        ),
        (
            ["actor.shared_prefix=true", "actor.gradient_checkpointing=true"],
            "no actor.gradient_checkpointing",
        ),
        (["model.attn_implementation="], "model.attn_implementation"),
    ],
)
def test_speed_settings_that_cannot_work_fail_at_load(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, overrides)
    # null lets the actor decide; false always works
    load_config(None, ["actor.shared_prefix=false", "actor.use_remove_padding=true"])


def test_a_recipe_builds_on_a_base(tmp_path):
    campo = load_config("tiny_campo")
    steps = load_config("tiny_chain_steps")
    assert campo.sft == steps.sft and campo.data == steps.data  # the same task and warm-up model
    assert campo.algorithm.overlong_buffer.len == 8 and steps.algorithm.overlong_buffer.len == 16
    assert [s.max_response_length for s in campo.algorithm.campo.stages] == [24, 36, 48]
    (tmp_path / "a.yaml").write_text("base: b.yaml\nactor: {lr: 3.0e-5}\n")
    (tmp_path / "b.yaml").write_text("base: tiny_chain_sum\nactor: {lr: 1.0e-5, weight_decay: 0.5}\n")
    cfg = load_config(str(tmp_path / "a.yaml"), ["trainer.seed=7"])
    assert (cfg.actor.lr, cfg.actor.weight_decay, cfg.trainer.seed) == (3.0e-5, 0.5, 7)
    assert cfg.data.max_response_length == load_config("tiny_chain_sum").data.max_response_length
    (tmp_path / "b.yaml").write_text("base: a.yaml\n")
    with pytest.raises(ConfigError, match=r"recipe base cycle: .*a.yaml -> .*b.yaml -> .*a.yaml"):
        load_config(str(tmp_path / "a.yaml"))
    (tmp_path / "c.yaml").write_text("base: tiny_chain_stepz\n")
    with pytest.raises(
        ConfigError, match=r"base 'tiny_chain_stepz': no recipe named .*did you mean tiny_chain_steps"
    ):
        load_config(str(tmp_path / "c.yaml"))
    (tmp_path / "d.yaml").write_text("base: tiny_chain_steps\nactor: {lrr: 1}\n")
    with pytest.raises(ConfigError, match=r"actor.lrr"):
        load_config(str(tmp_path / "d.yaml"))


def test_bf16_weights_are_refused_where_adamw_steps_would_round_away():
    """A 1e-6 step on a weight of 0.02 is 5e-5 of it, below bf16's half-spacing (2^-9): nothing would train."""
    import torch

    w = torch.tensor(0.02, dtype=torch.bfloat16)
    assert w - 1e-6 == w and w - 1e-4 != w  # the arithmetic behind the threshold
    with pytest.raises(
        ConfigError, match=r"model.dtype=bfloat16 with actor.lr=1e-06: bf16 weights cannot take"
    ):
        load_config(None, ["model.dtype=bfloat16", "actor.lr=1e-6"])
    load_config(None, ["model.dtype=bfloat16", "actor.lr=1e-3"])  # large steps do land


def test_the_engines_gpu_share_defaults_by_where_it_runs():
    """Review async-lora m5: unset, vLLM takes half a GPU it shares with the actor and 0.9 of a GPU of its own
    (asynchronous training); a value set is kept either way; outside [0, 1] is refused."""
    from dapo_rl.config import RolloutConfig, validate_config

    assert RolloutConfig().memory_share(own_gpu=False) == 0.5
    assert RolloutConfig().memory_share(own_gpu=True) == 0.9
    assert RolloutConfig(gpu_memory_utilization=0.7).memory_share(own_gpu=True) == 0.7
    assert (
        load_config(overrides=["rollout.gpu_memory_utilization=0.8"]).rollout.memory_share(own_gpu=False)
        == 0.8
    )
    with pytest.raises(ConfigError, match=r"rollout.gpu_memory_utilization=1.5 must be in \[0, 1\]"):
        validate_config(load_config(overrides=["rollout.gpu_memory_utilization=1.5"]))


def test_non_finite_numbers_are_refused_where_they_would_break_later_but_inf_clip_bounds_are_kept():
    with pytest.raises(ConfigError, match=r"^actor.lora.alpha=nan must be a finite number > 0$"):
        load_config(None, ["actor.lora.rank=4", "actor.lora.alpha=nan"])
    # an infinite clip bound is a way to switch that clip off, as a very large one is
    cfg = load_config(None, ["algorithm.clip_ratio_c=inf", "algorithm.clip_ratio_high=inf"])
    assert cfg.algorithm.clip_ratio_c == float("inf") and cfg.algorithm.clip_ratio_high == float("inf")
    assert load_config(None, ["reward.timeout_s=0.5"]).reward.timeout_s == 0.5
    for key, bound in [  # the rest the review of this change found (grad_clip=nan: NaN weights at step 1)
        ("actor.grad_clip", "> 0"),
        ("actor.weight_decay", ">= 0"),
        ("algorithm.overlong_buffer.penalty_factor", ">= 0"),
        ("rollout.kv_cache_gib", "> 0"),
        ("sft.lr", ">= 0"),
    ]:
        with pytest.raises(ConfigError, match=rf"^{re.escape(key)}=nan must be a finite number {bound}$"):
            load_config(None, [f"{key}=nan"])
    with pytest.raises(ConfigError, match=r"^actor.grad_clip=-1.0 must be a finite number > 0$"):
        load_config(None, ["actor.grad_clip=-1"])


def test_save_and_test_freq_keep_their_documented_off_values():
    for v in (-1, 0, 1, 7):
        cfg = load_config(None, [f"trainer.save_freq={v}", f"trainer.test_freq={v}"])
        assert (cfg.trainer.save_freq, cfg.trainer.test_freq) == (v, v)


@pytest.mark.parametrize(
    "override,says",
    [
        ("algorithm.beta=0.04", "TRL's `beta` is algorithm.kl_loss_coef, with algorithm.use_kl_loss=true"),
        ("scale_rewards=batch", "algorithm.adv_estimator=grpo (group) or grpo_batch_std (batch)"),
        ("algorithm.epsilon_high=0.28", "TRL's `epsilon_high` is algorithm.clip_ratio_high"),
        (
            "algorithm.rollout_correction.opsm_delta=1e-4",
            "is algorithm.rollout_correction.off_policy_mask_threshold",
        ),
        ("actor.cast_lm_head_to_fp32=true", "TRL's `cast_lm_head_to_fp32` is actor.lm_head_fp32"),
    ],
)
def test_a_trl_or_slime_name_is_told_what_it_is_here(override, says):
    with pytest.raises(ConfigError) as e:
        load_config(None, [override])
    key = override.split("=")[0]
    assert str(e.value).startswith(f"unknown config key {key!r} in command-line overrides; ")
    assert says in str(e.value)
