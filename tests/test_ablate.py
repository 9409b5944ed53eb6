"""`dapo ablate` and the sample budget it rests on: spec checks, the table's arithmetic, and a 2-step smoke of the
real command on the real tiny model (resumable: a second call skips the finished runs)."""

import pytest
import torch
from e2e import dapo, rows_of

from dapo_rl.ablate import check_rows, load_spec, samples_to_reach
from dapo_rl.config import ConfigError

SMALL = [
    "data.train_batch_size=4",
    "rollout.n=4",
    "actor.ppo_mini_batch_size=4",
    "data.val_reasoning_gym.size=16",
    "data.train_reasoning_gym.size=200",
    "data.max_response_length=16",
    "algorithm.overlong_buffer.len=4",
    "actor.autocast_dtype=none",
    "model.attn_implementation=sdpa",
]


def test_samples_to_reach_interpolates_between_validations():
    val = [(0, 0.20), (100, 0.30), (200, 0.50), (300, 0.45)]
    assert samples_to_reach(val, 0.40) == pytest.approx(150.0)  # 100 + (0.4 - 0.3) / (0.5 - 0.3) * 100
    assert samples_to_reach(val, 0.30) == 100.0
    assert samples_to_reach(val, 0.10) == 0.0  # reached before training
    assert samples_to_reach(val, 0.60) is None


def test_shipped_specs_load_and_bad_specs_name_the_problem(tmp_path):
    ladder = load_spec("ladder")
    assert [r.name for r in ladder.rows] == [
        "grpo",
        "overlong_filtering",
        "clip_higher",
        "soft_overlong",
        "token_level",
        "dapo",
    ]
    assert ladder.reference == "grpo" and ladder.budget_samples == 40960
    assert ladder.thresholds == [0.15, 0.17]
    assert [r.name for r in load_spec("loss_variants").rows] == ["dapo", "dr_grpo", "gspo", "cispo"]
    assert [r.name for r in load_spec("zero_waste").rows] == ["dapo", "dapo_zero_waste"]
    assert [r.name for r in load_spec("policy_losses").rows] == [
        "dapo",
        "clip_cov",
        "kl_cov",
        "geo_mean",
        "sapo",
        "dppo_tv",
        "dppo_kl",
        "opsm",
        "batch_std",
        "kl",
        "kl_reset",
    ]
    assert [r.name for r in load_spec("overlong_buffer").rows] == ["dapo", "dapo_buffer8"]
    epochs = load_spec("zero_waste_epochs")
    assert [r.name for r in epochs.rows] == [
        "grpo_512",
        "dapo_512",
        "dapo_zero_waste_512",
    ]
    for name in (
        "ladder",
        "loss_variants",
        "zero_waste",
        "overlong_buffer",
        "zero_waste_epochs",
        "policy_losses",
    ):
        check_rows(load_spec(name), [])  # every shipped row's settings load and validate
    bad = tmp_path / "bad.yaml"
    bad.write_text("recipe: tiny_chain_steps\nbudget_samples: 64\nrows:\n  - name: a\n  - name: a\n")
    with pytest.raises(ConfigError, match="duplicate row names"):
        load_spec(str(bad))
    for value in ("[15]", "false", "[0.15, 0.15]"):
        bad.write_text(
            f"recipe: tiny_chain_steps\nbudget_samples: 64\nthresholds: {value}\nrows:\n  - name: a\n"
        )
        with pytest.raises(
            ConfigError, match=r"thresholds must be a list of distinct accuracies in \(0, 1\]"
        ):
            load_spec(str(bad))
    bad.write_text("recipe: tiny_chain_steps\nbudget: 64\nrows: []\n")
    with pytest.raises(ConfigError, match="unknown field 'budget'"):
        load_spec(str(bad))
    with pytest.raises(
        ConfigError,
        match="no ablation spec .ladderr.*ladder, loss_variants, overlong_buffer, policy_losses, zero_waste",
    ):
        load_spec("ladderr")
    bad.write_text(
        "recipe: tiny_chain_steps\nbudget_samples: 64\nrows:\n  - name: typo\n"
        "    overrides: [algorithm.clip_ratio_hi=0.3]\n"
    )
    r = dapo("ablate", str(bad), "--out", str(tmp_path / "out"))
    assert r.returncode == 2 and "row 'typo'" in r.stderr and "clip_ratio_hi" in r.stderr
    assert not (tmp_path / "out").exists()  # nothing ran


