"""The closing summary of `dapo train`, from a metrics.jsonl written as the trainer writes it."""

import json

from dapo_rl.summary import closing_summary, validation_endpoints


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_endpoints_are_the_first_and_last_validation_of_each_dataset(tmp_path):
    m = tmp_path / "metrics.jsonl"
    _write(
        m,
        [
            {"step": 0, "val/chain_sum/acc": 0.094, "val/aime/acc": 0.0},
            {"step": 1, "train/reward_mean": -0.5},
            {"step": 20, "val/chain_sum/acc": 0.15},
            {"step": 40, "train/reward_mean": 0.1, "val/chain_sum/acc": 0.232, "val/chain_sum/avg@1": 0.232},
        ],
    )
    assert validation_endpoints(m) == {"chain_sum": (0, 0.094, 40, 0.232), "aime": (0, 0.0, 0, 0.0)}
    assert validation_endpoints(tmp_path / "absent.jsonl") == {}


def test_summary_names_the_gain_the_time_and_the_paths(tmp_path):
    m = tmp_path / "metrics.jsonl"
    _write(m, [{"step": 0, "val/chain_sum/acc": 0.094}, {"step": 200, "val/chain_sum/acc": 0.232}])
    fig = tmp_path / "training_dynamics.png"
    fig.write_bytes(b"png")
    ckpt = tmp_path / "checkpoints" / "global_step_200"
    text = closing_summary(tmp_path, m, ckpt, fig, wall_seconds=751.4, steps=200, warmup_seconds=290)
    lines = text.splitlines()
    assert lines[0] == "dapo train: done, 200 steps in 12m31s (the warm-up 4m50s of it)"
    assert lines[1] == "  held out   chain_sum: 0.094 at step 0 -> 0.232 at step 200 (+13.8 points)"
    assert str(ckpt) in lines[3] and str(fig) in lines[4]
    # no checkpoint, no figure, no warm-up: those lines are left out rather than pointing nowhere
    fig.unlink()
    text = closing_summary(tmp_path, m, None, fig, wall_seconds=59.6, steps=3)
    assert text.splitlines()[0] == "dapo train: done, 3 steps in 1m00s"
    text = closing_summary(tmp_path, m, None, fig, wall_seconds=12.0, steps=1)
    assert text.splitlines()[0] == "dapo train: done, 1 step in 0m12s"
    text = closing_summary(tmp_path, m, None, fig, wall_seconds=48.2, steps=30, resumed_at=12)
    assert text.splitlines()[0] == "dapo train: done, steps 13-30 (resumed from step 12) in 0m48s"
    text = closing_summary(tmp_path, m, None, fig, wall_seconds=21.0, steps=33, resumed_at=32)
    assert text.splitlines()[0] == "dapo train: done, step 33 (resumed from step 32) in 0m21s"
    assert "checkpoint" not in text and "figure" not in text
