"""Two ranks end to end on this CPU (gloo, FSDP2), through the launchers users run: torchrun, the
`trainer.nproc_per_node` shorthand and Ray Train. A rank killed with SIGKILL ends the job with a clear message,
`--resume` at 2 ranks gives the uninterrupted 2-rank metrics, and a 2-rank checkpoint resumes at 1 rank (slow:
about 4 minutes)."""

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from e2e import FAULT, assert_same_metrics, comparable, dapo, rows_of, run_args

pytestmark = pytest.mark.slow

TWO = ["trainer.nproc_per_node=2"]


def torchrun(*args, env_extra=None):
    """`torchrun --standalone --nproc-per-node 2 -m dapo_rl.cli ARGS`, as a user types it."""
    env = dict(os.environ, **(env_extra or {}))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    return subprocess.run(
        [*cmd, "-m", "dapo_rl.cli", *args], capture_output=True, text=True, env=env, timeout=900
    )


@pytest.fixture(scope="module")
def reference2(base_model, tmp_path_factory):
    """The uninterrupted 2-rank run, launched with torchrun itself."""
    run = tmp_path_factory.mktemp("reference2") / "run"
    r = torchrun(*run_args(base_model, run))
    assert r.returncode == 0, r.stderr[-3000:]
    rows = rows_of(run)
    assert [x["step"] for x in rows] == [0, 1, 2, 3, 4, 5, 6]
    ckpt = run / "checkpoints" / "global_step_6"
    assert (ckpt / "rng_rank0.pt").is_file() and (ckpt / "rng_rank1.pt").is_file()
    assert len(list((ckpt / "dcp").glob("*.distcp"))) == 2  # one shard file per rank
    return run, rows


def test_sigkill_of_one_rank_then_resume_at_two_ranks_gives_the_same_metrics(
    base_model, reference2, tmp_path
):
    _, want = reference2
    run = tmp_path / "run"
    args = run_args(base_model, run, *TWO)
    r = dapo(*args, env_extra={FAULT: "rollout:3@1"})  # rank 1 dies after sampling in step 3
    assert r.returncode == 128 + 9, r.stderr[-3000:]
    assert "rank 1 was killed by SIGKILL; the launcher stopped the other ranks" in r.stderr
    assert "--resume" in r.stderr and "Traceback" not in r.stderr
    assert [x["step"] for x in rows_of(run)] == [0, 1, 2]
    r = dapo(*args, "--resume")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "resumed from" in r.stdout and "at step 2" in r.stdout
    assert_same_metrics(rows_of(run), want)  # the shorthand continues exactly the torchrun run


def test_a_two_rank_checkpoint_resumes_at_one_rank(base_model, reference2, tmp_path):
    src, want = reference2
    run = tmp_path / "run"
    shutil.copytree(src, run)
    r = dapo(*run_args(base_model, run, "trainer.total_training_steps=7"), "--resume")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "written by 2 rank(s), resumed on 1" in r.stdout
    rows = rows_of(run)
    assert [x["step"] for x in rows] == [0, 1, 2, 3, 4, 5, 6, 7]
    assert comparable(rows[:7]) == comparable(want)
    assert rows[7]["train/kept_groups"] >= 1 and rows[7]["train/skipped_updates"] == 0


def test_ray_launcher_with_two_cpu_workers_equals_torchrun(base_model, reference2, tmp_path):
    pytest.importorskip("ray.train", reason="Ray Train is not installed (pip install 'dapo-rl[ray]')")
    _, want = reference2
    run = tmp_path / "run"
    ray_tmp = Path(tempfile.mkdtemp(prefix="ray", dir="/tmp"))  # Ray's socket paths must stay under 108 bytes
    r = dapo(
        *run_args(base_model, run, "trainer.total_training_steps=2"),
        "trainer.launcher=ray",
        "trainer.nnodes=1",
        "trainer.n_gpus_per_node=2",
        "trainer.device=cpu",
        env_extra={"RAY_AUTH_MODE": "disabled", "RAY_TMPDIR": str(ray_tmp), "RAY_ADDRESS": ""},
    )
    shutil.rmtree(ray_tmp, ignore_errors=True)
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-3000:])
    rows = rows_of(run)
    assert [x["step"] for x in rows] == [0, 1, 2]
    for got, ref in zip(comparable(rows), comparable(want[:3])):
        shared = got.keys() & ref.keys()  # step 2 is this run's last: it validates, the reference does not
        assert shared == ref.keys() and {k: got[k] for k in shared} == {k: ref[k] for k in shared}


def test_ray_launcher_without_ray_is_one_clear_line(tmp_path):
    """`import ray` fails as it does where Ray is not installed."""
    blocker = tmp_path / "noray"
    blocker.mkdir()
    (blocker / "ray").mkdir()
    (blocker / "ray" / "__init__.py").write_text("raise ImportError('No module named ray')\n")
    r = dapo(
        "train",
        "trainer.launcher=ray",
        f"trainer.output_dir={tmp_path / 'run'}",
        env_extra={"PYTHONPATH": str(blocker)},
    )
    assert r.returncode == 2, r.stderr[-2000:]
    assert r.stderr.strip() == (
        "dapo: error: trainer.launcher=ray: Ray Train is not installed; pip install 'dapo-rl[ray]' (or "
        "'ray[train]'), or use the torchrun launcher (trainer.launcher=torchrun trainer.nproc_per_node=N)"
    )


def test_device_cuda_without_cuda_is_one_line_exit_2(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    for extra in ([], TWO):
        r = dapo("train", "trainer.device=cuda", f"trainer.output_dir={tmp_path / 'run'}", *extra)
        assert r.returncode == 2 and "Traceback" not in r.stderr
        assert len(r.stderr.strip().splitlines()) == 1
        assert "trainer.device=cuda, but torch sees no CUDA device" in r.stderr


def test_skips_with_fewer_prompts_per_round_than_ranks_finish(base_model, tmp_path):
    """`gen_batch_size=1` at 2 ranks: rank 1 draws no prompt in any round, yet the skips' gather of every group's
    outcome is a collective every rank joins (a rank with nothing to add must still join, or rank 0 waits)."""
    run = tmp_path / "run"
    args = run_args(
        base_model,
        run,
        "data.train_batch_size=1",
        "data.gen_batch_size=1",
        "actor.ppo_mini_batch_size=1",
        "trainer.total_training_steps=2",
        "trainer.test_freq=0",
        "trainer.val_before_train=false",
        "trainer.save_freq=0",
        "algorithm.filter_groups.skip_solved=1",
        "algorithm.filter_groups.skip_unsolved=1",
        # one prompt of 4 samples a round from a weak base model: a mixed group can take many rounds
        "algorithm.filter_groups.max_num_gen_batches=40",
    )
    r = torchrun(*args)
    assert r.returncode == 0, r.stderr[-3000:]
    rows = [x for x in rows_of(run) if "train/acc_mean" in x]
    assert [x["step"] for x in rows] == [1, 2]
    assert all(x["train/gen_prompts"] >= 1 for x in rows)
