"""Crash and resume, end to end: the real `dapo train` killed with SIGKILL at chosen and arbitrary moments, resumed
with `--resume`, must give every later step the same metrics as an uninterrupted run (slow: about 2 minutes)."""

import json
import math
import signal
import subprocess
import sys
import time

import pytest
import torch
from e2e import FAULT, assert_same_metrics, dapo, rows_of, run_args
from safetensors.torch import load_file

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def reference(base_model, tmp_path_factory):
    run = tmp_path_factory.mktemp("reference") / "run"
    r = dapo(*run_args(base_model, run))
    assert r.returncode == 0, r.stderr[-3000:]
    rows = rows_of(run)
    assert [x["step"] for x in rows] == [0, 1, 2, 3, 4, 5, 6]
    return run, rows


def test_sigkill_mid_rollout_mid_update_mid_checkpoint_then_resume_gives_the_same_metrics(
    base_model, reference, tmp_path
):
    _, want = reference
    run = tmp_path / "run"
    args = run_args(base_model, run)
    ckpts = run / "checkpoints"

    # 1. killed during step 3's rollout (responses generated, not yet scored): step 2 is the newest checkpoint
    r = dapo(*args, env_extra={FAULT: "rollout:3"})
    assert r.returncode == -signal.SIGKILL, r.stderr[-2000:]
    assert sorted(p.name for p in ckpts.glob("global_step_*")) == ["global_step_2"]
    assert [x["step"] for x in rows_of(run)] == [0, 1, 2]

    # 2. resumed, then killed in step 4 after its optimizer steps (weights changed in memory, nothing written)
    r = dapo(*args, "--resume", env_extra={FAULT: "update:4"})
    assert r.returncode == -signal.SIGKILL, r.stderr[-2000:]
    assert "resumed from" in r.stdout + r.stderr
    assert [x["step"] for x in rows_of(run)] == [0, 1, 2, 3]

    # 3. resumed, then killed while writing checkpoint 4: the half-written directory is not a checkpoint
    r = dapo(*args, "--resume", env_extra={FAULT: "checkpoint:4"})
    assert r.returncode == -signal.SIGKILL, r.stderr[-2000:]
    assert (ckpts / ".tmp_global_step_4" / "model" / "model.safetensors").is_file()
    assert not (ckpts / ".tmp_global_step_4" / "trainer_state.pt").exists()
    assert sorted(p.name for p in ckpts.glob("global_step_*")) == ["global_step_2"]
    assert [x["step"] for x in rows_of(run)] == [0, 1, 2, 3, 4]

    # 4. resumed to the end with the run directory alone (no recipe: the run's saved config.yaml): every step after
    # the checkpoint matches the uninterrupted run
    r = subprocess.run(  # not `dapo(...)`, which names the tests' recipe when a command names none
        [sys.executable, "-m", "dapo_rl.cli", "train", f"trainer.output_dir={run}", "--resume"],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"the run's saved settings ({run / 'config.yaml'})" in r.stderr
    assert "at step 2" in r.stdout + r.stderr
    assert_same_metrics(rows_of(run), want)
    # max_ckpt_to_keep=2; the last step is saved; no temporary directory is left
    assert sorted(p.name for p in ckpts.iterdir() if p.is_dir()) == ["global_step_4", "global_step_6"]
    assert (ckpts / "global_step_6" / "model" / "model.safetensors").is_file()
    state = torch.load(ckpts / "global_step_6" / "trainer_state.pt", weights_only=True)
    assert state["step"] == 6 and {"sampler", "bad_streak", "world_size"} <= state.keys()
    assert (ckpts / "global_step_6" / "dcp" / ".metadata").is_file()  # model, optimizer, scheduler
    assert (ckpts / "global_step_6" / "rng_rank0.pt").is_file()


def test_sigkill_at_an_arbitrary_moment_then_resume_gives_the_same_metrics(base_model, reference, tmp_path):
    """Killed from outside as soon as step 3's metrics appear, wherever the process is then."""
    _, want = reference
    run = tmp_path / "run"
    args = run_args(base_model, run)
    proc = subprocess.Popen(
        [sys.executable, "-m", "dapo_rl.cli", *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    metrics = run / "metrics.jsonl"
    deadline = time.time() + 600
    while time.time() < deadline and proc.poll() is None:
        if metrics.exists() and '"step": 3' in metrics.read_text():
            break
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    assert proc.wait() == -signal.SIGKILL
    r = dapo(*args, "--resume")
    assert r.returncode == 0, r.stderr[-3000:]
    assert_same_metrics(rows_of(run), want)


def test_resume_refuses_a_changed_setting_and_warns_on_a_harmless_one(base_model, reference):
    run, want = reference
    r = dapo(*run_args(base_model, run, "actor.lr=2e-4"), "--resume")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "actor.lr: 0.0001 -> 0.0002" in r.stderr and "start a new trainer.output_dir" in r.stderr
    r = dapo(*run_args(base_model, run, "trainer.test_freq=2"), "--resume")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "warning: --resume with changed settings: trainer.test_freq: 3 -> 2" in r.stdout + r.stderr
    assert_same_metrics(rows_of(run), want)  # already at the last step: nothing was added or lost


def test_nan_loss_skips_the_step_and_no_checkpoint_holds_nan(base_model, tmp_path):
    run = tmp_path / "run"
    args = run_args(
        base_model, run, "trainer.total_training_steps=3", "trainer.save_freq=1", "trainer.max_ckpt_to_keep=0"
    )
    r = dapo(*args, env_extra={FAULT: "nan_loss:2"})
    assert r.returncode == 0, r.stderr[-3000:]
    assert "step 2: skipped 2 optimizer step(s) with a non-finite loss or gradient" in r.stdout + r.stderr
    rows = {x["step"]: x for x in rows_of(run)}
    assert rows[2]["train/skipped_updates"] == 2 and math.isnan(rows[2]["train/pg_loss"])
    assert rows[1]["train/skipped_updates"] == 0 and rows[3]["train/skipped_updates"] == 0
    weights = {
        s: load_file(run / "checkpoints" / f"global_step_{s}" / "model" / "model.safetensors")
        for s in (1, 2, 3)
    }
    for s, w in weights.items():
        assert all(torch.isfinite(t).all() for t in w.values()), s
    assert all(torch.equal(weights[1][k], weights[2][k]) for k in weights[1])  # the NaN step changed nothing
    assert any(not torch.equal(weights[2][k], weights[3][k]) for k in weights[2])  # the next step trained


def test_consecutive_bad_steps_stop_the_run(base_model, tmp_path):
    run = tmp_path / "run"
    args = run_args(base_model, run, "trainer.max_consecutive_bad_steps=2", "trainer.test_freq=0")
    r = dapo(*args, env_extra={FAULT: "nan_loss:2,nan_loss:3"})
    assert r.returncode == 4, r.stderr[-3000:]
    assert "Traceback" not in r.stderr
    assert (
        "2 steps in a row (trainer.max_consecutive_bad_steps=2)" in r.stderr
        and "stopping at step 3" in r.stderr
    )
    assert [x["step"] for x in rows_of(run)] == [1, 2, 3]
    assert sorted(p.name for p in (run / "checkpoints").glob("global_step_*")) == ["global_step_2"]
    w = load_file(run / "checkpoints" / "global_step_2" / "model" / "model.safetensors")
    assert all(torch.isfinite(t).all() for t in w.values())
    assert json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])["train/skipped_updates"] == 2
