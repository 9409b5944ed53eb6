"""SIGTERM, as a scheduler's preemption or time limit or `timeout` sends it: the real `dapo train` finishes the step
in progress, saves a checkpoint, names it and the command that resumes, and exits 143; resuming completes the run.
With two ranks both stop after the same step; `dapo ablate` forwards the signal to its run (slow: about 4 minutes
after the base model)."""

import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from e2e import dapo, rows_of, run_args

pytestmark = pytest.mark.slow

STOPPED = re.compile(
    r"dapo train: stopped by SIGTERM after step (\d+); checkpoint (\S+)\. To continue from it: (dapo .*)$",
    re.M,
)


def start(*args: str) -> subprocess.Popen:
    """`python -m dapo_rl.cli ARGS` in a session of its own (a process group, as a job step or `timeout` runs it)."""
    return subprocess.Popen(
        [sys.executable, "-m", "dapo_rl.cli", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def wait_for_step(metrics: Path, step: int, proc: subprocess.Popen, timeout_s: float = 600) -> None:
    """Until `metrics` holds a row of `step` (fails if the process ends first)."""
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        if metrics.exists() and f'"step": {step},' in metrics.read_text():
            return
        time.sleep(0.05)
    raise AssertionError(f"no step {step} in {metrics} after {timeout_s} s")


def stopped_at(stderr: str, run: Path) -> tuple[int, str]:
    """The step and resume command of the stop message; checks that it names that step's complete checkpoint and
    that no other checkpoint or half-written one is left (`trainer.save_freq=-1`: only the stop saved)."""
    assert "Traceback" not in stderr, stderr[-3000:]
    m = STOPPED.search(stderr)
    assert m, stderr[-3000:]
    step, ckpt = int(m[1]), Path(m[2])
    assert step >= 1 and ckpt == run / "checkpoints" / f"global_step_{step}"
    assert torch.load(ckpt / "trainer_state.pt", weights_only=True)["step"] == step
    assert [p.name for p in (run / "checkpoints").iterdir() if p.is_dir()] == [ckpt.name]
    assert [r["step"] for r in rows_of(run)] == list(range(step + 1))
    return step, m[3]


def test_sigterm_during_start_up_says_so_and_ends_the_process_as_before():
    """Before `fit` takes SIGTERM over there is nothing to checkpoint: the process still ends by the signal (exit
    status 143 in a shell), with a line that says why instead of silence."""
    code = (
        "import os, signal, time\n"
        "from dapo_rl.stopping import say_sigterm_at_startup\n"
        "say_sigterm_at_startup()\n"
        "os.kill(os.getpid(), signal.SIGTERM)\n"
        "time.sleep(30)\n"
        "print('not ended')\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == -signal.SIGTERM, r.stderr[-2000:]
    assert "dapo train: SIGTERM during start-up, before training began: stopped, nothing to save" in r.stderr
    assert "not ended" not in r.stdout


def test_sigterm_to_the_process_group_saves_a_checkpoint_and_resume_completes(base_model, tmp_path):
    run = tmp_path / "run"
    args = run_args(base_model, run, "trainer.save_freq=-1")
    proc = start(*args)
    wait_for_step(run / "metrics.jsonl", 1, proc)
    os.killpg(proc.pid, signal.SIGTERM)  # the trainer and its reward worker, as `timeout` and Slurm signal
    time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)  # a second one changes nothing
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 143, err[-3000:]
    assert "dapo train: SIGTERM received: stopping after the step in progress, with a checkpoint" in err
    step, command = stopped_at(err, run)
    assert command == "dapo " + shlex.join([*args, "--resume"])
    r = dapo(*shlex.split(command)[1:])
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"at step {step}" in r.stdout
    assert [x["step"] for x in rows_of(run)] == [0, 1, 2, 3, 4, 5, 6]
    assert (run / "checkpoints" / "global_step_6" / "trainer_state.pt").is_file()


def test_two_ranks_stop_after_the_same_step_and_resume(base_model, tmp_path):
    run = tmp_path / "run"
    args = run_args(base_model, run, "trainer.save_freq=-1", "trainer.nproc_per_node=2")
    proc = start(*args)
    wait_for_step(run / "metrics.jsonl", 1, proc)
    proc.send_signal(signal.SIGTERM)  # to the launcher only: torch's elastic agent forwards it to the ranks
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 143, err[-3000:]
    step, command = stopped_at(err, run)
    ckpt = run / "checkpoints" / f"global_step_{step}"
    assert (ckpt / "rng_rank0.pt").is_file() and (ckpt / "rng_rank1.pt").is_file()
    assert len(list((ckpt / "dcp").glob("*.distcp"))) == 2  # both ranks wrote their shard of the same step
    r = dapo(*shlex.split(command)[1:])
    assert r.returncode == 0, r.stderr[-3000:]
    assert [x["step"] for x in rows_of(run)] == [0, 1, 2, 3, 4, 5, 6]


def test_sigterm_to_dapo_ablate_stops_its_run_with_a_checkpoint_and_the_repeat_resumes(base_model, tmp_path):
    out = tmp_path / "abl"
    args = [
        "ablate",
        "--seeds=1",
        "--rows=grpo",
        f"--out={out}",
        "--budget-samples=128",  # 4 steps of 8 prompts x 4 responses
        "--test-freq-samples=64",
        "--set",
        f"model.path={base_model}",
        "data.train_batch_size=8",
        "data.gen_batch_size=8",
        "rollout.n=4",
        "actor.ppo_mini_batch_size=8",
        "data.val_reasoning_gym.size=16",
        "data.train_reasoning_gym.size=200",
        "actor.autocast_dtype=none",
        "model.attn_implementation=sdpa",
        "trainer.save_freq=-1",
    ]
    proc = start(*args)
    run = out / "grpo" / "seed0"
    wait_for_step(run / "metrics.jsonl", 1, proc)
    proc.send_signal(signal.SIGTERM)  # to dapo ablate alone: it forwards the signal to its dapo train
    stdout, err = proc.communicate(timeout=600)
    assert proc.returncode == 143, stdout[-2000:] + err[-2000:]
    assert "stopped by SIGTERM after saving a checkpoint" in stdout
    assert "Run the same command again to go on" in stdout
    step, _ = stopped_at((out / "grpo" / "seed0.log").read_text(), run)
    assert step < 4 and not (run / "DONE").exists() and not (out / "ladder.md").exists()
    r = dapo(*args)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "grpo seed 0: resuming" in r.stdout and (run / "DONE").is_file()
    assert [x["step"] for x in rows_of(run)] == [0, 1, 2, 3, 4]
