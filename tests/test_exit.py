"""A run that fails exits, within seconds, with no process left (review async-lora M1): an uncaught error after the
reward workers and the engine processes started, an engine whose lock a stuck request holds, a damaged checkpoint
on resume (synchronous and K=1)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
import torch
from e2e import FAULT, dapo, gone, run_args

from dapo_rl.checkpoint import checkpoint_problem
from dapo_rl.config import RolloutConfig
from dapo_rl.rollout.remote import EngineSpec, RemoteEngine


def test_an_uncaught_error_after_the_workers_and_engine_started_exits_at_once(model_dir):
    """Before: multiprocessing's exit hook sent SIGTERM (ignored) to the engine and the reward workers and joined
    them forever. Now the process exits with the error's status, and every child is gone."""
    code = textwrap.dedent(
        f"""
        from dapo_rl.config import RolloutConfig
        from dapo_rl.reward.pool import RewardPool
        from dapo_rl.rollout.remote import EngineSpec, RemoteEngine

        if __name__ == "__main__":
            engine = RemoteEngine(EngineSpec(RolloutConfig(name="hf"), {str(model_dir)!r}, 64, num_threads=1))
            pool = RewardPool("auto", 2, 5.0)
            pids = [engine.proc.pid] + [w.proc.pid for w in pool._sandbox.workers]
            print("pids", *pids, flush=True)
            holder = [engine, pool]  # kept alive by the traceback's frame, as a Trainer's attributes would be
            raise RuntimeError("a damaged file after the workers started")
        """
    )
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    took = time.monotonic() - t0
    assert proc.returncode == 1 and "a damaged file after the workers started" in proc.stderr
    pids = [int(p) for p in re.search(r"pids ([\d ]+)", proc.stdout).group(1).split()]
    assert len(pids) == 3 and all(gone(p, 5.0) for p in pids), pids
    print(f"exited {took:.1f} s after start (engine start included)")
    assert took < 60


def test_close_kills_an_engine_whose_request_does_not_finish(model_dir):
    """A request in flight on another thread holds the engine's lock (the producer's round; here a thread that
    never lets go): `close` waits `lock_timeout_s`, then kills the process."""
    engine = RemoteEngine(EngineSpec(RolloutConfig(name="hf"), str(model_dir), 64, num_threads=1))
    pid = engine.proc.pid
    held = threading.Event()

    def stuck():
        engine._lock.acquire()
        held.set()

    threading.Thread(target=stuck, daemon=True).start()
    held.wait(5)
    t0 = time.monotonic()
    engine.close(lock_timeout_s=1.0)
    assert time.monotonic() - t0 < 5.0
    assert gone(pid, 5.0)


