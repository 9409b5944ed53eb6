"""Trainer state that goes into checkpoints: every RNG restores exactly, through torch.load(weights_only=True)."""

import random

import numpy as np
import torch

from dapo_rl.checkpoint import rng_state as _rng_state
from dapo_rl.checkpoint import set_rng_state as _set_rng_state


def test_rng_state_round_trips_through_weights_only_load(tmp_path):
    random.seed(1)
    np.random.seed(2)
    torch.manual_seed(3)
    np.random.normal()  # leave a cached gaussian in numpy's state
    torch.save({"rng": _rng_state()}, tmp_path / "s.pt")
    expect = (random.random(), np.random.normal(), np.random.randint(1 << 30), torch.rand(3))
    random.seed(9)
    np.random.seed(9)
    torch.manual_seed(9)
    _set_rng_state(torch.load(tmp_path / "s.pt", weights_only=True)["rng"])
    got = (random.random(), np.random.normal(), np.random.randint(1 << 30), torch.rand(3))
    assert got[:3] == expect[:3]
    assert torch.equal(got[3], expect[3])


def test_truncate_metrics_keeps_rows_up_to_the_checkpoint_and_drops_a_torn_line(tmp_path):
    from dapo_rl.checkpoint import truncate_metrics

    p = tmp_path / "metrics.jsonl"
    p.write_text('{"step": 0, "a": 1}\n{"step": 1, "a": 2}\n{"step": 2, "a": 3}\n{"step": 3, "a"')
    assert truncate_metrics(p, 1) == 2
    assert p.read_text() == '{"step": 0, "a": 1}\n{"step": 1, "a": 2}\n'
    assert not (tmp_path / "metrics.jsonl.tmp").exists()


def test_resume_config_diff_refuses_meaning_and_allows_harmless_changes(tmp_path):
    from dapo_rl.config import load_config, resume_config_diff, to_yaml

    saved = tmp_path / "config.yaml"
    saved.write_text(to_yaml(load_config(None, [])))
    refused, harmless = resume_config_diff(
        saved, load_config(None, ["actor.lr=2e-4", "trainer.total_training_steps=400", "trainer.seed=1"])
    )
    assert refused == ["actor.lr: 0.0001 -> 0.0002", "trainer.seed: 0 -> 1"]
    assert harmless == ["trainer.total_training_steps: 200 -> 400"]  # the default recipe caps at 200
    assert resume_config_diff(saved, load_config(None, [])) == ([], [])
    # allowed, but not float-order harmless: the warning says what changes
    _, harmless = resume_config_diff(
        saved,
        load_config(None, ["rollout.micro_batch_size=8", "reward.timeout_s=1.5", "trainer.save_freq=7"]),
    )
    assert harmless == [
        "reward.timeout_s: 5.0 -> 1.5 (another set of slow answers times out and scores -1)",
        "rollout.micro_batch_size: 512 -> 8 (the hf engine spends each round's seed over other chunks: other "
        "samples)",
        "trainer.save_freq: 100 -> 7",
    ]


def test_resume_of_a_run_saved_with_removed_options(tmp_path):
    """A run directory written before 2026-12-03 holds the removed zero-waste options in its config.yaml: at their
    old defaults they are ignored with one warning line; one the run set is refused, by name."""
    import pytest

    from dapo_rl.config import REMOVED_OPTIONS, ConfigError, load_config, resume_config_diff, to_yaml

    cfg = load_config(None, [])
    lines = to_yaml(cfg).splitlines()
    at = lines.index("    carry_surplus: false")  # under algorithm.filter_groups, as the old file had them
    old = [
        "    skip_predicted: 0.0",
        "    prioritize: false",
        "    prioritize_half_life: 8.0",
        "    history_baseline: false",
        "    history_norm_by_std: true",
        "    history_max_age: 8",
    ]
    saved = tmp_path / "config.yaml"
    saved.write_text("\n".join(lines[:at] + old + lines[at:]) + "\n")
    refused, harmless = resume_config_diff(saved, cfg)
    keys = ", ".join(sorted(REMOVED_OPTIONS))
    assert refused == [] and harmless == [
        f"{keys}: at their old defaults in the saved config, ignored (removed from dapo-rl on 2026-12-03; "
        "docs/zero-waste.md keeps its figures and `git checkout e4b2aa5` its code)"
    ]
    saved.write_text("\n".join(lines[:at] + [*old[:3], "    history_baseline: true", *old[4:]] + lines[at:]))
    with pytest.raises(
        ConfigError, match=r"sets algorithm.filter_groups.history_baseline=True: an option removed"
    ):
        resume_config_diff(saved, cfg)


def test_trust_remote_code_is_off_by_default():
    from dapo_rl.config import load_config

    assert load_config(None, []).model.trust_remote_code is False


def test_checkpoints_newer_than_the_latest_complete_one_without_their_state_are_named(tmp_path):
    from dapo_rl.checkpoint import incomplete_checkpoints, latest_checkpoint

    root = tmp_path / "checkpoints"
    for step, complete in ((2, True), (4, True), (6, False), (8, False), (1, False)):
        (root / f"global_step_{step}").mkdir(parents=True)
        if complete:
            (root / f"global_step_{step}" / "trainer_state.pt").write_bytes(b"x")
    (root / ".tmp_global_step_10").mkdir()  # a save in progress is no checkpoint at all
    (root / "global_step_12_copy").mkdir()  # a user's copy: no checkpoint either (it used to crash int())
    (root / "global_step_12_copy" / "trainer_state.pt").write_bytes(b"x")
    assert latest_checkpoint(tmp_path) == root / "global_step_4"
    assert incomplete_checkpoints(tmp_path) == [root / "global_step_6", root / "global_step_8"]
    assert incomplete_checkpoints(tmp_path / "nothing") == []


def test_a_setting_newer_than_the_run_at_its_default_is_no_change(tmp_path):
    """A run saved before `episode:` existed resumes without a warning about it (review of issue 43, n3); set to
    something else it is a change."""
    from omegaconf import OmegaConf

    from dapo_rl.config import load_config, resume_config_diff, to_yaml

    cfg = load_config(None, [])
    saved = OmegaConf.to_container(OmegaConf.create(to_yaml(cfg)))
    del saved["episode"]
    path = tmp_path / "config.yaml"
    path.write_text(OmegaConf.to_yaml(OmegaConf.create(saved)))
    assert resume_config_diff(path, cfg) == ([], [])
    cfg.episode.name = "dapo_rl.episode:SingleTurn"
    refused, harmless = resume_config_diff(path, cfg)
    assert refused == [] and harmless == ["episode.name: '<absent>' -> 'dapo_rl.episode:SingleTurn'"]