def test_sample_budget_and_validation_by_samples(base_model, tmp_path):
    run = tmp_path / "run"
    r = dapo(
        "train",
        f"model.path={base_model}",
        f"trainer.output_dir={run}",
        *SMALL,
        "data.gen_batch_size=4",
        "algorithm.filter_groups.enable=false",
        "trainer.max_generated_samples=40",
        "trainer.test_freq=-1",
        "trainer.test_freq_samples=32",
        "trainer.total_training_steps=100",
        "trainer.progress_bar=false",
    )
    assert r.returncode == 0, r.stderr[-3000:]
    rows = rows_of(run)
    # 16 responses per step: 16, 32, 48 >= 40 -> stop after step 3; validation at 0, on crossing 32, and last
    assert [x["step"] for x in rows] == [0, 1, 2, 3]
    assert [x.get("train/gen_samples_total") for x in rows[1:]] == [16, 32, 48]
    assert [("val/chain_sum/acc" in x) for x in rows] == [True, False, True, True]
    state = torch.load(run / "checkpoints" / "global_step_3" / "trainer_state.pt", weights_only=False)
    assert state["gen_samples_total"] == 48


def test_ablate_smoke_two_steps_then_resumes_by_skipping(base_model, tmp_path):
    out = tmp_path / "abl"
    args = [
        "ablate",
        "--seeds",
        "1",
        "--rows",
        "grpo,dapo",
        "--out",
        str(out),
        "--budget-samples",
        "32",
        "--test-freq-samples",
        "16",
        "--set",
        f"model.path={base_model}",
        *SMALL,
        "data.gen_batch_size=8",
    ]
    r = dapo(*args)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    grpo = rows_of(out / "grpo" / "seed0")
    # --set data.gen_batch_size=8 comes last, so GRPO samples 8 prompts x 4 = 32 per step: one step
    assert grpo[-1]["train/gen_samples_total"] >= 32 and (out / "grpo" / "seed0" / "DONE").is_file()
    table = (out / "ladder.md").read_text()
    assert "| grpo | " in table and "| dapo | " in table and "samples to grpo" in table
    for fig in (
        "val_acc.png",
        "entropy.png",
        "response_length_mean.png",
        "response_clip_ratio.png",
        "all_correct_group_ratio.png",
        "token_prob_mean.png",
    ):
        assert (out / "ladder_figures" / fig).stat().st_size > 5_000
    again = dapo(*args)
    assert again.returncode == 0 and again.stdout.count("done already, skipped") == 2
    changed = dapo(*args[:-1], "data.gen_batch_size=4")
    assert changed.returncode == 2 and "holds a run with other settings" in changed.stderr