def _truncate_dcp(ckpt: Path) -> Path:
    data = max((p for p in (ckpt / "dcp").iterdir() if p.suffix == ".distcp"), key=lambda p: p.stat().st_size)
    with open(data, "r+b") as fh:
        fh.truncate(data.stat().st_size // 2)
    return data


@pytest.mark.slow
@pytest.mark.parametrize("k", [0, 1])
def test_a_damaged_checkpoint_then_an_uncaught_error_leave_no_process(base_model, tmp_path, k):
    """Steps 1-4 with checkpoints at 2 and 4; step 4's largest DCP file cut in half (a full disk): `--resume` ends
    within seconds with exit 2 and one line naming the file and step 2's checkpoint, and leaves no process. Moving
    the damaged one aside as the line says resumes from step 2; an injected uncaught error then ends that run."""
    run = tmp_path / "run"
    extra = ["trainer.total_training_steps=4", "trainer.test_freq=0"]
    if k:
        extra += ["async_training.max_staleness=1", "reward.num_workers=1"]
    args = run_args(base_model, run, *extra)
    r = dapo(*args)
    assert r.returncode == 0, r.stderr[-3000:]
    step4, step2 = run / "checkpoints" / "global_step_4", run / "checkpoints" / "global_step_2"
    damaged = _truncate_dcp(step4)
    assert checkpoint_problem(step4).startswith(str(damaged)) and checkpoint_problem(step2) is None
    tag = f"damaged{k}"
    t0 = time.monotonic()
    r = dapo(*args, "trainer.total_training_steps=6", "--resume", env_extra={"DAPO_TEST_TAG": tag})
    took = time.monotonic() - t0
    assert r.returncode == 2, r.stderr[-3000:]
    lines = [x for x in r.stderr.splitlines() if x.startswith("dapo: error:")]
    assert (
        len(lines) == 1 and str(damaged) in lines[0] and f"newest intact checkpoint is {step2}" in lines[0]
    ), r.stderr[-3000:]
    assert "Traceback" not in r.stderr
    print(f"K={k}: damaged checkpoint refused in {took:.1f} s: {lines[0]}")
    assert _left_after(tag) == []
    m = re.search(r"\(mv (\S+) (\S+)\)", lines[0])
    os.rename(m.group(1), m.group(2))
    # resumed from step 2 as the line says; an error nobody catches after step 3's update (as an out-of-memory
    # error would be), with two reward workers (and, K=1, the engine process) running: the traceback, exit 1, and
    # no process of the run left (before: a hang at exit, review M1)
    tag = f"error{k}"
    t0 = time.monotonic()
    r = dapo(
        *args,
        "trainer.total_training_steps=6",
        "reward.num_workers=2",
        "--resume",
        env_extra={FAULT: "error:3", "DAPO_TEST_TAG": tag},
    )
    print(
        f"K={k}: the resumed run with an error at step 3 ended in {time.monotonic() - t0:.1f} s (start-up included)"
    )
    assert r.returncode == 1, r.stderr[-3000:]
    assert "resumed from" in r.stdout + r.stderr and "step 2" in r.stdout + r.stderr
    assert "RuntimeError: injected fault: an error after the update" in r.stderr
    assert _left_after(tag) == []


def _tagged(tag: str) -> list[int]:
    """Live processes (zombies excluded) whose environment holds `DAPO_TEST_TAG=<tag>`: a run started with it and
    every process it started (children inherit the environment)."""
    pids = []
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            env = Path(f"/proc/{p}/environ").read_bytes()
            state = Path(f"/proc/{p}/stat").read_text().split(") ")[1][0]
        except (OSError, IndexError):
            continue
        if f"DAPO_TEST_TAG={tag}".encode() in env.split(b"\0") and state != "Z":
            pids.append(int(p))
    return pids


def _left_after(tag: str, wait_s: float = 5.0) -> list[int]:
    """`_tagged(tag)` once it is empty, or after `wait_s` seconds."""
    deadline = time.monotonic() + wait_s
    while (left := _tagged(tag)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


def test_a_stuck_engine_is_killed_at_its_request_deadline(model_dir):
    """Review m4: an engine that is alive but never answers (stopped with SIGSTOP, as a hung collective would leave
    it) raises at the request's deadline instead of holding the run forever, and is killed."""
    import signal

    from dapo_rl.rollout.base import SamplingParams
    from dapo_rl.rollout.remote import generate_deadline_s

    assert generate_deadline_s(16) == 900.0 and generate_deadline_s(20480) == 10240.0
    assert generate_deadline_s(20480, 8192, 512) == 16 * 10240.0  # 16 batches of 512 sequences
    engine = RemoteEngine(
        EngineSpec(RolloutConfig(name="hf"), str(model_dir), 64, num_threads=1), request_timeout_s=3.0
    )
    pid = engine.proc.pid
    os.kill(pid, signal.SIGSTOP)
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match="did not answer within 3 s"):
        engine.generate([[1, 2, 3]], SamplingParams(n=1, max_tokens=4))
    assert time.monotonic() - t0 < 8.0
    assert gone(pid, 5.0)
    engine.close()


def test_weights_go_to_all_engines_at_once(model_dir):
    """Review M3: two engine processes, each channel slowed to 0.25 s per tensor: a push of 4 tensors takes about
    one engine's time (1 s), not the sum (2 s), and both engines then hold the pushed values."""
    from dapo_rl.rollout.remote import RemoteEngines, WeightChannel

    spec = EngineSpec(RolloutConfig(name="hf"), str(model_dir), 64, num_threads=1)
    engines = RemoteEngines([spec, spec])
    try:
        for e in engines.engines:
            channel = e._channel
            real = WeightChannel.broadcast.__get__(channel)

            def slow(t, real=real):
                time.sleep(0.25)
                real(t)

            channel.broadcast = slow
        from safetensors.torch import load_file

        state = load_file(str(next(Path(model_dir).glob("*.safetensors"))))
        names = sorted(n for n in state if n.endswith("layernorm.weight"))[:4]
        tensors = [(n, torch.full_like(state[n], 0.5)) for n in names]
        t0 = time.monotonic()
        engines.update_weights(tensors)
        took = time.monotonic() - t0
        print(f"push of 4 tensors to 2 engines at 0.25 s per tensor each: {took:.2f} s")
        assert 1.0 <= took < 1.9  # one engine after the other would take 2.0 s at least
    finally:
        engines.close()


CTRL_C_STOPPED = re.compile(
    r"dapo train: stopped by Ctrl-C \(SIGINT\) after step (\d+); checkpoint (\S+)\. To continue from it: (dapo .*)$",
    re.M,
)


def _start_in_session(args: list[str], tag: str, out: Path) -> subprocess.Popen:
    """`python -m dapo_rl.cli ARGS` in a session of its own (so that `os.killpg` signals the run and every process
    it started, as a terminal's Ctrl-C does), tagged `tag`, its output in `out`.{stdout,stderr}."""
    return subprocess.Popen(
        [sys.executable, "-m", "dapo_rl.cli", *args],
        env=dict(os.environ, DAPO_TEST_TAG=tag),
        stdout=open(out.with_suffix(".stdout"), "w"),
        stderr=open(out.with_suffix(".stderr"), "w"),
        start_new_session=True,
    )


def _wait_for_rows(run: Path, proc: subprocess.Popen, rows: int, timeout_s: float = 600) -> None:
    deadline = time.monotonic() + timeout_s
    metrics = run / "metrics.jsonl"
    while time.monotonic() < deadline and proc.poll() is None:
        if metrics.exists() and len(metrics.read_text().splitlines()) >= rows:
            return
        time.sleep(0.1)
    assert proc.poll() is None, "the run ended before it could be interrupted"
    raise AssertionError(f"no {rows} rows in {metrics} after {timeout_s} s")


def _ctrl_c_args(base_model: Path, run: Path, k: int) -> list[str]:
    extra = ["trainer.total_training_steps=50", "trainer.test_freq=0", "trainer.save_freq=-1"]
    if k:
        extra += ["async_training.max_staleness=1", "reward.num_workers=1"]
    else:
        extra += [
            "reward.num_workers=1"
        ]  # a reward worker process in both: it must ignore the terminal's SIGINT
    return run_args(base_model, run, *extra)


def _ctrl_c(args: list[str], run: Path, tag: str, out: Path, presses: int) -> tuple[int, float, str]:
    """Start `dapo ARGS` in a session of its own, press Ctrl-C (SIGINT to its process group, as a terminal does)
    once or twice 0.1 s apart after its first metrics row, and return its exit code, the seconds from the last press
    to its end, and its stderr; asserts no traceback and no process of the run left."""
    import signal

    proc = _start_in_session(args, tag, out)
    try:
        _wait_for_rows(run, proc, 1)
        os.killpg(proc.pid, signal.SIGINT)
        if presses == 2:
            # 0.1 s: well inside a step and its stop's checkpoint (half a second let a fast step finish and write
            # it first, and the run then stops as after one Ctrl-C)
            time.sleep(0.1)
            os.killpg(proc.pid, signal.SIGINT)
        t0 = time.monotonic()
        proc.wait(timeout=300)
        took = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    err = out.with_suffix(".stderr").read_text()
    print(f"{tag}: {presses} Ctrl-C: ended {took:.1f} s after the last, exit code {proc.returncode}")
    assert "Traceback" not in err, err[-3000:]
    assert _left_after(tag) == []
    return proc.returncode, took, err


QUIT_AT_ONCE = "dapo train: Ctrl-C again: quit at once, without a checkpoint of the step in progress"


@pytest.mark.slow
@pytest.mark.parametrize("k", [0, 1])
def test_ctrl_c_once_stops_after_the_step_with_a_checkpoint(base_model, tmp_path, k):
    """A terminal's Ctrl-C (SIGINT to the process group: the trainer, its reward worker and, K=1, its engine
    process): one line saying the run stops after the step in progress, then the stop's checkpoint, the line naming
    it and the command that resumes, exit 130, no traceback from any process, no process left."""
    import shlex

    run = tmp_path / "run"
    args = _ctrl_c_args(base_model, run, k)
    code, _, err = _ctrl_c(args, run, f"ctrlc-once{k}", tmp_path / "out", 1)
    assert code == 130, err[-3000:]
    assert (
        "dapo train: Ctrl-C: stopping after the step in progress, with a checkpoint; press Ctrl-C again to quit "
        "at once" in err
    )
    m = CTRL_C_STOPPED.search(err)
    assert m, err[-3000:]
    ckpt = Path(m[2])
    assert ckpt == run / "checkpoints" / f"global_step_{m[1]}" and (ckpt / "trainer_state.pt").is_file()
    assert m[3] == "dapo " + shlex.join([*args, "--resume"])


@pytest.mark.slow
@pytest.mark.parametrize("k", [0, 1])
def test_ctrl_c_twice_mid_round_ends_within_seconds(base_model, tmp_path, k):
    """Two Ctrl-Cs (SIGINT to the process group) a tenth of a second apart mid-round: exit 130 within seconds of the
    second, one line saying no checkpoint was written for the step in progress, no traceback, no process left
    (before: the second one left `close` waiting on the engine's lock, and the interpreter joined an engine that
    ignores SIGINT, review M1; and every process printed a KeyboardInterrupt traceback)."""
    run = tmp_path / "run"
    code, took, err = _ctrl_c(_ctrl_c_args(base_model, run, k), run, f"ctrlc-twice{k}", tmp_path / "out", 2)
    assert code == 130 and QUIT_AT_ONCE in err, err[-3000:]
    assert took < 10


@pytest.mark.slow
def test_ctrl_c_under_the_launcher_once_checkpoints_and_twice_quits(base_model, tmp_path):
    """`trainer.nproc_per_node=2`: torch's elastic launcher runs the ranks in a session of their own, so a terminal's
    Ctrl-C reaches the launcher alone; it forwards the first press as SIGINT (the ranks stop after the step with a
    checkpoint, exit 130) and turns the second into SIGTERM, which the ranks take as the second press: they quit at
    once, rank 0 saying so, and nothing is left (review of this change, M1: before, the launcher killed the ranks
    after 30 s without a checkpoint, and the second press waited for that kill)."""
    runs = [tmp_path / "run1", tmp_path / "run2"]
    args = [[*_ctrl_c_args(base_model, r, 0), "trainer.nproc_per_node=2"] for r in runs]
    code, _, err = _ctrl_c(args[0], runs[0], "ctrlc-launcher-once", tmp_path / "once", 1)
    m = CTRL_C_STOPPED.search(err)
    assert code == 130 and m and (Path(m[2]) / "trainer_state.pt").is_file(), err[-3000:]
    code, took, err = _ctrl_c(args[1], runs[1], "ctrlc-launcher-twice", tmp_path / "twice", 2)
    assert code == 130 and QUIT_AT_ONCE in err, err[-3000:]
    assert took < 15


def test_checkpoint_problem_and_what_counts_as_damage(tmp_path):
    """Files of a checkpoint checked without loading it: a DCP data file cut short and a cut `trainer_state.pt` are
    named; the newest intact older checkpoint is found; a load error that is not damage (a shape mismatch, no
    memory) is not called damage (review of issue 42, m2)."""
    import pickle

    import torch.distributed.checkpoint as dcp

    from dapo_rl.checkpoint import _reads_as_damage, intact_before

    def write(step: int) -> Path:
        ckpt = tmp_path / "checkpoints" / f"global_step_{step}"
        dcp.save({"w": torch.arange(4096.0)}, checkpoint_id=str(ckpt / "dcp"), no_dist=True)
        torch.save({"step": step}, ckpt / "trainer_state.pt")
        return ckpt

    one, two, three = write(1), write(2), write(3)
    assert checkpoint_problem(three) is None
    data = _truncate_dcp(three)
    assert checkpoint_problem(
        three
    ) == f"{data}: {data.stat().st_size} bytes, the metadata needs {2 * data.stat().st_size}" or (
        checkpoint_problem(three).startswith(f"{data}: ")
    )
    state = two / "trainer_state.pt"
    state.write_bytes(state.read_bytes()[:40])
    assert checkpoint_problem(two).startswith(f"{state}: ")
    assert intact_before(three) == one
    assert _reads_as_damage(EOFError()) and _reads_as_damage(pickle.UnpicklingError("x"))
    assert _reads_as_damage(RuntimeError("PytorchStreamReader failed reading zip archive"))
    assert not _reads_as_damage(RuntimeError("size mismatch for w: copying a param with shape [3]"))
    assert not _reads_as_damage(MemoryError())


def _truncate(f: Path) -> Path:
    with open(f, "r+b") as fh:
        fh.truncate(f.stat().st_size // 2)
    return f


def test_a_cut_rng_file_or_model_safetensors_is_named_with_the_intact_checkpoint(tmp_path):
    """A cut `rng_rank0.pt` and a cut `model/model.safetensors` are named by `checkpoint_problem` (the file, not the
    checkpoint directory), and `check_resumable` refuses them in one line naming the newest intact checkpoint."""
    import torch.distributed.checkpoint as dcp
    from safetensors.torch import save_file

    from dapo_rl.checkpoint import check_resumable, intact_before, safetensors_problem
    from dapo_rl.config import ConfigError

    def write(step: int) -> Path:
        ckpt = tmp_path / "checkpoints" / f"global_step_{step}"
        dcp.save({"w": torch.arange(64.0)}, checkpoint_id=str(ckpt / "dcp"), no_dist=True)
        (ckpt / "model").mkdir()
        save_file({"w": torch.arange(4096.0), "b": torch.zeros(3)}, str(ckpt / "model" / "model.safetensors"))
        torch.save({"torch": torch.get_rng_state(), "python": list(range(600))}, ckpt / "rng_rank0.pt")
        torch.save({"step": step}, ckpt / "trainer_state.pt")
        return ckpt

    one, two, three = write(1), write(2), write(3)
    assert [checkpoint_problem(c) for c in (one, two, three)] == [None, None, None]
    check_resumable(three)
    model = three / "model" / "model.safetensors"
    full = model.stat().st_size
    assert safetensors_problem(model) is None
    _truncate(model)
    assert checkpoint_problem(three) == f"{model}: {full // 2} bytes, the header needs {full}"
    rng = _truncate(two / "rng_rank0.pt")
    assert checkpoint_problem(two).startswith(f"{rng}: ")
    assert intact_before(three) == one
    with pytest.raises(ConfigError) as info:
        check_resumable(three)
    msg = str(info.value)
    assert len(msg.splitlines()) == 1 and f"({model}: {full // 2} bytes" in msg
    assert f"the newest intact checkpoint is {one}" in msg
    with pytest.raises(ConfigError) as info:
        check_resumable(two)
    msg = str(info.value)
    assert (
        len(msg.splitlines()) == 1 and f"is damaged ({rng}: " in msg and f"intact checkpoint is {one}" in msg
    )
    # a header cut inside its own length, and a file of less than the 8-byte length
    model.write_bytes(model.read_bytes()[:20])
    assert safetensors_problem(model).startswith("20 bytes, the header alone needs ")
    model.write_bytes(b"\x01\x00")
    assert safetensors_problem(model) == "2 bytes: no header"


def test_a_long_load_error_is_shortened_at_a_word():
    from dapo_rl.checkpoint import PROBLEM_CHARS, _short

    words = " ".join(f"word{i:03d}" for i in range(60))  # 479 characters, words of 7
    got = _short(RuntimeError(words + "\nsecond line"))
    assert got.startswith("RuntimeError: word000 word001") and got.endswith(" ...")
    kept = got.removeprefix("RuntimeError: ").removesuffix(" ...")
    assert len(kept) <= PROBLEM_CHARS and words.startswith(kept) and words[len(kept)] == " "
    assert _short(EOFError()) == "EOFError" and _short(ValueError("short")) == "ValueError: short"


@pytest.mark.slow
def test_resume_from_a_cut_model_safetensors_or_rng_file_exits_2_with_one_line(model_dir, tmp_path):
    """Steps 1-3, a checkpoint each. Step 3's `model/model.safetensors` cut in half: `--resume` used to build the
    engine from it (a traceback, exit 1); now exit 2 and one line naming that file and step 2. Moved aside as the
    line says, step 2's cut `rng_rank0.pt` is named the same way (it was the checkpoint directory), with step 1."""
    run = tmp_path / "run"
    args = run_args(
        model_dir, run, "trainer.total_training_steps=3", "trainer.save_freq=1", "trainer.max_ckpt_to_keep=3",
        "trainer.test_freq=0", "algorithm.filter_groups.enable=false",  # the random model solves nothing
    )  # fmt: skip
    r = dapo(*args)
    assert r.returncode == 0, r.stderr[-3000:]
    ckpts = run / "checkpoints"
    for step, name, intact in ((3, "model/model.safetensors", 2), (2, "rng_rank0.pt", 1)):
        damaged = _truncate(ckpts / f"global_step_{step}" / name)
        intact = ckpts / f"global_step_{intact}"
        t0 = time.monotonic()
        r = dapo(*args, "--resume")
        took = time.monotonic() - t0
        assert r.returncode == 2, r.stderr[-3000:]
        assert "Traceback" not in r.stderr, r.stderr[-3000:]
        lines = [x for x in r.stderr.splitlines() if x.startswith("dapo: error:")]
        assert len(lines) == 1, r.stderr[-3000:]
        assert f"checkpoint {ckpts / f'global_step_{step}'} is damaged ({damaged}: " in lines[0], lines[0]
        assert f"newest intact checkpoint is {intact}" in lines[0], lines[0]
        print(f"step {step}: refused in {took:.1f} s: {lines[0]}")
        m = re.search(r"\(mv (\S+) (\S+)\)", lines[0])
        os.rename(m.group(1), m.group(2))
    # a newer checkpoint whose trainer_state.pt was lost after it was written is passed over, and said so
    lost = ckpts / "global_step_9"
    shutil.copytree(ckpts / "global_step_1", lost)
    (lost / "trainer_state.pt").unlink()
    r = dapo(*args, "--resume")
    assert r.returncode == 0, r.stderr[-3000:]
    assert (
        "warning: --resume passes over global_step_9 (no trainer_state.pt: damaged after it was written) and "
        "resumes from global_step_1" in r.stdout + r.stderr
    )


def test_an_engine_process_aborts_its_request_and_serves_the_next(model_dir):
    """Review async-lora m3: `abort` (from another thread, without the lock) stops the engine process's `generate`
    in flight with `GenerationAborted` within seconds; the engine then serves the next request; an abort withdrawn
    before a request (`clear_abort`) aborts nothing."""
    from dapo_rl.rollout.base import GenerationAborted, SamplingParams

    engine = RemoteEngine(
        EngineSpec(RolloutConfig(name="hf", micro_batch_size=8), str(model_dir), 64, num_threads=1)
    )
    try:
        prompts = [[(i * 3 + j) % 60 + 3 for j in range(6)] for i in range(256)]
        timer = threading.Timer(1.0, engine.abort)
        timer.start()
        t0 = time.monotonic()
        with pytest.raises(GenerationAborted):
            engine.generate(prompts, SamplingParams(n=4, max_tokens=48, seed=1))
        took = time.monotonic() - t0
        print(f"aborted {took:.2f} s after the request (abort at 1 s)")
        assert took < 4.0
        out = engine.generate(prompts[:2], SamplingParams(n=2, max_tokens=4, seed=1))
        assert [len(g) for g in out] == [2, 2]
        engine.abort()
        engine.clear_abort()
        assert [len(g) for g in engine.generate(prompts[:1], SamplingParams(n=1, max_tokens=4, seed=1))] == [
            1
        ]
    finally:
        engine.close()


def test_a_pause_that_aborts_undoes_the_rounds_draw(model_dir):
    """Review async-lora m3: a checkpoint's pause (`paused(abort=True)`) during the producer's first round returns in
    seconds, not after the round; the round's draw is undone (the sampler, the prompt policy and the round count as
    before it), nothing is queued, `aborted` counts it; once the pause ends the producer samples again and a batch
    comes."""
    from dapo_rl.collect.producer import RolloutProducer
    from dapo_rl.collect.prompt_policy import prompt_policy
    from dapo_rl.config import load_config
    from dapo_rl.data import EpochSampler, PromptDataset, reasoning_gym_samples
    from dapo_rl.episode import Scorer, SingleTurn
    from dapo_rl.models.tiny import build_tiny_tokenizer
    from dapo_rl.reward.pool import RewardPool
    from dapo_rl.rollout.remote import RemoteEngines

    tok = build_tiny_tokenizer()
    ds = PromptDataset(
        reasoning_gym_samples("chain_sum", 64, 0, {"min_terms": 2}, True), tok, 64, "chain_sum"
    )
    cfg = load_config(
        None,
        [
            "data.train_batch_size=4",
            "data.gen_batch_size=64",
            "rollout.n=4",
            "data.max_response_length=48",
            "actor.ppo_mini_batch_size=4",
            "algorithm.filter_groups.enable=false",  # a random model's groups are all wrong
        ],
    )
    spec = EngineSpec(RolloutConfig(name="hf", micro_batch_size=8), str(model_dir), 112, num_threads=1)
    engine = RemoteEngines([spec])
    sampler, policy = EpochSampler(len(ds), seed=0), prompt_policy(cfg.algorithm.filter_groups)
    start = (sampler.state_dict(), policy.state_dict())
    with RewardPool(cfg.reward.name, num_workers=0) as pool:
        producer = RolloutProducer(
            engine,
            SingleTurn(Scorer(tok, pool), owns_pool=False),
            sampler,
            ds,
            lambda: cfg,
            policy,
            max_staleness=1,
            log=lambda m: None,
        )
        try:
            producer.start()
            deadline = time.monotonic() + 60
            while not producer._generating and time.monotonic() < deadline:
                time.sleep(0.01)
            assert producer._generating
            t0 = time.monotonic()
            with producer.paused(abort=True):
                took = time.monotonic() - t0
                assert (
                    producer.rounds_total == 0 and len(producer.queue) == 0 and producer._report.aborted == 1
                )
                assert (sampler.state_dict(), policy.state_dict()) == start
            print(f"a pause that aborts returned {took:.2f} s into the first round")
            assert took < 3.0
            batch, stats = producer.next_batch(4, policy_version=0)
            assert len(batch) == 4 and stats["async/aborted_rounds"] == 1
        finally:
            producer.stop(5.0)
            engine.close()