def test_report_table_by_hand(tmp_path):
    """Two rows x two seeds of metrics files in the trainer's format: the table's means, sds, crossings and waste."""
    import json

    from dapo_rl.ablate import Row, Spec, write_report

    def run(row, seed, vals, wasted_ratio):
        d = tmp_path / row / f"seed{seed}"
        d.mkdir(parents=True)
        lines = [{"step": 0, "val/x/acc": vals[0]}]
        for i, v in enumerate(vals[1:], 1):
            lines.append(
                {
                    "step": i,
                    "train/gen_samples_total": 100 * i,
                    "val/x/acc": v,
                    "train/entropy": 0.1 * i,
                    "train/gen_tokens": 1000,
                    "train/gen_tokens_wasted_ratio": wasted_ratio,
                }
            )
        (d / "metrics.jsonl").write_text("\n".join(json.dumps(x) for x in lines))
        (d / "DONE").write_text(json.dumps({"wall_s": 120.0 * (seed + 1)}))

    run("ref", 0, [0.1, 0.2, 0.3], 0.0)
    run("ref", 1, [0.1, 0.3, 0.5], 0.0)  # final mean 0.4, sd 0.1414
    run("new", 0, [0.1, 0.5, 0.5], 0.5)  # reaches 0.4 at 100 * (0.3 / 0.4) = 75 samples
    run("new", 1, [0.1, 0.2, 0.6], 0.25)  # at 100 + 100 * (0.2 / 0.4) = 150
    (tmp_path / "new" / "seed2").mkdir()  # an unfinished run: no DONE, left out
    spec = Spec(tmp_path / "s.yaml", "r", 200, 100, [Row("ref", "REF", []), Row("new", "NEW", [])], "ref")
    table = write_report(spec, tmp_path, seeds=3).read_text().splitlines()
    ref = next(x for x in table if x.startswith("| ref |"))
    new = next(x for x in table if x.startswith("| new |"))
    # seed 0 never reaches 0.4; seed 1 at 100 + 100 * (0.1 / 0.2) = 150
    assert "0.400 ± 0.141 (n=2)" in ref and "| 150 (75%; 1/2 seeds) |" in ref
    assert "0.550 ± 0.071 (n=2)" in new and "| 112 (56%; 2/2 seeds) |" in new  # (75 + 150) / 2
    assert "| 37.5% |" in new and "| 0.0% |" in ref  # mean of 50% and 25%
    assert "| 0.200 |" in new  # entropy over the last 10% of the budget: the step at 200 samples
    assert "| 3.0 |" in new  # wall minutes: (2 + 4) / 2


def test_report_fixed_thresholds_by_hand(tmp_path):
    """`thresholds` add one column each: samples to a fixed accuracy, interpolated, mean over the seeds reaching it."""
    import json

    from dapo_rl.ablate import Row, Spec, write_report

    for row, seed, vals in (
        ("ref", 0, [0.1, 0.2, 0.3]),
        ("ref", 1, [0.1, 0.3, 0.5]),
        ("new", 0, [0.1, 0.5, 0.5]),
    ):
        d = tmp_path / row / f"seed{seed}"
        d.mkdir(parents=True)
        lines = [{"step": 0, "val/x/acc": vals[0]}] + [
            {"step": i, "train/gen_samples_total": 100 * i, "val/x/acc": v} for i, v in enumerate(vals[1:], 1)
        ]
        (d / "metrics.jsonl").write_text("\n".join(json.dumps(x) for x in lines))
        (d / "DONE").write_text("{}")
    rows = [Row("ref", "REF", []), Row("new", "NEW", []), Row("none", "NONE", [])]
    spec = Spec(tmp_path / "s.yaml", "r", 200, 100, rows, "ref", thresholds=[0.3, 0.5])
    table = write_report(spec, tmp_path, seeds=2).read_text().splitlines()
    head = next(x for x in table if x.startswith("| row |"))
    assert "| samples to ref (share of budget) | samples to 0.3 | samples to 0.5 | entropy |" in head
    ref = next(x for x in table if x.startswith("| ref |"))
    new = next(x for x in table if x.startswith("| new |"))
    none = next(x for x in table if x.startswith("| none |"))
    # 0.3: ref seed 0 at 200, seed 1 at 100 -> 150; 0.5: only seed 1, at 200
    assert "| 150 (75%; 2/2 seeds) | 200 (100%; 1/2 seeds) |" in ref
    # new seed 0: 0.1 -> 0.5 over the first 100 samples: 0.3 at 50, 0.5 at 100
    assert "| 50 (25%; 1/1 seeds) | 100 (50%; 1/1 seeds) |" in new
    assert none.count("|") == head.count("|")  # a row with no finished run keeps the columns aligned
    with pytest.raises(
        ConfigError, match=r"no such directory, so no runs to report; run `dapo ablate s --out"
    ):
        write_report(spec, tmp_path / "missing", seeds=2)
